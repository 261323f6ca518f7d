"""Parquet inputs with a documented schema, validated on read (missing column, wrong type, empty, duplicate ids)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from graft.canonical import is_blank

if TYPE_CHECKING:   # pandas loads when a table is read, not when params are (every stage imports this module)
    import pandas as pd

# name -> (column -> pandas kind: "O" text, "i" integer, "f" float, "b" bool)
SCHEMAS: dict[str, dict[str, str]] = {
    # a suite of problems with a verifiable final answer (old-task suites, retention prompts)
    "problems": {"problem_id": "O", "question": "O", "answer": "O"},
    # the hard pool: problems with a gold worked solution (teacher trace)
    "hard_pool": {"problem_id": "O", "question": "O", "answer": "O", "solution": "O"},
    # off-policy SFT data, whatever its source: the think block and the final answer of the assistant turn
    "offpolicy": {"problem_id": "O", "question": "O", "think": "O", "answer": "O", "source": "O"},
    # knowledge-injection facts, one row per phrasing (a fact's rows in the order they are held out: last ones last)
    "facts": {"fact_id": "O", "question": "O", "answer": "O"},
    # plain text an old suite scores by likelihood (grader ``perplexity``), one passage per row
    "texts": {"text_id": "O", "text": "O"},
}

# text that must say something: a blank gold answer is matched by an empty reply, a blank question asks nothing
# (a think or solution block may be empty)
NON_BLANK = ("problem_id", "question", "answer", "fact_id", "text_id", "text")
# tables with one row per id (a trace table may hold several traces of one problem): schema -> its id column
ID_UNIQUE = {"problems": "problem_id", "hard_pool": "problem_id", "texts": "text_id"}
# where an id is derived from when a data set has none: id column -> the column it is a hash of
DERIVED_FROM = {"problem_id": "question", "text_id": "text"}

# a chat conversation (list of {role, content}) that a user's traces may give instead of question/think/answer
MESSAGES = "messages"
# text columns a schema may carry beside its own, kept (and mappable) when the data set has them: a fact's passage,
# which OPSD's teacher reads (opsd.teacher_context passage)
OPTIONAL: dict[str, tuple[str, ...]] = {"facts": ("passage",)}


def mappable_columns(schema: str) -> tuple[str, ...]:
    """Our column names that an input's ``columns`` may map (traces: also ``messages``; their ``source`` is the
    input's name)."""
    if schema == "offpolicy":
        return ("problem_id", "question", "think", "answer", MESSAGES)
    return tuple(SCHEMAS[schema]) + OPTIONAL.get(schema, ())


class TableError(ValueError):
    """A Parquet input is missing, malformed or violates its schema."""


def read_table(path: str | Path, schema: str) -> pd.DataFrame:
    path = Path(path)
    if not path.exists():
        raise TableError(f"{path}: file not found")
    if not path.is_file():
        raise TableError(f"{path}: is a directory, not a Parquet file (schema {schema})")
    return validate_table(read_parquet(path), path, schema)


def read_parquet(path: str | Path) -> pd.DataFrame:
    import pandas as pd

    try:
        return pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise TableError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None


def validate_table(df: pd.DataFrame, path: str | Path, schema: str) -> pd.DataFrame:
    """``df`` checked against ``schema``; every error names ``path``."""
    for col, kind in SCHEMAS[schema].items():
        if col not in df.columns:
            raise TableError(f"{path}: missing column {col!r} (schema {schema}: {', '.join(SCHEMAS[schema])})")
        if kind == "O":
            if not df[col].map(lambda v: isinstance(v, str)).all():
                raise TableError(f"{path}: column {col!r} must hold strings")
            if col in NON_BLANK:
                blank = df[col].map(is_blank).astype(bool)
                if blank.any():
                    raise TableError(f"{path}: row {int(blank.to_numpy().argmax())}: column {col!r} is blank "
                                     f"({int(blank.sum())} row(s)); every row needs one")
        elif df[col].dtype.kind != kind:
            raise TableError(f"{path}: column {col!r} has dtype {df[col].dtype}, expected kind {kind!r}")
    if len(df) == 0:
        raise TableError(f"{path}: table is empty")
    if schema in ID_UNIQUE:
        col = ID_UNIQUE[schema]
        dup = df[col].duplicated()
        if dup.any():
            raise TableError(f"{path}: duplicate {col} {df.loc[dup, col].iloc[0]!r}")
    return df.reset_index(drop=True)
