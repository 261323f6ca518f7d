"""Issue 3 math: exact streamed top-rho, KFAC scores and projection, masked deltas, Fisher merging."""
import pytest
import torch

from graft.kfac import eigh_factor, estimate_kfac_factors, kfac_linear_names, kfac_project, kfac_scores
from graft.merging import (MaskPlan, fisher_merge_tensor, fisher_share_top, random_scores, write_masked_delta)
from graft.modeling import load_model
from graft.selection import select_top_k, top_rho_count
from graft.tensors import TensorReader, save_tensors


def _reference_top_k(scores: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """In-memory reference: stable sort by (-score, global position)."""
    names = sorted(scores)
    flat = torch.cat([scores[n].reshape(-1) for n in names])
    order = sorted(range(flat.numel()), key=lambda i: (-float(flat[i]), i))[:k]
    sel = torch.zeros(flat.numel(), dtype=torch.bool)
    sel[order] = True
    out, off = {}, 0
    for n in names:
        out[n] = sel[off: off + scores[n].numel()].reshape(scores[n].shape)
        off += scores[n].numel()
    return out


@pytest.mark.parametrize("seed", range(4))
def test_streamed_selection_equals_in_memory_reference_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    # few distinct values: many ties, including at the threshold; zeros and tiny subnormal-free values
    scores = {"a.w": torch.randint(0, 4, (13, 7), generator=g).float() * 0.25,
              "b.w": torch.randint(0, 4, (50,), generator=g).float() * 0.25,
              "c": torch.rand(3, 3, generator=g)}
    total = sum(v.numel() for v in scores.values())
    for k in (1, 5, 37, 80, total - 1):
        got = dict(select_top_k(lambda: ((n, scores[n]) for n in sorted(scores)), k))
        ref = _reference_top_k(scores, k)
        assert sum(int(v.sum()) for v in got.values()) == k
        for n in scores:
            assert torch.equal(got[n], ref[n]), (n, k)


def test_selection_handles_negative_zero_and_rejects_nan():
    s = {"a": torch.tensor([-0.0, 0.0, 1.0])}
    got = dict(select_top_k(lambda: iter(s.items()), 2))
    assert got["a"].tolist() == [True, False, True]
    with pytest.raises(FloatingPointError, match="tensor a"):
        list(select_top_k(lambda: iter({"a": torch.tensor([1.0, float("nan")])}.items()), 1))


def test_top_rho_count_is_floor():
    assert top_rho_count(1000, 0.0015) == 1 and top_rho_count(10, 0.05) == 0
    with pytest.raises(ValueError):
        top_rho_count(10, 1.0)


def test_kfac_quadratic_form_equals_explicit_kronecker():
    g = torch.Generator().manual_seed(0)
    d_out, d_in = 5, 4
    A = torch.randn(d_in, 9, generator=g, dtype=torch.float64)
    B = torch.randn(d_out, 7, generator=g, dtype=torch.float64)
    Q, P = A @ A.T / 9, B @ B.T / 7
    dW = torch.randn(d_out, d_in, generator=g, dtype=torch.float64)
    d, V = torch.linalg.eigh(Q)
    sigma, U = torch.linalg.eigh(P)
    s = kfac_scores(dW.float(), U.float(), sigma.float(), V.float(), d.float())
    vec = dW.T.reshape(-1)  # column-major vec(dW)
    explicit = vec @ torch.kron(Q, P) @ vec
    assert float(s.double().sum()) == pytest.approx(float(explicit), rel=1e-5)
    assert float(explicit) == pytest.approx(float(torch.trace(P @ dW @ Q @ dW.T)), rel=1e-12)


def test_kfac_projection_zeroes_exactly_the_selected_directions():
    g = torch.Generator().manual_seed(1)
    U, _ = torch.linalg.qr(torch.randn(6, 6, generator=g))
    V, _ = torch.linalg.qr(torch.randn(4, 4, generator=g))
    dW = torch.randn(6, 4, generator=g)
    drop = torch.zeros(6, 4, dtype=torch.bool)
    assert torch.equal(kfac_project(dW, U, V, drop), dW)  # rho = 0: the identity, bitwise
    drop[0, 1] = drop[3, 2] = drop[5, 0] = True
    out = kfac_project(dW, U, V, drop)
    before, after = U.T @ dW @ V, U.T @ out @ V
    assert after[drop].abs().max() < 1e-5
    torch.testing.assert_close(after[~drop], before[~drop], atol=1e-5, rtol=1e-5)


def _explicit_kfac(model, rollouts, pad_id, layer):
    """Reference KFAC factors for one layer: explicit per-rollout, per-position loops."""
    mod = dict(model.named_modules())[layer]
    Q = torch.zeros(mod.in_features, mod.in_features)
    P = torch.zeros(mod.out_features, mod.out_features)
    positions = 0
    for p, r in rollouts:
        ids = torch.tensor([list(p) + list(r)])
        store = {}
        h = mod.register_forward_hook(lambda m, i, o: store.update(a=i[0], h=o))
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        h.remove()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(list(r))]
        (gh,) = torch.autograd.grad(-logp.mean(), store["h"])
        for t in range(ids.shape[1]):
            a, gt = store["a"][0, t].detach(), gh[0, t]
            Q += torch.outer(a, a)
            P += torch.outer(gt, gt)
            positions += 1
    return Q / positions, P / len(rollouts)


