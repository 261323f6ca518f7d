"""The retention-KL prediction: measured KL against a brute-force sum, predicted KL against the explicit quadratic
forms, the lambda for a budget, the proposal's choice, and the report's statistics."""
import math

import pandas as pd
import pytest
import torch

from graft.inplace import overwrite_parameters
from graft.kfac import kfac_project
from graft.fisher import directional_fisher, estimate_diag_fisher
from graft.kl_prediction import (kron_quadratic, lam_for_budget, lam_for_measured_budget, per_token_kl, propose,
                                 quadratic_forms, significant)
from graft.kl_report import prediction_table, proposal_outcomes, spearman
from graft.modeling import load_model
from graft.retention_kl import (brute_force_kl, mean_inverse_length, retention_kl, rollouts_from_table,
                                rollouts_table, token_kl)
from graft.tensors import TensorReader, save_tensors


def _rollouts(vocab: int, shapes, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (p,), generator=g).tolist(), torch.randint(0, vocab, (r,), generator=g).tolist())
            for p, r in shapes]


def _perturbed(model_dir, scale: float, seed: int):
    model = load_model(model_dir)
    g = torch.Generator().manual_seed(seed)
    overwrite_parameters(model, [(n, p.detach() + scale * torch.randn(p.shape, generator=g))
                                 for n, p in model.named_parameters()])
    return model


def test_measured_kl_equals_brute_force_and_is_zero_for_the_same_weights(tiny_model_dir, tiny_tokenizer):
    ref = load_model(tiny_model_dir)
    point = _perturbed(tiny_model_dir, 0.02, seed=1)
    rollouts = _rollouts(len(tiny_tokenizer), [(5, 3), (7, 1), (4, 6), (6, 2), (3, 5)])  # ragged: padding
    kl = retention_kl(ref, point, rollouts, tiny_tokenizer.pad_token_id, chunk=2)
    assert kl["tokens"] == 17 and kl["rollouts"] == 5
    assert kl["token"] == pytest.approx(brute_force_kl(ref, point, rollouts), rel=1e-6)   # fp32 logits
    assert kl["token"] > 0
    # the rollout mean: (1/N) sum_n (1/T_n^2) sum_t KL_nt, from per-rollout brute force
    per = [brute_force_kl(ref, point, [r]) * len(r[1]) for r in rollouts]
    assert kl["rollout"] == pytest.approx(sum(s / len(r[1]) ** 2 for s, r in zip(per, rollouts)) / 5, rel=1e-6)
    # the same weights in a second copy: exactly zero, whatever the chunking
    same = retention_kl(ref, load_model(tiny_model_dir), rollouts, tiny_tokenizer.pad_token_id, chunk=3)
    assert same["token"] == 0.0 and same["rollout"] == 0.0
    # a larger move moves the distributions further
    far = retention_kl(ref, _perturbed(tiny_model_dir, 0.1, seed=1), rollouts, tiny_tokenizer.pad_token_id)
    assert far["token"] > kl["token"]


def test_token_kl_is_the_exact_sum_over_the_vocabulary():
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(3, 11, generator=g), torch.randn(3, 11, generator=g)
    p, q = torch.softmax(a.double(), -1), torch.softmax(b.double(), -1)
    torch.testing.assert_close(token_kl(a, b), (p * (p.log() - q.log())).sum(-1))


def test_rollouts_round_trip_and_bad_tables():
    rs = [([1, 2, 3], [4, 5]), ([6], [7, 8, 9])]
    assert rollouts_from_table(rollouts_table(rs), "t") == rs
    assert mean_inverse_length(rs) == pytest.approx((1 / 2 + 1 / 3) / 2)
    with pytest.raises(ValueError, match="t: no column 'response_ids'"):
        rollouts_from_table(rollouts_table(rs).drop(columns=["response_ids"]), "t")
    with pytest.raises(ValueError, match="t: rollout 1 has an empty response"):
        rollouts_from_table(rollouts_table([([1], [2]), ([3], [])]), "t")


LIN = "model.layers.0.mlp.up_proj.weight"
NORM = "model.norm.weight"


