import pytest
import torch

from graft.generation import HFGenerator as _HFGenerator, SamplingSpec
from graft.merging import merge_into_dir, write_delta
from graft.modeling import new_model, qwen3_config, save_model_dir
from graft.points import POINT_LOADER

QUESTIONS = ("12+7=?", "reverse 1234", "300-7=?")
PROMPTS: list[list[int]] = []   # filled by the autouse fixture below (the family tokenizer's template)


@pytest.fixture(autouse=True)
def _prompts(tiny_fmt):
    PROMPTS[:] = [tiny_fmt.prompt_ids(q) for q in QUESTIONS]


def HFGenerator(model_dir, *args, **kw):
    """The HF backend with the family's stop and pad ids (what open_generator passes)."""
    from tests.conftest import family_format
    from graft.modeling import load_tokenizer

    fmt = family_format(load_tokenizer(model_dir))
    return _HFGenerator(model_dir, fmt.stop_ids, fmt.pad_id, *args, **kw)
SAMPLED = SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3)


def gen_stops(model_dir):
    from graft.modeling import load_tokenizer
    from tests.conftest import family_format

    return family_format(load_tokenizer(model_dir)).stop_ids


def test_hf_backend_refuses_a_prompt_past_max_model_len(tiny_model_dir):
    gen = HFGenerator(tiny_model_dir, max_model_len=len(PROMPTS[0]) + 5)
    with pytest.raises(ValueError, match="prompt 0: the prompt's .* exceed generation.max_model_len"):
        gen.generate(PROMPTS[:1], SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=6, seed=0))


def ids(out):
    return [[c.token_ids for c in r] for r in out]


@pytest.fixture(scope="module")
def point_dirs(tmp_path_factory, tiny_model_dir, tiny_tokenizer):
    """A delta between two random tiny models, and post + 0.7 * delta written out as a model directory."""
    from tests.conftest import TINY_SHAPE

    root = tmp_path_factory.mktemp("point")
    other = new_model(qwen3_config(tiny_tokenizer, TINY_SHAPE, 128), seed=1)
    with torch.no_grad():
        other.lm_head.weight.mul_(20.0)
    save_model_dir(other, tiny_tokenizer, root / "other")
    write_delta(root / "other", tiny_model_dir, root / "delta")
    (root / "merged").mkdir()
    merge_into_dir(tiny_model_dir, root / "delta", 0.7, root / "merged")
    return root / "delta", root / "merged"


def test_hf_point_loaded_in_place_equals_the_merged_directory(tiny_model_dir, point_dirs):
    delta, merged = point_dirs
    gen = HFGenerator(tiny_model_dir, batch_size=8, worker_extension=POINT_LOADER)
    before = gen.generate(PROMPTS, SAMPLED)
    gen.load_point(tiny_model_dir, delta, 0.7)
    shared = gen.generate(PROMPTS, SAMPLED)
    fresh = HFGenerator(merged, batch_size=8)
    assert all(torch.equal(a, b) for a, b in zip(gen.model.state_dict().values(), fresh.model.state_dict().values()))
    assert ids(shared) == ids(fresh.generate(PROMPTS, SAMPLED)) and ids(shared) != ids(before)
    gen.load_point(tiny_model_dir)  # back to the engine's own weights: the first samples again
    assert ids(gen.generate(PROMPTS, SAMPLED)) == ids(before)


def test_load_point_needs_the_point_extension(tiny_model_dir):
    with pytest.raises(RuntimeError, match="worker_extension"):
        HFGenerator(tiny_model_dir).load_point(tiny_model_dir)


def test_hf_seeded_rerun_reproduces_samples(tiny_model_dir):
    gen = HFGenerator(tiny_model_dir, batch_size=4)
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=5)
    a, b = gen.generate(PROMPTS, spec), gen.generate(PROMPTS, spec)
    assert a == b
    assert len(a) == 3 and all(len(x) == 3 for x in a)
    other = gen.generate(PROMPTS, SamplingSpec(n=3, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=6))
    assert other != a


