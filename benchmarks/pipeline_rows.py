"""Pipeline rows: the default `dvc repro` end to end in a fresh clone of the committed HEAD (the committed world
reused, every other stage run), then the same clone after one lambda is added to sweep.lams."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import yaml

from benchmarks.common import Row, timed

REPO = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], cwd: Path) -> str:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout + r.stderr


def pipeline_rows(with_outputs: Callable[[Path], list[Row]] | None = None) -> list[Row]:
    """The two rows; ``with_outputs(clone)``, when given, runs on the clone's default outputs between the two repros
    (the sweep row needs them, and a fresh workspace has none) and its rows come first."""
    tmp = Path(tempfile.mkdtemp(prefix="graft-pipeline-"))
    extra: list[Row] = []
    try:
        clone = tmp / "graft"
        _run(["git", "clone", "-q", str(REPO), str(clone)], tmp)
        full_s, log = timed(lambda: _run(["dvc", "repro"], clone))
        stages = len(re.findall(r"Running stage '", log))
        if with_outputs is not None:
            extra = with_outputs(clone)
        p = yaml.safe_load((clone / "params.yaml").read_text())
        lams = p["sweep"]["lams"]
        new = round((lams[-1] + lams[-2]) / 2, 4) if len(lams) > 1 else lams[0] / 2
        p["sweep"]["lams"] = sorted(lams + [new])
        (clone / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
        one_s, log1 = timed(lambda: _run(["dvc", "repro"], clone))
        reran = sorted(set(re.findall(r"Running stage '([^']+)'", log1)))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return extra + [Row("default `dvc repro` end to end", "toy", "15 minutes", full_s, 900.0, "<= 1x",
                        note=f"fresh clone of HEAD, committed world reused, {stages} stages run, alone"),
                    Row("`dvc repro` after adding one lambda", "toy", "the full default run", one_s, full_s, "<= 0.1x",
                        note=f"lambda {new} added; reran {', '.join(reran)}")]