def _psd(n: int, g) -> torch.Tensor:
    a = torch.randn(n, 2 * n, generator=g, dtype=torch.float64)
    return a @ a.T / (2 * n)


def _fisher_files(tmp_path, g):
    """A diagonal Fisher and KFAC factors (their eigendecompositions, as the fisher stage writes them) for one
    block linear layer (6 x 4) and one norm vector."""
    fisher = {LIN: torch.rand(6, 4, generator=g), NORM: torch.rand(4, generator=g)}
    P, Q = _psd(6, g), _psd(4, g)
    sig, U = torch.linalg.eigh(P)
    d, V = torch.linalg.eigh(Q)
    kfac = {f"{LIN}.P_eigvals": sig.float(), f"{LIN}.P_eigvecs": U.float(), f"{LIN}.Q_eigvals": d.float(),
            f"{LIN}.Q_eigvecs": V.float()}
    save_tensors(tmp_path / "f.safetensors", fisher)
    save_tensors(tmp_path / "k.safetensors", kfac)
    return fisher, P, Q, U.float(), V.float()


def test_predicted_forms_equal_the_explicit_quadratic_forms(tmp_path):
    g = torch.Generator().manual_seed(3)
    fisher, P, Q, U, V = _fisher_files(tmp_path, g)
    delta = {LIN: torch.randn(6, 4, generator=g), NORM: torch.randn(4, generator=g)}
    save_tensors(tmp_path / "d.safetensors", delta)
    with TensorReader(tmp_path / "d.safetensors") as dr, TensorReader(tmp_path / "f.safetensors") as fr, \
            TensorReader(tmp_path / "k.safetensors") as kr:
        forms = quadratic_forms(dr, fr, kr)
    diag = sum(float((fisher[k].double() * delta[k].double() ** 2).sum()) for k in delta)
    assert forms["diagonal_form"] == pytest.approx(diag / 2, rel=1e-6)
    # KFAC: vec(dW)^T (Q kron P) vec(dW) for the linear layer, the diagonal form for the norm
    kron = kron_quadratic(delta[LIN], Q, P) + float((fisher[NORM].double() * delta[NORM].double() ** 2).sum())
    assert forms["kfac_form"] == pytest.approx(kron / 2, rel=1e-5)
    assert forms["sq_norm"] == pytest.approx(sum(float(v.double().pow(2).sum()) for v in delta.values()), rel=1e-9)
    # a KFAC-masked delta: the form is the KFAC quadratic of what is kept
    drop = torch.zeros(6, 4, dtype=torch.bool)
    drop[5, 3] = drop[4, 3] = True   # the two largest-eigenvalue directions
    masked = {LIN: kfac_project(delta[LIN], U, V, drop), NORM: delta[NORM]}
    save_tensors(tmp_path / "m.safetensors", masked)
    with TensorReader(tmp_path / "m.safetensors") as mr, TensorReader(tmp_path / "f.safetensors") as fr, \
            TensorReader(tmp_path / "k.safetensors") as kr:
        mforms = quadratic_forms(mr, fr, kr)
    kept = kron_quadratic(masked[LIN], Q, P) + float((fisher[NORM].double() * delta[NORM].double() ** 2).sum())
    assert mforms["kfac_form"] == pytest.approx(kept / 2, rel=1e-4)
    assert mforms["kfac_form"] < forms["kfac_form"]


def test_kron_reference_is_the_trace_form():
    g = torch.Generator().manual_seed(0)
    P, Q = _psd(5, g), _psd(3, g)
    dW = torch.randn(5, 3, generator=g, dtype=torch.float64)
    assert kron_quadratic(dW, Q, P) == pytest.approx(float(torch.trace(P @ dW @ Q @ dW.T)), rel=1e-12)


def test_lambda_for_a_budget_spends_it_exactly_or_stops_at_max_lam():
    lam = lam_for_budget(0.3, 0.01, 0.05, max_lam=10.0)
    assert per_token_kl(0.3, lam, 0.05) == pytest.approx(0.01, rel=1e-12)
    assert lam_for_budget(1e-9, 0.01, 0.05, max_lam=1.0) == 1.0
    assert lam_for_budget(0.0, 0.01, 0.05, max_lam=0.5) == 0.5
    with pytest.raises(ValueError, match="budget"):
        lam_for_budget(0.3, 0.0, 0.05, 1.0)


