import json

import pytest
import torch

from graft.merging import (MaskPlan, compute_delta, diagonal_scores, exact_top_rho_keep, merge_into_dir,
                           merge_tensor, top_rho_count, write_delta, write_masked_delta)
from graft.modeling import load_model, new_model, qwen3_config, save_model_dir
from graft.tensors import CheckpointError, TensorReader, save_tensors
from tests.conftest import TINY_SHAPE


def test_exact_count_with_ties():
    scores = {"b": torch.tensor([1.0, 3.0, 3.0, 3.0]), "a": torch.tensor([[3.0, 0.5], [2.0, 3.0]])}
    keep = exact_top_rho_keep(scores, 0.375)  # floor(0.375 * 8) = 3 of the six 3.0s... five 3.0s tie
    assert sum(int((~k).sum()) for k in keep.values()) == 3
    # ties go to the earliest positions in sorted-name, row-major order: a[0,0], a[1,1], b[1]
    assert (~keep["a"]).tolist() == [[True, False], [False, True]]
    assert (~keep["b"]).tolist() == [False, True, False, False]


def test_top_rho_masks_the_highest_scores():
    g = torch.Generator().manual_seed(0)
    scores = {"w": torch.rand(1000, generator=g), "v": torch.rand(10, 10, generator=g)}
    keep = exact_top_rho_keep(scores, 0.1)
    masked = torch.cat([scores[n][~keep[n]] for n in sorted(scores)])
    kept = torch.cat([scores[n][keep[n]] for n in sorted(scores)])
    assert masked.numel() == top_rho_count(1100, 0.1) == 110
    assert masked.min() >= kept.max()


def test_rho_zero_keeps_everything():
    keep = exact_top_rho_keep({"w": torch.rand(7)}, 0.0)
    assert keep["w"].all()


