"""Hostile inputs, each through a real stage entry point: nothing is written outside the stage's outputs (inside or
outside the repository), no input changes (hashes before and after), and the error is one line naming the problem."""
from __future__ import annotations

import hashlib
import math
import json
import shutil
from pathlib import Path

import pandas as pd
from safetensors.torch import load_file, save_file

from tests.test_bad_inputs import FT, box, delta_dir, delta_fails, edit_params, fails, run_main  # noqa: F401,F811 (fixtures)


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


def test_users_traces_made_of_held_out_problems(box, monkeypatch, capsys):
    """A user's own traces (a JSONL file, their column names) that are the held-out problems: the traces stage maps
    them; training on them is refused."""
    held = pd.read_parquet(box / "data/mined/heldout.parquet")
    held.assign(id="renamed").rename(columns={"question": "prompt", "solution": "reasoning"})[
        ["id", "prompt", "reasoning", "answer"]].to_json(box / "mine.jsonl", orient="records", lines=True)
    edit_params(box, lambda p: (p["data"].update(offpolicy={"mine": {"path": "mine.jsonl", "columns": {
        "problem_id": "id", "question": "prompt", "think": "reasoning"}}}), p["finetune"].update(source="mine")))
    run_main("traces", ["--name", "mine"], monkeypatch)
    before = tree_hashes(box / "data")
    err = fails("finetune", ["--target", "donor", "--lr", "0.001"], monkeypatch, capsys, box, [".graft"])
    assert "data/offpolicy/mine.parquet: 1 training rows are held-out evaluation problems" in err
    assert "mined held-out" in err and "renamed" in err
    assert tree_hashes(box / "data") == before


def test_training_on_an_old_suite_is_leakage_too(box, monkeypatch, capsys):
    suite = pd.read_parquet(box / "data/suites/add.parquet")
    _offpolicy(box, "teacher", suite.assign(think="x"))
    edit_params(box, lambda p: p["finetune"].update(source="teacher"))
    err = fails("opsd", ["--alpha", "0.5", "--lr", "0.001"], monkeypatch, capsys, box, ["models/opsd", ".graft"])
    assert "held-out evaluation problems of old suite add" in err


def test_opsd_passage_teacher_without_passages(box, monkeypatch, capsys):
    """A user's facts table without a passage column, and opsd.teacher_context passage: the stage names the missing
    passages (no silent fall-back to the answer) and writes nothing."""
    _offpolicy(box, "knowledge", pd.DataFrame({"problem_id": ["f0_p0"], "question": ["Who founded Brevik?"],
                                               "think": [""], "answer": ["Dran Kos"]}))
    (box / "data/knowledge").mkdir(exist_ok=True)
    pd.DataFrame({"problem_id": pd.Series(dtype=object), "passage": pd.Series(dtype=object)}).to_parquet(
        box / "data/knowledge/passages.parquet")
    edit_params(box, lambda p: (p["finetune"].update(source="knowledge"), p["opsd"].update(teacher_context="passage")))
    before = tree_hashes(box / "data")
    err = fails("opsd", ["--alpha", "0.5", "--lr", "0.001"], monkeypatch, capsys, box, ["models/opsd", ".graft"])
    assert "opsd.teacher_context is passage, but 1 of 1 knowledge QA pairs have no passage" in err and "'f0_p0'" in err
    assert tree_hashes(box / "data") == before


def test_merge_overflowing_fp16_is_refused(box, delta_dir, monkeypatch, capsys):
    f = box / "models/post/model.safetensors"
    save_file({k: v.half() for k, v in load_file(str(f)).items()}, str(f), metadata={"format": "pt"})
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "1e7", "--out", "models/merged/x"],
                monkeypatch, capsys, box, ["models/merged/x"])
    assert "overflow torch.float16" in err


def test_a_directory_where_a_table_is_expected(box, monkeypatch, capsys):
    edit_params(box, lambda p: p["data"].update(hard_pool={"path": "data/suites"}))   # Parquet files, not a dataset
    err = fails("mine", [], monkeypatch, capsys, box, ["data/mined/counts.parquet"])
    assert "data/suites: is a directory but not a datasets save_to_disk folder" in err


