"""The audit the end-to-end tests run every `dvc repro` under (tests/declared_io.py) sees what a stage does: a
probe stage that reads, writes and reads params it does not declare is reported, item by item."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from tests.conftest import REPO
from tests.declared_io import AUDIT, undeclared

PROBE = '''
import pandas as pd
from safetensors.torch import save_file, load_file
import torch
from graft.schema import load_params

mine = load_params("mine")
n = mine.k                              # declared
seed = mine["seed"]                     # not declared
open("in.txt").read()                   # a dep
pd.read_parquet("table.parquet")        # not a dep, read by pyarrow's own reader
load_file("weights.safetensors")        # not a dep, read by safetensors' own reader
import os
os.makedirs("out", exist_ok=True)
open("out/x.txt", "w").write("x")       # inside an output
pd.DataFrame({"a": [1]}).to_parquet("stray.parquet")   # outside every output
'''


def test_the_audit_reports_each_undeclared_read_write_and_param(tmp_path):
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages/__init__.py").write_text("")
    (tmp_path / "stages/probe.py").write_text(PROBE)
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (tmp_path / "in.txt").write_text("x")
    pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "table.parquet")
    import torch
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(2)}, str(tmp_path / "weights.safetensors"))
    stage = {"cmd": "python -m stages.probe", "deps": [{"path": p} for p in ("in.txt", "stages/probe.py", "stages/__init__.py")], "outs": [{"path": "out"}],
             "params": {"params.yaml": {"mine.k": 2}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {"probe": stage}}))
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"probe": {"cmd": stage["cmd"]}}}))
    log = tmp_path / "log"
    log.mkdir()
    env = dict(os.environ, FILE_AUDIT_DIR=str(log), PYTHONPATH=os.pathsep.join([str(AUDIT), str(tmp_path), str(REPO)]))
    # the logged command names the interpreter "python", as dvc.lock does
    subprocess.run([sys.executable, "-m", "stages.probe"], cwd=tmp_path, env=env, check=True)
    bad = undeclared(tmp_path, log, {"probe"})
    assert bad == {"probe": ["read table.parquet", "read weights.safetensors",
                             "reads params.yaml mine.seed (declared: mine.k)", "write stray.parquet"]}, bad
    # and a stage that ran without being seen is an error, not a pass
    assert undeclared(tmp_path, tmp_path / "log", {"probe", "other"})["other"] == ["ran, but the audit saw nothing"]
