"""Table inputs as users have them: a Parquet, JSONL/JSON or CSV file, or a Hugging Face ``save_to_disk`` folder,
with the column names the data set uses, mapped onto graft's table schemas (``graft.tables``) by params.yaml.

An input is a params mapping ``{path, split, columns, answer_marker}`` (``InputSpec``):
- ``columns`` maps our column names to theirs (``{question: problem, answer: final_answer}``); a column left out is
  read under our own name. Off-policy traces may map ``messages`` instead (a chat conversation, see
  ``trace_from_messages``).
- ``answer_marker`` (e.g. GSM8K's ``####``): the gold answer is the text after the last marker in the answer column;
  a solution or think column read from the same column keeps the text before it.
- ``problem_id``, when the data set has none, is derived from the question text, so ids stay the same however the
  rows are ordered, filtered or appended to.
What comes out is validated exactly as a Parquet table with our names (``tables.validate_table``). Parquet is read
with pandas, a save_to_disk folder through ``datasets`` (in memory); CSV and JSON are read as text, every value as
written (no type guessing: ``007``, ``1.50`` and ``NA`` stay what they are).
"""
from __future__ import annotations

import hashlib
import json
import numbers
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from graft.canonical import canonical_text
from graft.chat import AnswerFormat, ChatSpec
from graft.tables import (DERIVED_FROM, MESSAGES, OPTIONAL, SCHEMAS, TableError, mappable_columns, read_parquet,
                          validate_table)

SUFFIXES = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
# what a save_to_disk folder holds: one data set (state.json) or several splits (dataset_dict.json)
DISK_MARKERS = ("state.json", "dataset_dict.json")
ROLES = ("system", "user", "assistant")
# columns a data set may hold as numbers (GSM8K-style numeric answers, integer ids); read as their text
NUMBERS_AS_TEXT = ("answer", "problem_id", "fact_id")


@dataclass(frozen=True)
class InputSpec:
    path: str
    split: str = ""
    columns: Mapping[str, str] = field(default_factory=dict)   # ours -> theirs
    answer_marker: str = ""
    drop_context: bool = False   # traces: train the final exchange of a longer conversation (else an error)
    key: str = "input"           # the params.yaml key, for messages

    @classmethod
    def from_params(cls, p, key: str) -> "InputSpec":
        return cls(p.path, p.split, dict(p.columns), p.answer_marker, bool(p.get("drop_context", False)), key)


def load_raw(spec: InputSpec) -> pd.DataFrame:
    """The input's rows with the data set's own column names."""
    path = Path(spec.path)
    if not path.exists():
        raise TableError(f"{path}: file not found ({spec.key}.path)")
    if path.is_dir():
        if not any((path / m).is_file() for m in DISK_MARKERS):
            raise TableError(f"{path}: is a directory but not a datasets save_to_disk folder (it has no "
                             f"{' or '.join(DISK_MARKERS)}); name a Parquet, JSONL or CSV file in {spec.key}.path")
        return _from_disk(path, spec)
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise TableError(f"{path}: unknown file type {path.suffix!r} ({spec.key}.path takes "
                         f"{', '.join(SUFFIXES)} files or a datasets save_to_disk folder)")
    if spec.split:
        raise TableError(f"{path}: {spec.key}.split ({spec.split!r}) applies only to a save_to_disk folder with "
                         "splits; a file is one table: leave split empty")
    return read_parquet(path) if kind == "parquet" else _from_files(path, kind)


def _one_line(e: BaseException) -> str:
    """The parser's own message: datasets wraps it in a DatasetGenerationError that names nothing."""
    chain = [e]
    while chain[-1].__cause__ is not None or chain[-1].__context__ is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    inner = next((x for x in chain if type(x).__name__ != "DatasetGenerationError"), e)
    return f"{type(inner).__name__}: {' '.join(str(inner).split())[:300]}"


