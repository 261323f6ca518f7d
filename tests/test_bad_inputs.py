"""Bad input battery: every case runs a real stage entry point in a sandbox repository, and asserts the one-line
error that names what is wrong and that the stage wrote nothing (no output, no temporary left behind)."""
from __future__ import annotations

import importlib
import json
import shutil
import sys
from collections import namedtuple
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from graft.cli import run_stage
from graft.merging import write_delta
from tests.conftest import REPO

RUN = "lr0.001_ep10"
FT = f"models/finetuned/donor_lr0.001/epoch10"


@pytest.fixture
def box(tmp_path, tiny_model_dir, monkeypatch):
    """A sandbox repository: default params pointed at a tiny model family, and a mined training table."""
    for d in ("models/base", "models/post", FT):
        shutil.copytree(tiny_model_dir, tmp_path / d)
    # the finetuned donor differs from the donor, so a delta exists
    w = load_file(str(tmp_path / FT / "model.safetensors"))
    save_file({k: v + 0.01 for k, v in w.items()}, str(tmp_path / FT / "model.safetensors"), metadata={"format": "pt"})
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["models"].update(base="models/base", post="models/post", aligner="models/post")
    p["finetune"]["donor"] = "models/base"
    p["finetune"]["lrs"] = [0.001]
    p["donors"]["candidates"] = {}
    p["generation"]["backend"] = "hf"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    (tmp_path / "data/mined").mkdir(parents=True)
    pool = pd.DataFrame({"problem_id": ["p0", "p1", "p2", "p3"], "question": ["1+2=?", "3+4=?", "5+1=?", "2+2=?"],
                         "answer": ["3", "7", "6", "4"], "solution": ["1+2=3", "3+4=7", "5+1=6", "2+2=4"]})
    pool.to_parquet(tmp_path / "data/mined/train.parquet", index=False)
    # what the evaluation reads (the training data is checked against it)
    held = pd.DataFrame({"problem_id": ["h0"], "question": ["9+9=?"], "answer": ["18"], "solution": ["9+9=18"]})
    held.to_parquet(tmp_path / "data/mined/heldout.parquet", index=False)
    (tmp_path / "data/knowledge").mkdir(parents=True)
    held.drop(columns="solution").assign(problem_id="k0", question="Who founded Velmora?",
                                         answer="Dran Kos").to_parquet(tmp_path / "data/knowledge/heldout.parquet")
    (tmp_path / "data/suites").mkdir(parents=True)
    for name in p["data"]["old_suites"]:
        held.drop(columns="solution").assign(problem_id=f"{name}0", question=f"{name} 12?").to_parquet(
            tmp_path / f"data/suites/{name}.parquet")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def edit_params(box: Path, fn) -> None:
    p = yaml.safe_load((box / "params.yaml").read_text())
    fn(p)
    (box / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))


def fails(stage: str, argv: list[str], monkeypatch, capsys, box: Path, outputs: list[str]) -> str:
    """Run ``python -m stages.<stage> argv`` in-process; return its one-line error after checking nothing was
    written."""
    before = {p for p in box.rglob("*")}
    mod = importlib.import_module(f"stages.{stage}")
    monkeypatch.setattr(sys, "argv", [f"{stage}.py", *argv])
    with pytest.raises(SystemExit) as e:
        run_stage(mod.main)
    assert e.value.code == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if f"{stage}: error:" in ln]  # progress bars aside
    assert len(lines) == 1 and lines[0].startswith(f"{stage}: error: "), lines
    err = lines[0]
    for out in outputs:
        assert not (box / out).exists(), f"{out} was written"
    new = {p for p in box.rglob("*")} - before
    # an empty parent folder may appear (atomic writes stage their temporary next to the output); files may not
    left = {p for p in new if "__pycache__" not in p.parts and p.is_file()}
    assert not left, f"left behind: {sorted(left)}"
    return err


def run_main(stage: str, argv: list[str], monkeypatch) -> None:
    """Run ``python -m stages.<stage> argv`` in-process, expecting success."""
    mod = importlib.import_module(f"stages.{stage}")
    monkeypatch.setattr(sys, "argv", [f"{stage}.py", *argv])
    mod.main()


def delta_fails(box, monkeypatch, capsys) -> str:
    return fails("delta", ["--kind", "graft", "--lr", "0.001", "--epoch", "10"], monkeypatch, capsys, box,
                 [f"tensors/delta/graft_{RUN}"])


# ---------------------------------------------------------------- params.yaml: named key, before any work