def test_hf_samples_do_not_depend_on_batching(tiny_model_dir):
    spec = SamplingSpec(n=2, temperature=1.0, top_p=0.9, max_new_tokens=10, seed=1)
    big = HFGenerator(tiny_model_dir, batch_size=64).generate(PROMPTS, spec)
    small = HFGenerator(tiny_model_dir, batch_size=1).generate(PROMPTS, spec)
    assert [[c.token_ids for c in r] for r in big] == [[c.token_ids for c in r] for r in small]


def test_hf_greedy_matches_transformers_generate(tiny_model_dir):
    import torch

    gen = HFGenerator(tiny_model_dir)
    out = gen.generate(PROMPTS[:1], SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=10, seed=0))
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        ref = gen.model.generate(ids, do_sample=False, max_new_tokens=10, eos_token_id=list(gen.stop_ids),
                                 pad_token_id=gen.pad_id)[0, ids.shape[1]:].tolist()
    assert list(out[0][0].token_ids) == ref


@pytest.mark.vllm
def test_vllm_and_hf_agree_on_greedy(tiny_model_dir):
    pytest.importorskip("vllm")
    from graft.generation import VLLMGenerator

    spec = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=12, seed=0)
    hf = HFGenerator(tiny_model_dir).generate(PROMPTS, spec)
    v = VLLMGenerator(tiny_model_dir, gen_stops(tiny_model_dir), max_model_len=128)
    got = v.generate(PROMPTS, spec)
    try:
        assert ids(got) == ids(hf)
        # per-request seeds: a rerun gives the same samples
        assert v.generate(PROMPTS, SAMPLED) == v.generate(PROMPTS, SAMPLED)
    finally:
        v.close()


@pytest.mark.vllm
def test_vllm_shared_engine_equals_a_fresh_engine_per_point(tiny_model_dir, point_dirs):
    """The sweep's shared engine: a point written into the running engine samples exactly what an engine started
    on that point's merged directory samples; loading the post weights back restores the post model's samples."""
    pytest.importorskip("vllm")
    from graft.generation import VLLMGenerator

    delta, merged = point_dirs
    v = VLLMGenerator(tiny_model_dir, gen_stops(tiny_model_dir), max_model_len=128, worker_extension=POINT_LOADER)
    try:
        before = v.generate(PROMPTS, SAMPLED)
        v.load_point(tiny_model_dir, delta, 0.7)
        shared = v.generate(PROMPTS, SAMPLED)
        v.load_point(tiny_model_dir)
        back = v.generate(PROMPTS, SAMPLED)
    finally:
        v.close()
    fresh = VLLMGenerator(merged, gen_stops(merged), max_model_len=128)
    try:
        alone = fresh.generate(PROMPTS, SAMPLED)
    finally:
        fresh.close()
    assert ids(shared) == ids(alone) and ids(shared) != ids(before)
    assert ids(back) == ids(before)


# vLLM's two engine layouts, asked for the same samples; the multiprocess one runs in a child process (vLLM fixes its
# environment once an engine is up in a process, so one process cannot open both)
LAYOUT_SCRIPT = """
import json, sys
from graft.generation import SamplingSpec, VLLMGenerator
from tests.conftest import family_format
from graft.modeling import load_tokenizer
model, prompts = sys.argv[1], json.loads(sys.argv[2])
v = VLLMGenerator(model, family_format(load_tokenizer(model)).stop_ids, max_model_len=128)
out = v.generate(prompts, SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_new_tokens=12, seed=3))
print("RESULT", json.dumps({"in_process": v.in_process, "ids": [[list(c.token_ids) for c in r] for r in out]}))
v.close()
"""