def test_kfac_factors_match_explicit_loops(tiny_model_dir, tiny_tokenizer):
    model = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    V = len(tiny_tokenizer)
    rollouts = [(torch.randint(0, V, (pl,), generator=g).tolist(), torch.randint(0, V, (rl,), generator=g).tolist())
                for pl, rl in [(4, 3), (6, 2), (3, 5)]]
    factors = estimate_kfac_factors(model, rollouts, tiny_tokenizer.pad_token_id, chunk=2)
    names = kfac_linear_names(model)
    assert "model.layers.0.mlp.down_proj" in names and "lm_head" not in names
    assert set(factors) == set(names)
    for layer in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj"):
        Qr, Pr = _explicit_kfac(model, rollouts, tiny_tokenizer.pad_token_id, layer)
        torch.testing.assert_close(factors[layer][0], Qr, rtol=1e-4, atol=1e-6 * float(Qr.abs().max()))
        torch.testing.assert_close(factors[layer][1], Pr, rtol=1e-4, atol=1e-6 * float(Pr.abs().max()))
    vals, vecs = eigh_factor(factors[names[0]][0])
    assert (vals >= 0).all()


def _write(tmp_path, name, tensors):
    save_tensors(tmp_path / name, tensors)
    return TensorReader(tmp_path / name)


def test_masked_delta_counts_and_kinds(tmp_path):
    g = torch.Generator().manual_seed(2)
    delta = {"model.layers.0.mlp.up_proj.weight": torch.randn(6, 4, generator=g),
             "model.norm.weight": torch.randn(4, generator=g)}
    fisher = {k: torch.rand(v.shape, generator=g) for k, v in delta.items()}
    dr, fr = _write(tmp_path, "d.safetensors", delta), _write(tmp_path, "f.safetensors", fisher)
    total = 28
    # diagonal: exactly floor(rho N) entries zeroed, the highest F * delta^2
    stats = write_masked_delta(MaskPlan("diagonal", dr, fr), 0.25, tmp_path / "diag")
    out = dict(TensorReader(tmp_path / "diag").items())
    zeroed = sum(int((out[k] == 0).sum()) for k in out)
    assert stats["masked"] == zeroed == top_rho_count(total, 0.25) == 7
    scores = {k: fisher[k] * delta[k] ** 2 for k in delta}
    ref = _reference_top_k(scores, 7)
    for k in delta:
        assert torch.equal(out[k], delta[k].masked_fill(ref[k], 0.0))
    # the removed Fisher-weighted share: for the diagonal mask it is the removed share of its own score
    removed = sum(float(scores[k][ref[k]].double().sum()) for k in delta)
    whole = sum(float(scores[k].double().sum()) for k in delta)
    assert stats["fisher_share_removed"] == pytest.approx(removed / whole, rel=1e-9)
    assert stats["fisher_share_removed"] == pytest.approx(stats["score_share_masked"], rel=1e-6)
    # a random mask of the same size, given the Fisher, reports the Fisher-weighted share it removes
    rstats = write_masked_delta(MaskPlan("random", dr, fr, seed=3), 0.25, tmp_path / "r0")
    rout = dict(TensorReader(tmp_path / "r0").items())
    r_removed = sum(float((fisher[k] * (delta[k] - rout[k]) ** 2).double().sum()) for k in delta)
    assert rstats["fisher_share_removed"] == pytest.approx(r_removed / whole, rel=1e-6)
    assert rstats["fisher_share_removed"] < stats["fisher_share_removed"]   # the top-7 by score remove the most
    for s in (stats, rstats):   # entry masks split the Fisher-weighted size exactly
        assert s["fisher_share_removed"] + s["fisher_share_kept"] == pytest.approx(1.0, rel=1e-9)
    # random control: same count, seeded
    write_masked_delta(MaskPlan("random", dr, None, seed=3), 0.25, tmp_path / "r1")
    write_masked_delta(MaskPlan("random", dr, None, seed=3), 0.25, tmp_path / "r2")
    r1, r2 = dict(TensorReader(tmp_path / "r1").items()), dict(TensorReader(tmp_path / "r2").items())
    assert all(torch.equal(r1[k], r2[k]) for k in r1)
    assert sum(int((r1[k] == 0).sum()) for k in r1) == 7
    # kfac: linear weights projected in their eigenbasis, the rest masked by the diagonal score, one global count
    U, _ = torch.linalg.qr(torch.randn(6, 6, generator=g))
    Vm, _ = torch.linalg.qr(torch.randn(4, 4, generator=g))
    sig, dd = torch.rand(6, generator=g), torch.rand(4, generator=g)
    w = "model.layers.0.mlp.up_proj.weight"
    kfac = _write(tmp_path, "kfac.safetensors", {f"{w}.P_eigvecs": U, f"{w}.P_eigvals": sig, f"{w}.Q_eigvecs": Vm,
                                                 f"{w}.Q_eigvals": dd})
    stats = write_masked_delta(MaskPlan("kfac", dr, fr, kfac), 0.25, tmp_path / "k")
    out = dict(TensorReader(tmp_path / "k").items())
    ks = {w: kfac_scores(delta[w], U, sig, Vm, dd), "model.norm.weight": scores["model.norm.weight"]}
    ref = _reference_top_k(ks, 7)
    assert stats["masked"] == 7
    torch.testing.assert_close(out[w], kfac_project(delta[w], U, Vm, ref[w]))
    k_removed = sum(float((fisher[k] * (delta[k] - out[k]) ** 2).double().sum()) for k in delta)
    assert stats["fisher_share_removed"] == pytest.approx(k_removed / whole, rel=1e-5)
    k_kept = sum(float((fisher[k] * out[k] ** 2).double().sum()) for k in delta)
    assert stats["fisher_share_kept"] == pytest.approx(k_kept / whole, rel=1e-5)
    assert torch.equal(out["model.norm.weight"], delta["model.norm.weight"].masked_fill(ref["model.norm.weight"], 0.0))


