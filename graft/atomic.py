"""Atomic outputs: write to a temporary sibling, then rename, so a killed stage leaves old state or new, never half.

An output never goes through a symbolic link (the path or a folder above it, inside the repository): a link would
make the stage write, replace or delete someone else's files outside the outputs DVC tracks. And an output gets
the modes of any file its user creates (0644 files, 0755 folders under umask 0022), not the private ones of the
temporary it was staged in, so a served model or a shared table is readable as it would be had it been written in
place."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

if TYPE_CHECKING:   # pandas only for the annotation: the GPU check runs where pandas is not installed
    import pandas as pd


def current_umask() -> int:
    mask = os.umask(0o022)   # reading the umask sets it: put it straight back
    os.umask(mask)
    return mask


def refuse_symlinks(path: str | Path, root: Path | None = None) -> None:
    """Refuse an output ``path`` that sits below a symbolic link inside the repository ``root`` (the working
    directory; a repository reached through a link of its own is the user's choice and not checked), or is a link to
    a folder. A link to a file is not followed but replaced (that is how DVC's symlink cache checks out a file)."""
    root = (root or Path.cwd()).absolute()
    p = Path(path)
    p = p if p.is_absolute() else root / p
    try:
        rel = p.relative_to(root)
    except ValueError:
        return   # outside the repository: a stage's outputs never are (graft.cli.output_path)
    at = root
    for i, part in enumerate(rel.parts):
        at = at / part
        if at.is_symlink() and (i < len(rel.parts) - 1 or at.is_dir()):
            raise ValueError(f"output {path}: {at.relative_to(root)} is a symbolic link (to {os.readlink(at)}); "
                             "graft writes outputs only into real folders of the repository, never through a link "
                             "(it would write or delete the files it points to). Remove the link; to keep outputs "
                             "on another disk, put the DVC cache there (dvc cache dir, cache.type symlink)")


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield an empty temporary directory that replaces ``path`` when the block succeeds."""
    path = Path(path)
    refuse_symlinks(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    os.chmod(tmp, 0o777 & ~current_umask())   # mkdtemp's 0700 is for the staging, not the output
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def atomic_file(path: str | Path) -> Iterator[Path]:
    """Yield a temporary file path in the same directory that replaces ``path`` when the block succeeds."""
    path = Path(path)
    refuse_symlinks(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    os.chmod(tmp, 0o666 & ~current_umask())   # mkstemp's 0600 is for the staging, not the output
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json(path: str | Path, obj: Any) -> None:
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_parquet(path: str | Path, df: pd.DataFrame) -> None:
    """``df`` as pandas writes it (its dtypes kept in the file's pandas metadata), less the pandas and pyarrow
    versions pandas records there: the same rows give the same bytes after a pandas upgrade, so DVC's hashes (and
    a fresh clone's dvc.lock) do not move. (pyarrow still names its own version in the Parquet footer.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    if b"pandas" in meta:
        pandas_meta = json.loads(meta[b"pandas"])
        pandas_meta.pop("pandas_version", None)
        pandas_meta.pop("creator", None)
        meta[b"pandas"] = json.dumps(pandas_meta).encode()
    with atomic_file(path) as tmp:
        pq.write_table(table.replace_schema_metadata(meta), tmp, compression="snappy")
