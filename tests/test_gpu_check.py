"""The prepared GPU check (scripts/gpu_check.py) cannot rot: its dry run (the same code at tiny sizes on the CPU)
runs here and prints every row of its table, and nothing it imports at module level needs a package that a bare
GPU machine (torch, transformers, safetensors, accelerate) lacks."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

from tests.conftest import REPO
from tests.test_dvc_deps import closure

# absent on the device machine (transformers and accelerate bring pyyaml, tqdm, psutil, numpy, huggingface_hub)
ABSENT = {"pandas", "pyarrow", "ruamel", "dvc", "dvclive", "vllm", "datasets", "math_verify", "matplotlib"}


def module_level_imports(path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body:   # function-level imports run only when that function does
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_gpu_check_imports_nothing_a_bare_gpu_machine_lacks():
    modules = closure("scripts/gpu_check.py")
    assert "graft/kfac.py" in modules and "graft/finetuning.py" in modules
    needs = {m: sorted(module_level_imports(REPO / m) & ABSENT) for m in sorted(modules)}
    assert not {m: n for m, n in needs.items() if n}, needs


def test_gpu_check_dry_run_prints_every_row(tmp_path):
    out = tmp_path / "table.json"
    r = subprocess.run([sys.executable, str(REPO / "scripts/gpu_check.py"), "--dry-run", "--json", str(out),
                        "--work", str(tmp_path)], capture_output=True, text=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {row["what"]: row for row in json.loads(out.read_text())}
    for what in ("finetune: tokens/s", "plain forward + backward", "diagonal Fisher", "KFAC factors",
                 "KFAC eigendecompositions", "exact top-rho mask (diagonal, rho 0.01)", "merge post + lam * M(delta)",
                 "HF generate", "diagonal Fisher: cpu vs CPU (tiny model)", "kfac Fisher: cpu vs CPU (tiny model)"):
        assert what in rows, sorted(rows)
        assert rows[what]["value"] >= 0
    assert rows["diagonal Fisher"]["ratio"] > 0 and rows["KFAC factors"]["ratio"] > 0
    assert "| what | measured |" in r.stdout
    assert list(tmp_path.glob("gpu-check-*")) == []   # its mask/merge files are removed
