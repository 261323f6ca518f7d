"""Hostile inputs, each through a real stage entry point: nothing is written outside the stage's outputs (inside or
outside the repository), no input changes (hashes before and after), and the error is one line naming the problem."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pandas as pd
from safetensors.torch import load_file, save_file

from tests.test_bad_inputs import FT, box, delta_dir, delta_fails, edit_params, fails  # noqa: F401,F811 (fixtures)


def tree_hashes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def unchanged_outside(box: Path, before_parent: set[str]) -> None:
    """Nothing appeared next to the repository (a path escape writes there)."""
    assert {p.name for p in box.parent.iterdir()} == before_parent


def test_aligner_name_with_path_separators(box, monkeypatch, capsys):
    outside = {p.name for p in box.parent.iterdir()}
    edit_params(box, lambda p: p["synthself"].update(aligners={"../../../../EVIL": "models/post"}))
    err = fails("rewrite", ["--name", "../../../../EVIL"], monkeypatch, capsys, box, ["reports/synthself"])
    assert "synthself.aligners key '../../../../EVIL' must be a plain name" in err
    unchanged_outside(box, outside)


def _index(box: Path, shard: str) -> None:
    names = load_file(str(box / FT / "model.safetensors")).keys()
    (box / FT / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: shard for n in names}}))


def test_shard_index_escaping_the_folder(box, monkeypatch, capsys):
    outside = {p.name for p in box.parent.iterdir()}
    _index(box, "../shard.safetensors")
    (box / FT / "model.safetensors").rename(box / FT.rsplit("/", 1)[0] / "shard.safetensors")
    before = tree_hashes(box / "models")
    assert "shards must be plain .safetensors file names" in delta_fails(box, monkeypatch, capsys)
    assert tree_hashes(box / "models") == before
    unchanged_outside(box, outside)


def test_shard_index_naming_the_inputs_own_file_by_absolute_path(box, monkeypatch, capsys):
    own = (box / FT / "model.safetensors").resolve()
    _index(box, str(own))
    before = tree_hashes(box / "models")
    assert "shards must be plain .safetensors file names" in delta_fails(box, monkeypatch, capsys)
    assert tree_hashes(box / "models") == before and own.stat().st_size > 0   # the user's weights are intact


def _offpolicy(box: Path, source: str, df: pd.DataFrame) -> None:
    (box / "data/offpolicy").mkdir(exist_ok=True)
    df.assign(source=source)[["problem_id", "question", "think", "answer", "source"]].to_parquet(
        box / f"data/offpolicy/{source}.parquet")


def test_finetune_that_would_learn_nothing(box, monkeypatch, capsys):
    _offpolicy(box, "synthself", pd.DataFrame({"problem_id": ["p0"], "question": ["1+2=?"], "think": ["1+2=3"],
                                               "answer": ["3"]}))
    edit_params(box, lambda p: p["finetune"].update(max_len=4))
    err = fails("finetune", ["--target", "sft", "--lr", "0.001"], monkeypatch, capsys, box,
                ["models/finetuned/sft_lr0.001", ".graft"])
    assert "no response token left after truncation" in err and "finetune.max_len" in err


def test_external_table_made_of_held_out_problems(box, monkeypatch, capsys):
    held = pd.read_parquet(box / "data/mined/heldout.parquet")
    _offpolicy(box, "external", held.assign(think=held.solution, problem_id="renamed"))   # same question, new id
    edit_params(box, lambda p: p["finetune"].update(source="external"))
    before = tree_hashes(box / "data")
    err = fails("finetune", ["--target", "donor", "--lr", "0.001"], monkeypatch, capsys, box, [".graft"])
    assert "data/offpolicy/external.parquet: 1 training rows are held-out evaluation problems" in err
    assert "mined held-out" in err and "renamed" in err
    assert tree_hashes(box / "data") == before


def test_training_on_an_old_suite_is_leakage_too(box, monkeypatch, capsys):
    suite = pd.read_parquet(box / "data/suites/add.parquet")
    _offpolicy(box, "teacher", suite.assign(think="x"))
    edit_params(box, lambda p: p["finetune"].update(source="teacher"))
    err = fails("opsd", ["--alpha", "0.5", "--lr", "0.001"], monkeypatch, capsys, box, ["models/opsd", ".graft"])
    assert "held-out evaluation problems of old suite add" in err


def test_merge_overflowing_fp16_is_refused(box, delta_dir, monkeypatch, capsys):
    f = box / "models/post/model.safetensors"
    save_file({k: v.half() for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "1e7", "--out", "models/merged/x"],
                monkeypatch, capsys, box, ["models/merged/x"])
    assert "overflow torch.float16" in err


def test_a_directory_where_a_table_is_expected(box, monkeypatch, capsys):
    edit_params(box, lambda p: p["data"].update(hard_pool="data/mined"))
    err = fails("mine", [], monkeypatch, capsys, box, ["data/mined/counts.parquet"])
    assert "data/mined: is a directory, not a Parquet file" in err


def test_truncated_safetensors_names_the_file(box, monkeypatch, capsys):
    f = box / FT / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    err = delta_fails(box, monkeypatch, capsys)
    assert f"{FT}/model.safetensors" in err and ("not a readable safetensors file" in err or "cannot be read" in err)


def test_garbage_safetensors_header_names_the_file(box, monkeypatch, capsys):
    f = box / FT / "model.safetensors"
    f.write_bytes((40).to_bytes(8, "little") + b"{this is not a header" + b"\0" * 64)
    err = delta_fails(box, monkeypatch, capsys)
    assert f"{FT}/model.safetensors: not a readable safetensors file" in err


def test_params_read_as_dvc_reads_them(box, monkeypatch, capsys):
    text = (box / "params.yaml").read_text()
    # DVC refuses a duplicated key, so does every stage
    (box / "params.yaml").write_text(text + "mask:\n  random_seed: 3\n")
    assert "duplicate key" in delta_fails(box, monkeypatch, capsys)
    # and 1e-3 is a number to DVC (YAML 1.2): accepted as finetune.lrs
    (box / "params.yaml").write_text(text.replace("- 0.001", "- 1e-3", 1))
    from graft.schema import load_all

    assert load_all(box / "params.yaml")["finetune"].lrs == [0.001]


def test_resume_key_includes_the_code():
    from graft import finetuning
    from graft.finetuning import code_fingerprint

    fp = code_fingerprint()
    assert fp["graft.finetuning"] == hashlib.sha256(Path(finetuning.__file__).read_bytes()).hexdigest()


def test_cuda_asked_for_where_there_is_none(box, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    edit_params(box, lambda p: p["compute"].update(device="cuda"))
    err = fails("mine", [], monkeypatch, capsys, box, ["data/mined/counts.parquet"])
    assert "compute.device is cuda, but torch sees no CUDA device" in err