@pytest.mark.parametrize("kind", ["diagonal", "kfac", "random"])
def test_scores_spilled_to_disk_give_the_same_bytes(tmp_path, kind):
    g = torch.Generator().manual_seed(4)
    w = "model.layers.0.mlp.up_proj.weight"
    delta = {w: torch.randn(6, 4, generator=g), "model.norm.weight": torch.randn(4, generator=g),
             "model.embed_tokens.weight": torch.randn(5, 4, generator=g)}
    fisher = {k: torch.rand(v.shape, generator=g) for k, v in delta.items()}
    U, _ = torch.linalg.qr(torch.randn(6, 6, generator=g))
    Vm, _ = torch.linalg.qr(torch.randn(4, 4, generator=g))
    dr, fr = _write(tmp_path, "d.safetensors", delta), _write(tmp_path, "f.safetensors", fisher)
    kfac = _write(tmp_path, "kfac.safetensors", {f"{w}.P_eigvecs": U, f"{w}.P_eigvals": torch.rand(6, generator=g),
                                                 f"{w}.Q_eigvecs": Vm, f"{w}.Q_eigvals": torch.rand(4, generator=g)})
    stats = {}
    for where, share in (("memory", 0.25), ("disk", 0.0)):
        stats[where] = write_masked_delta(MaskPlan(kind, dr, fr, kfac, seed=1), 0.3, tmp_path / where, share)
        assert sorted(p.name for p in (tmp_path / where).iterdir()) == ["model.safetensors"]   # spill file gone
    assert stats["memory"] == stats["disk"] and stats["disk"]["masked"] == top_rho_count(48, 0.3) == 14
    assert (tmp_path / "memory/model.safetensors").read_bytes() == (tmp_path / "disk/model.safetensors").read_bytes()


def test_random_scores_are_seeded_per_tensor():
    assert torch.equal(random_scores("a", [5], 1), random_scores("a", [5], 1))
    assert not torch.equal(random_scores("a", [5], 1), random_scores("b", [5], 1))


def test_fisher_merge_closed_forms():
    post, ft = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([3.0, 0.0, 3.0])
    equal = fisher_merge_tensor(post, ft, torch.ones(3), torch.ones(3), 0.25, 1e-8)
    torch.testing.assert_close(equal, 0.75 * post + 0.25 * ft)  # equal Fishers: plain interpolation
    f_post, f_ft = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 0.0, 2.0])
    out = fisher_merge_tensor(post, ft, f_post, f_ft, 0.5, 1e-8)
    assert out[0] == pytest.approx(1.0, abs=1e-6)    # only post is sensitive there: post wins
    assert out[1] == pytest.approx(1.0, abs=1e-6)    # both floored: plain average
    assert out[2] == pytest.approx(3.0)