def _forms(rows):
    cols = ["family", "delta", "lr", "epoch", "mask", "rho", "diagonal_form", "kfac_form", "sq_norm",
            "source_sq_norm", "mean_inverse_length"]
    df = pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)
    return df.assign(directional_form=3 * df.kfac_form)


def test_proposal_picks_the_rho_that_applies_most_of_the_update():
    forms = _forms([
        ("graft", "g", 1e-4, 10, "none", None, 4.0, 2.0, 10.0, 10.0, 0.1),
        # rho 0.01 removes little Fisher mass: lam stays small; rho 0.05 removes most: lam grows more than the norm
        ("graft_kfac", "k1", 1e-4, 10, "kfac", 0.01, 4.0, 1.5, 9.9, 10.0, 0.1),
        ("graft_kfac", "k5", 1e-4, 10, "kfac", 0.05, 4.0, 0.1, 9.0, 10.0, 0.1),
        ("graft_kfac", "k9", 1e-4, 10, "kfac", 0.09, 4.0, 0.1, 9.0, 10.0, 0.1),   # a tie in applied: smaller rho
        ("sft_merge", "s", 1e-4, 10, None, None, 1.0, 1.0, 5.0, 5.0, 0.1),
    ])
    out = propose(forms, budget=0.01, predictor="kfac", max_lam=1.0)
    chosen = out[out.chosen].set_index("family")
    assert list(chosen.index) == ["graft", "graft_kfac", "sft_merge"]
    assert chosen.loc["graft_kfac", "delta"] == "k5"
    for r in out.itertuples():   # every candidate spends the budget (none capped here), up to the rounding down
        assert r.lam == significant(math.sqrt(0.01 * 0.1 / r.kfac_form))
        assert 0.01 * (1 - 3e-3) <= r.predicted_kl <= 0.01 * (1 + 1e-12)
    # the diagonal form instead, and a cap
    capped = propose(forms, budget=100.0, predictor="diagonal", max_lam=0.75)
    assert (capped.lam == 0.75).all()
    with pytest.raises(ValueError, match="propose.predictor"):
        propose(forms, 0.01, "full", 1.0)
    # measured: the lam is bisected on the KL itself; here a KL that grows faster than lam^2
    kl = {"g": 0.4, "k1": 0.3, "k5": 0.05, "k9": 0.05, "s": 0.2}
    calls = []

    def measure(delta, lam):
        calls.append(delta)
        return kl[delta] * lam ** 2.6

    m = propose(forms, budget=0.01, predictor="measured", max_lam=1.0, measure=measure)
    for r in m.itertuples():
        assert r.predicted_kl == pytest.approx(kl[r.delta] * r.lam ** 2.6, rel=1e-12) and r.predicted_kl <= 0.01
        assert r.predicted_kl >= 0.95 * 0.01 * (1 - 3e-3) and r.evaluations <= 12
    assert m[m.chosen].set_index("family").loc["graft_kfac", "delta"] == "k5"
    with pytest.raises(ValueError, match="meter"):
        propose(forms, 0.01, "measured", 1.0)


def test_measured_budget_search_meets_the_budget_from_below():
    for c, a in ((0.3, 2.0), (5.0, 3.5), (0.02, 1.2), (1e3, 2.2)):
        lam, k, n = lam_for_measured_budget(lambda x: c * x ** a, 0.01, 1.0)
        assert k == pytest.approx(c * lam ** a) and 0.95 * 0.01 <= k <= 0.01 and n <= 12, (c, a, lam, k, n)
    assert lam_for_measured_budget(lambda x: 0.001 * x, 0.01, 0.8)[0] == 0.8    # within budget at max_lam
    assert significant(0.123456) == 0.1234 and significant(0.5) == 0.5 and significant(1.0) == 1.0


