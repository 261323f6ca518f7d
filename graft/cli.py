"""What every stage entry point shares: one-line errors for bad input, outputs kept inside the repository, and no
process left running after it (``graft.reaper``)."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Callable

import yaml

from graft.atomic import refuse_symlinks
from graft.reaper import start_watcher

# Bad input (params, tables, checkpoints, tensors, empty results) raises one of these with a message that names the
# key, file, column or tensor. They are reported as one line; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, FloatingPointError, FileNotFoundError, OSError)

# Wall-time tables (seconds per step or per point) differ run to run, so they are not DVC outputs and live beside the
# resume work directories, outside every stage's declared outputs (a stage writes nothing else outside them).
TIMING = Path(".graft/timing")


def run_stage(main: Callable[[], None]) -> None:
    name = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "stage"
    start_watcher()   # what the stage starts (vLLM engines, torchrun ranks) dies with it, and it with its dvc
    try:
        for out in output_roots():   # before any work: a linked output folder would be written through
            refuse_symlinks(out)
        main()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        print(f"{name}: error: params.yaml is not valid YAML{where}: {getattr(e, 'problem', e)}", file=sys.stderr)
        sys.exit(2)
    except USER_ERRORS as e:
        print(f"{name}: error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, whatever the message
        sys.exit(2)


def output_roots(dvc_yaml: Path = Path("dvc.yaml")) -> list[str]:
    """The folders (and files) every stage of ``dvc_yaml`` writes, each up to its first templated part
    (``models/finetuned/donor_lr${item}`` -> ``models/finetuned``), and the work folder beside them."""
    roots = {str(TIMING.parent)}
    try:
        stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {})
    except (OSError, yaml.YAMLError):
        return sorted(roots)   # no pipeline here (a stage run outside a repository); each write still checks
    for stage in stages.values():
        body = stage.get("do", stage) if isinstance(stage, dict) else {}
        for kind in ("outs", "metrics", "plots"):
            for entry in body.get(kind, []) or []:
                path = next(iter(entry)) if isinstance(entry, dict) else entry
                if isinstance(path, str):
                    static, templated, _ = path.partition("${")
                    static = static.rpartition("/")[0] if templated else static
                    if static:
                        roots.add(static)
    return sorted(roots)


def output_path(path: str | Path, root: Path | None = None) -> Path:
    """A stage output named on the command line must be a relative path inside the repository."""
    root = (root or Path.cwd()).resolve()
    p = Path(path)
    if p.is_absolute() or not (root / p).resolve().is_relative_to(root):
        raise ValueError(f"output {path}: must be a path inside the repository ({root})")
    return p


def require_free_space(where: str | Path, needed: int, what: str) -> None:
    """Fail before writing when the disk cannot hold the output (with 5% headroom)."""
    where = Path(where)
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    if free < needed * 1.05:
        raise OSError(f"{what}: needs {needed / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free on {where}")