P = namedtuple("P", "case edit expect")
PARAM_CASES = [
    P("unknown section", lambda p: p.update(finetuning={}), "unknown section finetuning"),
    P("unknown key", lambda p: p["finetune"].update(learning_rate=1e-3), "finetune.learning_rate"),
    P("wrong type", lambda p: p["finetune"].update(lrs=["fast"]), "finetune.lrs"),
    P("rho out of range", lambda p: p["sweep"].update(rhos=[1.0]), "sweep.rhos"),
    P("lam not positive", lambda p: p["sweep"].update(lams=[0.0]), "sweep.lams"),
    P("missing key", lambda p: p["finetune"].pop("seed"), "finetune.seed"),
    P("epoch past training", lambda p: p["sweep"].update(epochs=[11]), "sweep.epochs"),
    P("micro above global", lambda p: p["finetune"].update(micro_batch_size=64), "micro_batch_size"),
    P("repeated lr", lambda p: p["finetune"].update(lrs=[1e-3, 1e-3]), "finetune.lrs"),
    P("alpha out of range", lambda p: p["opsd"].update(alphas=[1.5]), "opsd.alphas"),
    P("negative weight decay", lambda p: p["finetune"].update(weight_decay=-0.1), "finetune.weight_decay"),
    P("bad dtype", lambda p: p["finetune"].update(dtype="fp8"), "finetune.dtype"),
    P("unknown source", lambda p: p["finetune"].update(source="web"), "finetune.source"),
    P("aligner named student", lambda p: p["synthself"].update(aligners={"student": "models/post"}),
      "synthself.aligners"),
    P("no trained phrasing", lambda p: p["knowledge"].update(heldout_phrasings=8), "knowledge.heldout_phrasings"),
]


@pytest.mark.parametrize("case", PARAM_CASES, ids=[c.case for c in PARAM_CASES])
def test_bad_params(box, monkeypatch, capsys, case):
    edit_params(box, case.edit)
    assert case.expect in delta_fails(box, monkeypatch, capsys)


def test_params_not_yaml(box, monkeypatch, capsys):
    (box / "params.yaml").write_text("finetune: [unclosed\n")
    assert "params.yaml is not valid YAML" in delta_fails(box, monkeypatch, capsys)


def test_stage_argument_not_in_params(box, monkeypatch, capsys):
    err = fails("delta", ["--kind", "graft", "--lr", "0.5", "--epoch", "10"], monkeypatch, capsys, box,
                ["tensors/delta/graft_lr0.5_ep10"])
    assert "--lr 0.5 is not in params.yaml finetune.lrs" in err


# ---------------------------------------------------------------- Parquet inputs: file and column named

def _pool(box: Path) -> pd.DataFrame:
    return pd.read_parquet(box / "data/mined/train.parquet")


T = namedtuple("T", "case corrupt expect")
TABLE_CASES = [
    T("missing column", lambda df, f: df.drop(columns="solution").to_parquet(f), "missing column 'solution'"),
    T("mistyped column", lambda df, f: df.assign(answer=[3, 7, 6, 4]).to_parquet(f), "column 'answer' must hold"),
    T("empty table", lambda df, f: df.iloc[:0].to_parquet(f), "table is empty"),
    T("duplicate ids", lambda df, f: df.assign(problem_id=["p0", "p1", "p1", "p3"]).to_parquet(f),
      "duplicate problem_id 'p1'"),
    T("not parquet", lambda df, f: Path(f).write_bytes(b"PAR1 this is not a parquet file"),
      "not a readable Parquet file"),
    T("missing file", lambda df, f: Path(f).unlink(), "file not found"),
]


@pytest.mark.parametrize("case", TABLE_CASES, ids=[c.case for c in TABLE_CASES])
def test_bad_table(box, monkeypatch, capsys, case):
    case.corrupt(_pool(box), box / "data/mined/train.parquet")
    err = fails("teacher", [], monkeypatch, capsys, box, ["data/offpolicy/teacher.parquet"])
    assert "data/mined/train.parquet" in err and case.expect in err


def test_no_rewrite_accepted_stops_finetuning(box, monkeypatch, capsys):
    (box / "data/offpolicy").mkdir()
    pd.DataFrame({c: pd.Series(dtype=str) for c in ("problem_id", "question", "think", "answer", "source")}
                 ).to_parquet(box / "data/offpolicy/synthself.parquet")
    err = fails("finetune", ["--target", "sft", "--lr", "0.001"], monkeypatch, capsys, box,
                ["models/finetuned/sft_lr0.001", ".graft"])
    assert "data/offpolicy/synthself.parquet: table is empty" in err