def test_fisher_share_top(tmp_path):
    fisher = {"w": torch.tensor([100.0] + [1.0] * 99)}
    delta = _write(tmp_path, "d.safetensors", {"w": torch.ones(100)})
    assert fisher_share_top(fisher, delta, 0.01) == pytest.approx(100 / 199)


@pytest.mark.parametrize("kind", ["diagonal", "random", "kfac"])
def test_mask_statistics_are_bitwise_those_of_fresh_temporaries(tmp_path, kind):
    """The stage reuses buffers for its fp64 statistics (graft.scratch); every number it reports must equal, to the
    bit, the same sums over freshly made tensors, including when a large tensor comes before and after small ones."""
    g = torch.Generator().manual_seed(5)
    w = "model.layers.0.mlp.up_proj.weight"
    delta = {"model.embed_tokens.weight": torch.randn(300, 40, generator=g) * 1e-3, w: torch.randn(24, 16, generator=g),
             "model.norm.weight": torch.randn(16, generator=g), "lm_head.weight": torch.randn(200, 40, generator=g)}
    fisher = {k: torch.rand(v.shape, generator=g) ** 3 for k, v in delta.items()}
    dr, fr = _write(tmp_path, "d.safetensors", delta), _write(tmp_path, "f.safetensors", fisher)
    U, _ = torch.linalg.qr(torch.randn(24, 24, generator=g))
    Vm, _ = torch.linalg.qr(torch.randn(16, 16, generator=g))
    sig, dd = torch.rand(24, generator=g), torch.rand(16, generator=g)
    kfac = _write(tmp_path, "k.safetensors", {f"{w}.P_eigvecs": U, f"{w}.P_eigvals": sig, f"{w}.Q_eigvecs": Vm,
                                              f"{w}.Q_eigvals": dd})
    plan = MaskPlan(kind, dr, fr, kfac, seed=1)
    stats = write_masked_delta(plan, 0.03, tmp_path / "out")
    out = dict(TensorReader(tmp_path / "out").items())
    names = dr.ordered_names()
    scores = {}
    for n in names:
        d = delta[n]
        if kind == "random":
            scores[n] = random_scores(n, list(d.shape), 1)
        elif kind == "kfac" and n == w:
            scores[n] = sig[:, None] * dd[None, :] * (U.T @ d @ Vm).pow(2)
        else:
            scores[n] = fisher[n].float() * d.float().pow(2)
    k = top_rho_count(sum(d.numel() for d in delta.values()), 0.03)
    drop = dict(select_top_k(lambda: ((n, scores[n]) for n in names), k))
    ref = {"score_total": 0.0, "score_masked": 0.0, "ft": 0.0, "fr": 0.0, "fk": 0.0}
    for n in names:   # the formulas as they were written before the buffers, each temporary a fresh tensor
        s64, d64, f = scores[n].double(), delta[n].double(), fisher[n]
        ref["score_total"] += float(s64.sum())
        ref["score_masked"] += float(s64[drop[n]].sum())
        if kind == "kfac" and n == w:
            f64, kept64 = f.double(), out[n].double()
            ref["ft"] += float((d64 * d64).mul_(f64).sum())
            removed = d64.sub_(kept64)
            ref["fr"] += float(removed.mul_(removed).mul_(f64).sum())
            ref["fk"] += float(kept64.mul_(kept64).mul_(f64).sum())
        else:
            fd2 = d64.mul_(d64).mul_(f)
            ref["ft"] += float(fd2.sum())
            ref["fr"] += float(fd2.masked_fill(~drop[n], 0.0).sum())
            ref["fk"] += float(fd2.masked_fill_(drop[n], 0.0).sum())
    assert stats["masked"] == k
    assert stats["score_total"] == ref["score_total"] and stats["score_masked"] == ref["score_masked"]
    assert stats["fisher_share_removed"] == ref["fr"] / ref["ft"]
    assert stats["fisher_share_kept"] == ref["fk"] / ref["ft"]


def test_score_store_takes_scores_over_and_makes_negative_zero_positive(tmp_path):
    from graft.selection import ScoreStore
    s = torch.tensor([-0.0, 2.0, 0.0])
    with ScoreStore(3, tmp_path / "spill") as store:
        store.put("a", s)
        assert store.get("a").view(torch.int32).tolist() == [0, torch.tensor(2.0).view(torch.int32).item(), 0]
        with pytest.raises(ValueError, match="tensor b"):
            store.put("b", torch.tensor([1.0, -1.0]))
