"""Content hashes of files and model directories: what a point's key, a chain state and a cache check compare."""
from __future__ import annotations

import hashlib
from pathlib import Path


def content_hash(path: str | Path, memo: dict[str, str] | None = None) -> str:
    """sha256 over a file, or over a directory's files (relative path + bytes, sorted)."""
    key = str(path)
    if memo is not None and key in memo:
        return memo[key]
    root = Path(path)
    files = sorted(q for q in root.rglob("*") if q.is_file()) if root.is_dir() else [root]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(root) if root.is_dir() else f.name).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 22), b""):
                h.update(block)
    out = h.hexdigest()
    if memo is not None:
        memo[key] = out
    return out