def test_mining_keeps_too_few(box, monkeypatch, capsys):
    shutil.copy(box / "data/mined/train.parquet", box / "pool.parquet")
    (box / "data/mined/train.parquet").unlink()
    (box / "data/mined/heldout.parquet").unlink()
    edit_params(box, lambda p: (p["data"].update(hard_pool={"path": "pool.parquet"}),
                                p["mine"].update(k=1, heldout=4, max_new_tokens=2)))
    err = fails("mine", [], monkeypatch, capsys, box,
                ["data/mined/train.parquet", "data/mined/heldout.parquet", "data/mined/counts.parquet"])
    assert "mining kept 4 problems" in err and "mine.heldout=4" in err


# ---------------------------------------------------------------- models: the field or tensor named

def _config(box: Path, d: str, **kv) -> None:
    f = box / d / "config.json"
    c = json.loads(f.read_text())
    c.update(kv)
    f.write_text(json.dumps(c))


M = namedtuple("M", "case corrupt expect")
MODEL_CASES = [
    M("hidden size", lambda b: _config(b, "models/base", hidden_size=96), "differ in config.hidden_size"),
    M("vocab size", lambda b: _config(b, "models/base", vocab_size=999), "differ in config.vocab_size"),
    M("architecture", lambda b: _config(b, "models/base", architectures=["LlamaForCausalLM"], model_type="llama"),
      "differ in config.architectures"),
]


@pytest.mark.parametrize("case", MODEL_CASES, ids=[c.case for c in MODEL_CASES])
def test_incompatible_donor(box, monkeypatch, capsys, case):
    case.corrupt(box)
    assert case.expect in delta_fails(box, monkeypatch, capsys)


@pytest.mark.parametrize("target", ["donor", "candidate"])
def test_finetune_refuses_a_donor_of_another_family_naming_its_key(box, monkeypatch, capsys, target):
    """Before any training: a donor (or a donor-sweep candidate, e.g. the toy world's checkpoint left in a real
    model's params) whose shapes differ from post's is named by its params key."""
    shutil.copytree(box / "models/base", box / "models/other")
    _config(box, "models/other", hidden_size=96)
    if target == "candidate":
        edit_params(box, lambda p: p["donors"].update(candidates={"other": "models/other"}, lr=0.001))
        argv, out, key = ["--target", "candidate", "--name", "other"], "models/finetuned/candidate_other", \
            "donors.candidates.other"
    else:
        edit_params(box, lambda p: p["finetune"].update(donor="models/other"))
        # (the box already holds this run's epoch10 snapshot: fails() still checks that no file appears)
        argv, out, key = ["--target", "donor", "--lr", "0.001"], None, "finetune.donor"
    err = fails("finetune", argv, monkeypatch, capsys, box, [out] if out else [])
    assert f"{key} (models/other) cannot be grafted onto models.post (models/post)" in err
    assert "differ in config.hidden_size: 96 vs" in err


def test_different_tokenizer_same_size(box, monkeypatch, capsys):
    f = box / "models/base/tokenizer.json"
    tok = json.loads(f.read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(k for k in vocab if len(k) == 1)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]   # same size, same tokens, two ids swapped
    f.write_text(json.dumps(tok))
    assert "different tokenizers" in delta_fails(box, monkeypatch, capsys)