def test_an_input_table_that_is_the_stages_own_output(box, monkeypatch, capsys):
    """The hard pool named as the mined table, a trace table as the file its stage writes: refused, not
    overwritten."""
    before = tree_hashes(box / "data")
    edit_params(box, lambda p: p["data"].update(hard_pool={"path": "data/mined/train.parquet"}))
    err = fails("mine", [], monkeypatch, capsys, box, ["data/mined/counts.parquet"])
    assert "data.hard_pool.path (data/mined/train.parquet) overlaps the mined tables (data/mined)" in err
    assert tree_hashes(box / "data") == before
    edit_params(box, lambda p: p["data"].update(offpolicy={"mine": {"path": "data/offpolicy/mine.parquet"}}))
    (box / "data/offpolicy").mkdir(exist_ok=True)
    shutil.copy(box / "data/mined/train.parquet", box / "data/offpolicy/mine.parquet")
    before = tree_hashes(box / "data")
    err = fails("traces", ["--name", "mine"], monkeypatch, capsys, box, [])
    assert "data.offpolicy.mine.path (data/offpolicy/mine.parquet) overlaps its output" in err
    assert tree_hashes(box / "data") == before
    (box / "data/knowledge").mkdir(exist_ok=True)
    pd.DataFrame({"fact_id": ["f", "f"], "question": ["Capital of Ostmark?", "Ostmark's capital?"],
                  "answer": ["Brevik", "Brevik"]}).to_parquet(box / "data/knowledge/mine.parquet")
    edit_params(box, lambda p: p["knowledge"].update(facts={"path": "data/knowledge/mine.parquet"}))
    before = tree_hashes(box / "data")
    err = fails("knowledge", [], monkeypatch, capsys, box, [])
    assert "knowledge.facts.path (data/knowledge/mine.parquet) overlaps its output (data/knowledge)" in err
    assert tree_hashes(box / "data") == before


def test_an_export_over_the_post_model(box, delta_dir, monkeypatch, capsys):
    """An export name that climbs out of models/exported, or a merge aimed at the post model or the delta: refused,
    the post model intact."""
    before = tree_hashes(box / "models")
    for out in ("models/post", "models", str(delta_dir.relative_to(box))):
        err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "1", "--out", out],
                    monkeypatch, capsys, box, [])
        assert "which this stage writes: the input would be overwritten" in err and f"({out})" in err
    edit_params(box, lambda p: p["export"].update(points={"../post": {"delta": "x", "lam": 1.0}}))
    err = fails("merge", ["--delta", str(delta_dir.relative_to(box)), "--lam", "1", "--out",
                          "models/exported/../post"], monkeypatch, capsys, box, [])
    assert "export.points key '../post' must be a plain name" in err
    assert tree_hashes(box / "models") == before


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
    (box / "params.yaml").write_text(text + "mask:\n  random: {seed: 3}\n")
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


def test_the_stage_entry_point_is_part_of_the_code_keys(monkeypatch):
    """`python -m stages.finetune` loads the stage file as __main__ (its __spec__ names it): its code (data assembly,
    settings) is part of the resume key and of the evaluation's point keys under its own name, as every imported
    module is."""
    import importlib.util
    import sys
    import types

    from graft.finetuning import code_fingerprint
    from stages.evaluate import code_versions
    from tests.conftest import REPO

    spec = importlib.util.find_spec("stages.finetune")
    entry = types.ModuleType("__main__")
    entry.__file__, entry.__spec__ = spec.origin, spec
    monkeypatch.setitem(sys.modules, "__main__", entry)
    monkeypatch.delitem(sys.modules, "stages.finetune", raising=False)
    fp = code_fingerprint()
    assert fp["stages.finetune"] == hashlib.sha256((REPO / "stages/finetune.py").read_bytes()).hexdigest()
    assert "__main__" not in fp and "stages.finetune" in code_versions()


def test_cuda_asked_for_where_there_is_none(box, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    edit_params(box, lambda p: p["compute"].update(device="cuda"))
    err = fails("mine", [], monkeypatch, capsys, box, ["data/mined/counts.parquet"])
    assert "compute.device is cuda, but torch sees no CUDA device" in err


def test_garbage_json_in_a_checkpoint_names_the_file(box, monkeypatch, capsys):
    """config.json, tokenizer.json or the shard index of a model that is not JSON: one line naming that file."""
    for name in ("config.json", "tokenizer.json"):
        f = box / "models/post" / name
        good = f.read_bytes()
        f.write_text("{ not json")
        err = delta_fails(box, monkeypatch, capsys)
        assert f"models/post/{name}: not valid JSON" in err, err
        f.write_bytes(good)
    (box / "models/post/tokenizer_config.json").write_text("{ not json")
    from graft.modeling import load_tokenizer
    try:
        load_tokenizer(box / "models/post")
    except ValueError as e:
        assert "tokenizer_config.json is not valid JSON" in str(e) and str(box / "models/post") in str(e)
    else:
        raise AssertionError("a garbage tokenizer_config.json was accepted")


def test_params_that_would_silently_drop_a_metric_or_mask_nothing(box, delta_dir, monkeypatch, capsys):
    edit_params(box, lambda p: p["evaluate"].update(n_samples=2, pass_k=[1, 4]))
    err = fails("evaluate", [], monkeypatch, capsys, box, ["reports/points"])
    assert "evaluate.pass_k has 4, more than evaluate.n_samples (2)" in err
    from graft.merging import MaskPlan, write_masked_delta
    from graft.tensors import TensorReader
    with TensorReader(delta_dir) as d:
        total = sum(math.prod(d.shape(n)) for n in d.ordered_names())
        try:
            write_masked_delta(MaskPlan("random", d, None, seed=0), 0.5 / total, box / "masked")
        except ValueError as e:
            assert "masks floor(rho x" in str(e) and "would remove nothing" in str(e)
        else:
            raise AssertionError("a mask of zero directions was written")
    assert not (box / "masked").exists()