@pytest.mark.vllm
def test_vllm_in_process_engine_samples_what_the_multiprocess_engine_samples(tiny_model_dir):
    """On a CPU the engine runs inside the stage's process (graft.generation.engine_in_process: a speed setting);
    vLLM's multiprocess layout, which VLLM_ENABLE_V1_MULTIPROCESSING=1 restores, gives the same samples."""
    pytest.importorskip("vllm")
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    def run(var: str) -> dict:
        env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": var, "PYTHONPATH": str(REPO)}
        r = subprocess.run([sys.executable, "-c", LAYOUT_SCRIPT, str(tiny_model_dir), json.dumps(PROMPTS)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        return json.loads(line.removeprefix("RESULT "))

    inproc, multi = run("0"), run("1")
    assert inproc["in_process"] and not multi["in_process"]
    assert inproc["ids"] == multi["ids"] and len({tuple(c) for r in inproc["ids"] for c in r}) > 1


def test_engine_in_process_only_with_one_worker_and_unless_the_environment_says_otherwise(monkeypatch):
    pytest.importorskip("vllm")
    import os

    from graft.generation import IN_PROCESS_VAR, engine_in_process, engine_layout

    monkeypatch.delenv(IN_PROCESS_VAR, raising=False)
    assert not engine_in_process(2) and IN_PROCESS_VAR not in os.environ and engine_layout(2) == {}
    assert engine_in_process(1) and os.environ[IN_PROCESS_VAR] == "0"
    assert engine_layout(1) == {"distributed_executor_backend": "uni"}   # vLLM's one-process executor
    monkeypatch.setenv(IN_PROCESS_VAR, "1")
    assert not engine_in_process(1) and engine_layout(1) == {}


def test_vllm_engine_gets_the_tensor_parallel_size_from_params(monkeypatch, tiny_model_dir):
    """generation.vllm_tensor_parallel_size reaches vLLM's LLM (its own worker processes split the model); the
    point loader runs on every worker through collective_rpc, so each keeps its shard."""
    import types

    import vllm

    from graft.generation import open_generator
    from tests.conftest import family_format
    from graft.modeling import load_tokenizer

    seen = {}

    class FakeLLM:
        def __init__(self, **kw):
            seen.update(kw)

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    gen = types.SimpleNamespace(backend="vllm", dtype="float32", max_model_len=128, vllm_memory_fraction=0.3,
                                vllm_enforce_eager=True, vllm_tensor_parallel_size=2)
    open_generator(tiny_model_dir, gen, family_format(load_tokenizer(tiny_model_dir)), worker_extension=POINT_LOADER)
    assert seen["tensor_parallel_size"] == 2 and seen["worker_extension_cls"] == POINT_LOADER


@pytest.mark.parametrize("visible, rank, per, want", [
    (None, 0, 1, "0"), (None, 2, 1, "2"), (None, 1, 2, "2,3"),
    ("4,5,6,7", 1, 2, "6,7"), ("GPU-a, GPU-b", 1, 1, "GPU-b")])
def test_each_engine_replica_takes_its_own_devices(visible, rank, per, want):
    from graft.distributed import replica_gpus

    assert replica_gpus(rank, per, visible) == want


def test_a_replica_past_the_visible_devices_names_the_params():
    from graft.distributed import replica_gpus

    with pytest.raises(ValueError, match="data_parallel_size x vllm_tensor_parallel_size"):
        replica_gpus(1, 2, "0,1,2")


def test_a_replica_drops_torchrun_variables_so_its_engine_cannot_take_them(monkeypatch):
    """vLLM sets up process groups of its own: torchrun's RANK, WORLD_SIZE, MASTER_PORT... must not reach it."""
    import os

    from graft.distributed import TORCHRUN_VARS, become_replica

    for var, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert become_replica(1) == (1, 2)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"
    assert not [v for v in TORCHRUN_VARS if v in os.environ]


def test_engine_replicas_refuse_more_gpus_than_are_visible(monkeypatch):
    """Two vLLM replicas of tensor-parallel size 2 need four GPUs; with three visible the stage says so before any
    engine starts, naming the param."""
    import torch

    from stages.evaluate import check_replica_gpus

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    check_replica_gpus(1, 2)
    check_replica_gpus(3, 1)
    with pytest.raises(ValueError, match=r"data_parallel_size: 2 engine replicas x 2 GPU\(s\) each need 4 GPUs; 3"):
        check_replica_gpus(2, 2)