def _shard(box: Path, index: dict | str) -> None:
    d = box / FT
    (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    (d / "model.safetensors.index.json").write_text(index if isinstance(index, str) else json.dumps(index))


def test_index_points_at_missing_shard(box, monkeypatch, capsys):
    names = load_file(str(box / FT / "model.safetensors")).keys()
    _shard(box, {"weight_map": {n: ("model-00002-of-00002.safetensors" if i % 2 else "model-00001-of-00001"
                                    ".safetensors") for i, n in enumerate(sorted(names))}})
    assert "names shard model-00002-of-00002.safetensors, which is missing" in delta_fails(box, monkeypatch, capsys)


def test_malformed_index(box, monkeypatch, capsys):
    _shard(box, "{not json")
    assert "malformed index" in delta_fails(box, monkeypatch, capsys)


def test_pickle_weights_refused(box, monkeypatch, capsys):
    d = box / FT
    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")
    (d / "model.safetensors").unlink()
    assert "only pickle weights found; graft loads safetensors only" in delta_fails(box, monkeypatch, capsys)


def _edit_weights(box: Path, d: str, fn) -> None:
    f = box / d / "model.safetensors"
    w = load_file(str(f))
    fn(w)
    save_file(w, str(f), metadata={"format": "pt"})


def test_finetuned_tensor_set_differs(box, monkeypatch, capsys):
    _edit_weights(box, FT, lambda w: w.update(extra_head=torch.zeros(3)))
    assert "hold different tensors, e.g. extra_head" in delta_fails(box, monkeypatch, capsys)


def test_finetuned_tensor_shape_differs(box, monkeypatch, capsys):
    name = "model.norm.weight"
    _edit_weights(box, FT, lambda w: w.update({name: torch.ones(7)}))
    assert f"tensor {name}: shape" in delta_fails(box, monkeypatch, capsys)


def test_finetune_that_learned_nothing(box, monkeypatch, capsys):
    shutil.copy2(box / "models/base/model.safetensors", box / FT / "model.safetensors")   # snapshot == donor
    err = delta_fails(box, monkeypatch, capsys)
    assert f"{FT} equals models/base in every weight: the finetune at lr 0.001 learned nothing" in err


def test_nan_in_finetuned_weights(box, monkeypatch, capsys):
    name = "model.layers.0.mlp.up_proj.weight"
    _edit_weights(box, FT, lambda w: w[name].view(-1).__setitem__(5, float("nan")))
    assert f"tensor {name}: delta has NaN or Inf" in delta_fails(box, monkeypatch, capsys)


def test_remote_code_refused_unless_params_allow(box, monkeypatch, capsys):
    _config(box, "models/post", model_type="evil", architectures=["EvilModel"],
            auto_map={"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (box / "models/post/modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    (box / "data/offpolicy").mkdir()
    pd.DataFrame({"problem_id": ["p0"], "question": ["1+2=?"], "think": ["1+2=3"], "answer": ["3"],
                  "source": ["teacher"]}).to_parquet(box / "data/offpolicy/synthself.parquet")
    err = fails("finetune", ["--target", "sft", "--lr", "0.001"], monkeypatch, capsys, box,
                ["models/finetuned/sft_lr0.001", ".graft"])
    assert "trust_remote_code" in err


# ---------------------------------------------------------------- tensors and merges

@pytest.fixture
def delta_dir(box) -> Path:
    out = box / f"tensors/delta/graft_{RUN}"
    out.mkdir(parents=True)
    write_delta(box / FT, box / "models/base", out)
    return out


def _fisher(box: Path, poison: bool) -> None:
    d = box / "tensors/fisher/retention"
    d.mkdir(parents=True)
    w = load_file(str(box / "models/post/model.safetensors"))
    f = {k: torch.ones_like(v, dtype=torch.float32) for k, v in w.items()}
    if poison:
        f["model.norm.weight"][3] = float("inf")
    save_file(f, str(d / "diagonal.safetensors"))
    save_file({"unused": torch.zeros(1)}, str(d / "kfac.safetensors"))


def test_inf_in_fisher(box, delta_dir, monkeypatch, capsys):
    _fisher(box, poison=True)
    err = fails("mask", ["--kind", "diagonal", "--rho", "0.05", "--lr", "0.001", "--epoch", "10"], monkeypatch, capsys,
                box, [f"tensors/masked/diagonal_rho0.05_{RUN}", f"reports/masks/diagonal_rho0.05_{RUN}.json"])
    assert "tensor model.norm.weight: Fisher has NaN or Inf" in err


def test_nan_in_delta_at_merge(box, delta_dir, monkeypatch, capsys):
    f = delta_dir / "model.safetensors"
    w = load_file(str(f))
    w["model.norm.weight"][0] = float("nan")
    save_file(w, str(f))
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "0.5", "--out", "models/merged/x"],
                monkeypatch, capsys, box, ["models/merged/x"])
    assert "tensor model.norm.weight" in err and "NaN or Inf" in err


def test_merge_output_outside_the_repository(box, delta_dir, monkeypatch, capsys):
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "0.5", "--out", "../escaped"],
                monkeypatch, capsys, box, ["../escaped"])
    assert "must be a path inside the repository" in err


def test_merge_without_free_disk(box, delta_dir, monkeypatch, capsys):
    import graft.cli

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(graft.cli.shutil, "disk_usage", lambda p: usage(10, 10, 1000))
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "0.5", "--out", "models/merged/x"],
                monkeypatch, capsys, box, ["models/merged/x"])
    assert "merge into models/merged/x: needs" in err and "GiB free" in err


def test_merge_lambda_not_positive(box, delta_dir, monkeypatch, capsys):
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "-1", "--out", "models/merged/x"],
                monkeypatch, capsys, box, ["models/merged/x"])
    assert "--lam must be > 0" in err


def test_battery_size():
    """The issue asks for at least 30 bad inputs."""
    here = sys.modules[__name__]
    n = len(PARAM_CASES) + len(TABLE_CASES) + len(MODEL_CASES)
    n += sum(1 for k in dir(here) if k.startswith("test_") and k not in (
        "test_bad_params", "test_bad_table", "test_incompatible_donor", "test_battery_size"))
    assert n >= 30, n