def test_directional_fisher_is_the_full_empirical_fisher_along_a_direction(tiny_model_dir, tiny_tokenizer):
    model = load_model(tiny_model_dir)
    rollouts = _rollouts(len(tiny_tokenizer), [(5, 3), (7, 1), (4, 6)])
    g = torch.Generator().manual_seed(4)
    D = {n: torch.randn(p.shape, generator=g) * 0.01 for n, p in model.named_parameters()}
    got = directional_fisher(model, rollouts, tiny_tokenizer.pad_token_id, D, chunk=2)
    want = 0.0   # one ordinary backward per rollout, the gradient dotted with D
    for p, r in rollouts:
        ids = torch.tensor([list(p) + list(r)])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        model.zero_grad(set_to_none=True)
        logp[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(r)].mean().backward()
        want += sum(float((q.grad.double() * D[n].double()).sum()) for n, q in model.named_parameters()) ** 2
    assert got == pytest.approx(want / 3, rel=1e-4)
    # along one coordinate it is that coordinate's diagonal Fisher
    diag = estimate_diag_fisher(model, rollouts, tiny_tokenizer.pad_token_id, chunk=2)
    name = "model.layers.0.mlp.up_proj.weight"
    one = {n: torch.zeros(q.shape) for n, q in model.named_parameters()}
    one[name][3, 5] = 1.0
    assert directional_fisher(model, rollouts, tiny_tokenizer.pad_token_id, one) == pytest.approx(
        float(diag[name][3, 5]), rel=1e-4)
    with pytest.raises(KeyError, match="no direction"):
        directional_fisher(model, rollouts, tiny_tokenizer.pad_token_id, {name: one[name]})


def test_spearman_and_report_tables():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # average ranks for the tie: x ranks 1, 2.5, 2.5, 4 -> Pearson 4.5 / sqrt(4.5 * 5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(4.5 * 5))
    assert math.isnan(spearman([1, 2], [1, 2])) and math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    forms = _forms([("graft", "g", 1e-4, 10, "none", None, 2.0, 1.0, 1.0, 1.0, 0.5),
                    ("sft_merge", "s", 1e-4, 10, None, None, 4.0, 3.0, 1.0, 1.0, 0.5)])
    pts = pd.DataFrame([
        {"name": "post", "method": "post", "delta": None, "lam": None, "rho": None, "lr": None, "epoch": None,
         "new_task": 0.0, "old_task": 0.8, "retention_kl": 0.0, "retention_kl_rollout": 0.0},
        {"name": "sft", "method": "sft", "delta": None, "lam": None, "rho": None, "lr": 1e-4, "epoch": 10,
         "new_task": 0.6, "old_task": 0.3, "retention_kl": 0.5, "retention_kl_rollout": 0.1},
        {"name": "g1", "method": "graft", "delta": "g", "lam": 0.5, "rho": None, "lr": 1e-4, "epoch": 10,
         "new_task": 0.3, "old_task": 0.7, "retention_kl": 0.2, "retention_kl_rollout": 0.04},
        {"name": "pg", "method": "proposed_graft", "delta": "g", "lam": 0.25, "rho": None, "lr": 1e-4, "epoch": 10,
         "new_task": 0.2, "old_task": 0.75, "retention_kl": 0.05, "retention_kl_rollout": 0.01},
    ])
    t = prediction_table(pts, forms).set_index("name")
    assert math.isnan(t.loc["post", "predicted_kl_kfac"])
    assert t.loc["sft", "predicted_kl_kfac"] == pytest.approx(3.0 / 0.5)      # SFT: its delta at lam 1
    assert t.loc["g1", "predicted_kl_diagonal"] == pytest.approx(0.25 * 2.0 / 0.5)
    assert t.loc["g1", "ratio_kfac"] == pytest.approx(0.2 / (0.25 * 1.0 / 0.5))
    out = proposal_outcomes(pts).set_index("name")
    # at old >= 0.75 only post qualifies among swept points (new 0.0): the proposal beats it by 0.2
    assert out.loc["pg", "best_all"] == "post" and out.loc["pg", "gap_all"] == pytest.approx(-0.2)
    assert math.isnan(out.loc["pg", "gap_family"])   # no graft point keeps that much of the old task
