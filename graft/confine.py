"""A stage never writes over its inputs: an output path is not an input, not inside one, and does not contain one.

(Paths that become path components are checked apart, as plain names, in ``graft.schema``; outputs named on the
command line must lie inside the repository, ``graft.cli.output_path``.)
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping


def check_apart(outputs: Mapping[str, str | Path], inputs: Mapping[str, str | Path]) -> None:
    """``outputs`` and ``inputs``: what each path is (for the message) -> path. Raises ValueError naming both."""
    for out_what, out in outputs.items():
        o = Path(out).resolve()
        for in_what, inp in inputs.items():
            i = Path(inp).resolve()
            if o == i or o in i.parents or i in o.parents:
                raise ValueError(f"{in_what} ({inp}) overlaps {out_what} ({out}), which this stage writes: the "
                                 "input would be overwritten; point one of them elsewhere")