def test_scores_are_fisher_times_delta_squared():
    s = diagonal_scores({"w": torch.tensor([2.0, 0.5])}, {"w": torch.tensor([3.0, -2.0])})
    assert s["w"].tolist() == [18.0, 2.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_merge_lam_zero_is_post_bitwise(dtype):
    post = torch.randn(5, 7).to(dtype)
    out = merge_tensor(post, torch.randn(5, 7), None, 0.0)
    assert out.dtype == dtype and torch.equal(out, post)


def test_merge_is_fp32_math_cast_once():
    post = torch.randn(64).to(torch.bfloat16)
    d = torch.randn(64) * 1e-3
    expected = (post.float() + 0.7 * d).to(torch.bfloat16)
    assert torch.equal(merge_tensor(post, d, torch.ones(64, dtype=torch.bool), 0.7), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_merge_bits_are_those_of_post_plus_lam_delta_in_fp32(dtype):
    """The merge adds in place for speed; every output bit must be that of (post.float() + lam * d).to(dtype),
    signed zeros included."""
    g = torch.Generator().manual_seed(5)
    post = (torch.randn(300, 257, generator=g) * 0.05).to(dtype)
    post[0, :8] = torch.tensor([0.0, -0.0, 0.0, -0.0, 1.0, -1.0, 0.0, -0.0]).to(dtype)
    d = torch.randn(300, 257, generator=g) * 1e-3
    d[0, :8] = torch.tensor([0.0, 0.0, -0.0, -0.0, -1.0 / 0.75, 1.0 / 0.75, 1e-30, -1e-30])
    keep = torch.rand(300, 257, generator=g) > 0.3
    bits = {torch.float64: torch.int64, torch.float32: torch.int32}.get(dtype, torch.int16)
    for lam in (0.25, 0.75, 1.5):
        for k in (None, keep):
            dk = d if k is None else d * k.float()
            expected = (post.float() + lam * dk).to(dtype)
            got = merge_tensor(post, d, k, lam)
            assert got.dtype == dtype and torch.equal(got.view(bits), expected.view(bits)), (dtype, lam)


def _save(model, tok, path):
    path.mkdir(parents=True)
    save_model_dir(model, tok, path)
    return path


def test_delta_and_merge_directories(tmp_path, tiny_tokenizer):
    cfg = qwen3_config(tiny_tokenizer, TINY_SHAPE, 64)
    base = _save(new_model(cfg, 1), tiny_tokenizer, tmp_path / "base")
    ft_model = new_model(cfg, 2)
    ft = _save(ft_model, tiny_tokenizer, tmp_path / "ft")
    delta = compute_delta(ft, base)
    b, f = dict(TensorReader(base).items()), dict(TensorReader(ft).items())
    assert set(delta) == set(b)
    for name in delta:
        assert torch.equal(delta[name], f[name].float() - b[name].float())
    write_delta(ft, base, tmp_path / "delta")  # streamed: bitwise equal to the in-memory delta
    streamed = dict(TensorReader(tmp_path / "delta").items())
    assert all(torch.equal(streamed[k], delta[k]) and streamed[k].dtype == torch.float32 for k in delta)
    # rho = 0 masking keeps the delta bitwise, so its merge equals plain task arithmetic
    with TensorReader(tmp_path / "delta") as dr:
        fisher = {k: torch.ones_like(v) for k, v in delta.items()}
        save_tensors(tmp_path / "f.safetensors", fisher)
        with TensorReader(tmp_path / "f.safetensors") as fr:
            write_masked_delta(MaskPlan("diagonal", dr, fr), 0.0, tmp_path / "masked")
    (tmp_path / "m1").mkdir()
    (tmp_path / "m2").mkdir()
    merge_into_dir(base, tmp_path / "masked", 0.6, tmp_path / "m1")
    merge_into_dir(base, tmp_path / "delta", 0.6, tmp_path / "m2")
    m1, m2 = dict(TensorReader(tmp_path / "m1").items()), dict(TensorReader(tmp_path / "m2").items())
    for name in b:
        assert torch.equal(m1[name], m2[name])
        assert torch.equal(m2[name], b[name] + 0.6 * delta[name])
    model = load_model(tmp_path / "m1")  # a merged directory loads in transformers as it is
    assert model.config.vocab_size == len(tiny_tokenizer)


def test_merge_preserves_shards(tmp_path, tiny_tokenizer):
    cfg = qwen3_config(tiny_tokenizer, TINY_SHAPE, 64)
    model = new_model(cfg, 3)
    post = tmp_path / "post"
    post.mkdir()
    model.save_pretrained(post, safe_serialization=True, max_shard_size="100KB")
    tiny_tokenizer.save_pretrained(post)
    index = json.loads((post / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    delta = {k: torch.full(v.shape, 0.5) for k, v in TensorReader(post).items()}
    save_tensors(tmp_path / "d.safetensors", delta)
    out = tmp_path / "out"
    out.mkdir()
    merge_into_dir(post, tmp_path / "d.safetensors", 2.0, out)
    assert sorted(p.name for p in out.glob("*.safetensors")) == sorted(p.name for p in post.glob("*.safetensors"))
    merged = dict(TensorReader(out).items())
    for name, w in TensorReader(post).items():
        assert torch.equal(merged[name], w + 1.0)
    load_model(out)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_in_row_blocks_writes_the_bytes_of_whole_tensors(tmp_path, tiny_tokenizer, monkeypatch, dtype):
    import graft.merging

    post = _save(new_model(qwen3_config(tiny_tokenizer, TINY_SHAPE, 64), 1).to(dtype), tiny_tokenizer,
                 tmp_path / "post")
    g = torch.Generator().manual_seed(0)
    delta = {k: torch.randn(v.shape, generator=g) * 1e-2 for k, v in TensorReader(post).items()}
    save_tensors(tmp_path / "d.safetensors", delta)
    outs = {}
    for block in (1 << 22, 7, 1):   # one block per tensor; uneven blocks of rows; one row at a time
        monkeypatch.setattr(graft.merging, "MERGE_BLOCK", block)
        out = outs[block] = tmp_path / f"out{block}"
        out.mkdir()
        merge_into_dir(post, tmp_path / "d.safetensors", 0.7, out)
    whole = {k: merge_tensor(w, delta[k], None, 0.7) for k, w in TensorReader(post).items()}
    assert all(torch.equal(v, whole[k]) for k, v in TensorReader(outs[1 << 22]).items())
    for block in (7, 1):
        assert (outs[block] / "model.safetensors").read_bytes() == (outs[1 << 22] / "model.safetensors").read_bytes()


def test_mismatched_checkpoints_are_refused(tmp_path, tiny_tokenizer):
    a = _save(new_model(qwen3_config(tiny_tokenizer, TINY_SHAPE, 64), 0), tiny_tokenizer, tmp_path / "a")
    wider = dict(TINY_SHAPE, intermediate_size=96)
    b = _save(new_model(qwen3_config(tiny_tokenizer, wider, 64), 0), tiny_tokenizer, tmp_path / "b")
    with pytest.raises(CheckpointError, match="intermediate_size"):
        compute_delta(a, b)


def test_nan_delta_is_refused(tmp_path, tiny_tokenizer):
    cfg = qwen3_config(tiny_tokenizer, TINY_SHAPE, 64)
    a = _save(new_model(cfg, 0), tiny_tokenizer, tmp_path / "a")
    bad = new_model(cfg, 0)
    with torch.no_grad():
        bad.model.norm.weight[0] = float("nan")
    b = _save(bad, tiny_tokenizer, tmp_path / "b")
    with pytest.raises(FloatingPointError, match="model.norm.weight"):
        compute_delta(b, a)


def test_pickle_weights_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(CheckpointError, match="safetensors only"):
        TensorReader(tmp_path)


def test_sharded_bf16_tied_padded_checkpoint_merges_loads_and_generates(tmp_path, tiny_tokenizer):
    """A real-model layout: bf16 weights, tied embeddings, vocab padded past the tokenizer, several shards."""
    from graft.generation import HFGenerator, SamplingSpec

    cfg = qwen3_config(tiny_tokenizer, TINY_SHAPE, 64)
    cfg.tie_word_embeddings = True
    cfg.vocab_size = len(tiny_tokenizer) + 13  # padded vocab, as real checkpoints often have
    dirs = {}
    for name, seed in (("post", 0), ("donor", 1), ("donor_ft", 2)):
        m = new_model(cfg, seed).to(torch.bfloat16)
        d = tmp_path / name
        m.save_pretrained(d, safe_serialization=True, max_shard_size="60KB")
        tiny_tokenizer.save_pretrained(d)
        dirs[name] = d
    post = TensorReader(dirs["post"])
    assert "lm_head.weight" not in post.names() and len(post.shards()) > 1
    delta = compute_delta(dirs["donor_ft"], dirs["donor"])
    write_delta(dirs["donor_ft"], dirs["donor"], tmp_path / "delta")
    streamed = TensorReader(tmp_path / "delta")
    assert streamed.shards().keys() == TensorReader(dirs["donor_ft"]).shards().keys()  # sharded like the input
    assert all(torch.equal(streamed.get(n), delta[n]) for n in delta)
    out = tmp_path / "merged"
    out.mkdir()
    merge_into_dir(dirs["post"], tmp_path / "delta", 0.5, out)
    merged = TensorReader(out)
    assert merged.shards().keys() == post.shards().keys()
    for name in post.names():
        w = merged.get(name)
        assert w.dtype == torch.bfloat16
        assert torch.equal(w, (post.get(name).float() + 0.5 * delta[name]).to(torch.bfloat16))
    model = load_model(out, dtype="bfloat16")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied
    from tests.conftest import family_format

    fmt = family_format(tiny_tokenizer)
    gen = HFGenerator(out, fmt.stop_ids, fmt.pad_id, dtype="float32")
    got = gen.generate([fmt.prompt_ids("1+2=?")], SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=5,
                                                               seed=0))
    assert len(got[0][0].token_ids) == 5 or got[0][0].token_ids[-1] in gen.stop_ids


def test_mismatched_tensor_names_are_named(tmp_path, tiny_tokenizer):
    cfg = qwen3_config(tiny_tokenizer, TINY_SHAPE, 64)
    post = _save(new_model(cfg, 0), tiny_tokenizer, tmp_path / "post")
    delta = {k: v.float() for k, v in TensorReader(post).items()}
    delta["model.extra.weight"] = torch.zeros(2)
    save_tensors(tmp_path / "d.safetensors", delta)
    (tmp_path / "o").mkdir()
    with pytest.raises(CheckpointError, match="model.extra.weight"):
        merge_into_dir(post, tmp_path / "d.safetensors", 1.0, tmp_path / "o")