def _from_files(path: Path, kind: str) -> pd.DataFrame:
    """A CSV or JSON/JSONL file's rows with every value as written: no type guessing, so ``007`` stays ``007``,
    ``1.50`` stays ``1.50`` and ``NA`` stays ``NA`` (a JSON number is kept as its text; only JSON ``null`` and a
    missing key are empty)."""
    try:
        text = path.read_text(encoding="utf-8-sig")   # a spreadsheet's byte-order mark is not part of a column name
    except UnicodeDecodeError as e:
        raise TableError(f"{path}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    records = _csv_records(text, path) if kind == "csv" else _json_records(text, path)
    columns: dict[str, None] = {}
    for rec in records:
        columns.update(dict.fromkeys(rec))
    return pd.DataFrame([[rec.get(c) for c in columns] for rec in records], columns=list(columns), dtype=object)


def _csv_records(text: str, path: Path) -> list[dict[str, str]]:
    import csv
    import io

    try:
        rows = list(csv.reader(io.StringIO(text, newline=""), strict=True))
    except csv.Error as e:
        raise TableError(f"{path}: not a readable CSV file ({e})") from None
    if not rows:
        raise TableError(f"{path}: the CSV file is empty (no header row)")
    header = rows[0]
    repeated = sorted({c for c in header if header.count(c) > 1})
    if repeated:
        raise TableError(f"{path}: the header names column {repeated[0]!r} twice")
    out = []
    for i, row in enumerate(rows[1:]):
        if not row:
            continue   # a blank line
        if len(row) != len(header):
            raise TableError(f"{path}: row {i}: {len(row)} fields, the header has {len(header)}")
        out.append(dict(zip(header, row)))
    return out


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict:
    keys = [k for k, _ in pairs]
    repeated = next((k for k in keys if keys.count(k) > 1), None)
    if repeated is not None:
        raise ValueError(f"an object has the key {repeated!r} twice")
    return dict(pairs)


def _json_records(text: str, path: Path) -> list[dict]:
    """A JSON array of objects, or JSON Lines (one object per line)."""
    def parse(s: str) -> Any:
        return json.loads(s, parse_int=str, parse_float=str, parse_constant=str, object_pairs_hook=_no_repeated_keys)

    try:
        whole = parse(text)
        records, lines = (whole if isinstance(whole, list) else [whole]), None
    except ValueError:
        records, lines = [], []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(parse(line))
                except ValueError as e:
                    raise TableError(f"{path}: not a readable JSON file (line {n}: {e})") from None
                lines.append(n)
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            where = f"line {lines[i]}" if lines is not None else f"item {i}"
            raise TableError(f"{path}: {where}: expected a JSON object (one row), got {type(rec).__name__}")
    return records


def _from_disk(path: Path, spec: InputSpec) -> pd.DataFrame:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path), keep_in_memory=True)
    except Exception as e:
        raise TableError(f"{path}: not a readable save_to_disk folder ({_one_line(e)})") from None
    if isinstance(ds, datasets.DatasetDict):
        splits = sorted(ds)
        if not spec.split and len(splits) == 1:
            return ds[splits[0]].to_pandas()
        if spec.split not in ds:
            what = f"split {spec.split!r} not found" if spec.split else "several splits: choose one"
            raise TableError(f"{path}: {what} ({spec.key}.split); the data set has {', '.join(splits)}")
        return ds[spec.split].to_pandas()
    if spec.split:
        raise TableError(f"{path}: a single data set without splits; leave {spec.key}.split empty "
                         f"(got {spec.split!r})")
    return ds.to_pandas()


def derived_id(question: str) -> str:
    """A problem id from the question text: stable under reordering, and equal for equal questions."""
    return "q" + hashlib.sha256(question.encode()).hexdigest()[:12]


def _cell_text(value: Any, where: str, row: int, col: str, allow_numbers: bool) -> str:
    """A cell as text; answers and ids may be numbers in a data set (``42``), never booleans or nulls."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and value != value):
        raise TableError(f"{where}: row {row}: column {col!r} is empty (null)")
    if allow_numbers and isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)):
        return str(value)
    raise TableError(f"{where}: row {row}: column {col!r} must hold {'text or numbers' if allow_numbers else 'text'}"
                     f", got {type(value).__name__}")


def _split_marker(text: str, marker: str, where: str, row: int, col: str) -> tuple[str, str]:
    cut = text.rfind(marker)
    if cut < 0:
        raise TableError(f"{where}: row {row}: column {col!r} has no answer marker {marker!r}")
    answer = text[cut + len(marker):].strip()
    if not answer:
        raise TableError(f"{where}: row {row}: column {col!r} has nothing after the answer marker {marker!r}")
    return text[:cut].strip(), answer


def trace_from_messages(messages: Any, where: str, row: int, spec: InputSpec, chat: ChatSpec,
                        fmt: AnswerFormat) -> tuple[str, str, str]:
    """(question, think, answer) of a chat conversation's final exchange: the last user turn and the assistant turn
    that answers it. The assistant's reasoning is its ``reasoning_content`` (or ``reasoning``) field, else its think
    block (chat.think_markers), else the text before the answer; the answer is read in answer.format. A system turn
    or earlier turns cannot be part of a single-turn training example: an error unless ``drop_context``."""
    if hasattr(messages, "tolist"):
        messages = messages.tolist()
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise TableError(f"{where}: row {row}: column {MESSAGES!r} must be a list of {{role, content}} messages")
    for i, m in enumerate(messages):
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise TableError(f"{where}: row {row}: message {i} must have a role ({', '.join(ROLES)}) and text "
                             f"content, got role {m.get('role')!r}")
    if not messages or messages[-1]["role"] != "assistant":
        last = messages[-1]["role"] if messages else "nothing"
        raise TableError(f"{where}: row {row}: the conversation ends with {last} (no assistant turn to train on)")
    if len(messages) < 2 or messages[-2]["role"] != "user":
        raise TableError(f"{where}: row {row}: the final assistant turn does not answer a user turn")
    context = messages[:-2]
    if context and not spec.drop_context:
        kinds = sorted({m["role"] for m in context})
        raise TableError(f"{where}: row {row}: the conversation has {len(context)} message(s) ({', '.join(kinds)}) "
                         "before its final exchange; graft trains single-turn examples, with the system turn of "
                         f"chat.system_prompt: set {spec.key}.drop_context: true to train the final exchange alone")
    question, reply = messages[-2]["content"], messages[-1]
    text = reply["content"]
    think = next((reply[k] for k in ("reasoning_content", "reasoning") if isinstance(reply.get(k), str)), None)
    final = text
    if think is None and chat.think_markers and chat.think_markers[1] in text:
        open_, close = chat.think_markers
        think, final = text.split(close, 1)
        think = think.replace(open_, "", 1)
    if think is None:
        think = fmt.before_answer(text)
    answer = fmt.extract(final)
    if not answer:
        raise TableError(f"{where}: row {row}: the assistant turn has no final answer in answer.format "
                         f"{fmt.format!r} (what the training target is rendered from)")
    return question, think.strip(), answer


# with an answer marker, the answer column's text before the marker is the worked solution (or reasoning)
SPLIT_BY_MARKER = {"solution", "think"}


def check_one_column_each(spec: InputSpec, read: Mapping[str, str]) -> None:
    """Each column of the data set feeds one of ours (``read``: ours -> theirs, mapped or by our own name): a
    question read as the gold answer would grade every reply against the question. The one exception is the
    answer column split by ``answer_marker`` into the solution (or think) before it and the answer after."""
    by_theirs: dict[str, list[str]] = {}
    for ours, col in read.items():
        by_theirs.setdefault(col, []).append(ours)
    for col, ours in by_theirs.items():
        if len(ours) < 2:
            continue
        if spec.answer_marker and "answer" in ours and set(ours) - {"answer"} <= SPLIT_BY_MARKER:
            continue
        how = " and ".join(f"{o} ({'mapped' if o in spec.columns else 'our own name'})" for o in ours)
        raise TableError(f"{spec.path}: column {col!r} is read as {how} ({spec.key}.columns): each column of the "
                         "data set can give one of ours (only the answer column split by answer_marker gives two)")


def map_columns(raw: pd.DataFrame, spec: InputSpec, schema: str, chat: ChatSpec | None = None,
                fmt: AnswerFormat | None = None, source: str | None = None) -> pd.DataFrame:
    """The rows in our schema's columns, before validation. ``source`` names a trace table's rows."""
    if schema == "offpolicy" and not source:
        raise ValueError("a trace table needs the source name its rows are written under")
    where = spec.path
    theirs = {ours: spec.columns.get(ours, ours) for ours in mappable_columns(schema)}
    messages = MESSAGES in spec.columns or (schema == "offpolicy" and MESSAGES in raw.columns
                                            and "question" not in raw.columns)
    # problem (text) ids come from the question (text) unless the data set has (or the mapping names) an id column
    id_col = next((c for c in DERIVED_FROM if c in SCHEMAS[schema]), None)
    derive = id_col is not None and id_col not in spec.columns and id_col not in raw.columns
    cells = [c for c in SCHEMAS[schema] if c != "source" and not (c == id_col and derive)
             and not (messages and c in ("question", "think", "answer"))]
    # an optional column is carried when the mapping names it (then it must exist) or the data set has ours
    extra = [c for c in OPTIONAL.get(schema, ()) if c in spec.columns or c in raw.columns]
    cells += extra
    check_one_column_each(spec, {c: theirs[c] for c in cells + ([MESSAGES] if messages else [])})
    for ours in cells + ([MESSAGES] if messages else []):
        if theirs[ours] not in raw.columns:
            how = (f"mapped to {ours} by {spec.key}.columns" if ours in spec.columns
                   else f"our name for {ours}; map yours in {spec.key}.columns")
            raise TableError(f"{where}: column {theirs[ours]!r} not found ({how}); the data set has "
                             f"{', '.join(map(str, raw.columns)) or 'no columns'}")
    rows: dict[str, list[str]] = {c: [] for c in list(SCHEMAS[schema]) + extra}
    for i in range(len(raw)):
        rec = raw.iloc[i]
        values = {c: _cell_text(rec[theirs[c]], where, i, theirs[c], allow_numbers=c in NUMBERS_AS_TEXT)
                  for c in cells}
        if messages:
            assert chat is not None and fmt is not None, "traces from messages need the chat and answer settings"
            q, t, a = trace_from_messages(rec[theirs[MESSAGES]], where, i, spec, chat, fmt)
            values.update(question=q, think=t, answer=a)
        elif spec.answer_marker:
            col = theirs["answer"]
            before, values["answer"] = _split_marker(values["answer"], spec.answer_marker, where, i, col)
            for c in ("solution", "think"):
                if c in values and theirs[c] == col:
                    values[c] = before
        if derive:
            values[id_col] = derived_id(values[DERIVED_FROM[id_col]])
        if schema == "offpolicy":
            values["source"] = source
        for c in rows:
            rows[c].append(values[c])
    out = pd.DataFrame(rows, columns=list(SCHEMAS[schema]) + extra)
    if derive and schema != "offpolicy":
        canon = out[DERIVED_FROM[id_col]].map(canonical_text)   # equal to a reader, equal here
        dup = canon.duplicated()
        if dup.any():
            second = int(dup.to_numpy().argmax())
            first, what = [int((canon == canon.iloc[second]).to_numpy().argmax()), second], DERIVED_FROM[id_col]
            raise TableError(f"{where}: rows {first[0]} and {first[1]} have the same {what} ({id_col.replace('_', ' ')}s are "
                             f"derived from the {what} when the data set has none); remove the duplicates or "
                             f"map an id column in {spec.key}.columns")
    return out


def read_input(spec: InputSpec, schema: str, chat: ChatSpec | None = None, fmt: AnswerFormat | None = None,
               source: str | None = None) -> pd.DataFrame:
    """A table input of params.yaml, mapped onto ``schema`` and validated."""
    raw = load_raw(spec)
    if not spec.columns and not spec.answer_marker and schema != "offpolicy":
        try:
            return validate_table(raw, spec.path, schema)   # our own table, as it is (extra columns kept)
        except TableError:
            pass   # numbers for text, a missing id, ...: the mapping below converts it or names the row
    return validate_table(map_columns(raw, spec, schema, chat, fmt, source), spec.path, schema)


def describe(spec: InputSpec) -> str:
    """One line for a stage's log: where the rows came from and how they were mapped."""
    extra = {k: v for k, v in (("split", spec.split), ("columns", dict(spec.columns)),
                               ("answer_marker", spec.answer_marker)) if v}
    return spec.path + (f" {json.dumps(extra)}" if extra else "")
