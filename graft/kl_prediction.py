"""Predicted retention KL of post + lam * D before any evaluation: the paper's quadratic estimate (its Eq. 3)

  KL(p_post || p_post+lam D) ~ 1/2 lam^2 D^T F D

with F the post model's retention Fisher, in three forms:
  diagonal: 1/2 sum_j F_j D_j^2 over every tensor;
  kfac:     1/2 sum over block linear layers of vec(dW)^T (Q (x) P) vec(dW) = 1/2 sum_ij sigma_i d_j (u_i^T dW v_j)^2
            (the KFAC mask's own scores, from the clamped eigendecompositions), plus the diagonal form of every other
            tensor (embeddings, norms, lm_head), as the KFAC mask scores them;
  directional: 1/2 (1/N) sum_n (g_n . D)^2, the full empirical Fisher the other two approximate, exactly along D
            (``graft.fisher.directional_fisher``: one per-sample-gradient pass over the rollouts per delta).
The forms are lam-independent, so one pass over a delta serves every lam. Our Fisher is that of the per-token *mean*
log-likelihood of a rollout, so the form estimates the rollout mean of (1/T_n^2) sum_t KL_nt
(``graft.retention_kl``); divided by mean_n 1/T_n it is a per-token KL (exact when every position moves equally).
"""
from __future__ import annotations

import math
from typing import Callable

import pandas as pd
import torch

from graft.merging import MaskPlan, diagonal_score
from graft.registry import PREDICTORS
from graft.tensors import TensorReader, all_finite


def quadratic_forms(delta: TensorReader, fisher: TensorReader, kfac: TensorReader) -> dict[str, float]:
    """1/2 D^T F D under the diagonal and the KFAC Fisher, and |D|^2, streamed tensor by tensor (sums in fp64)."""
    plan = MaskPlan("kfac", delta, fisher, kfac)
    diag = kron = sq = 0.0
    for name in delta.ordered_names():
        d = delta.get(name)
        if not all_finite(d):
            raise FloatingPointError(f"tensor {name} of the delta: NaN or Inf")
        diag += float(diagonal_score(plan.fisher_tensor(name), d, name).double().sum())
        kron += float(plan.scores(name, d).double().sum())
        sq += float(d.double().pow(2).sum())
    return {"diagonal_form": diag / 2, "kfac_form": kron / 2, "sq_norm": sq}


def per_token_kl(form: float, lam: float, mean_inverse_length: float) -> float:
    """The predicted mean per-token KL of post + lam * D from its lam-free form."""
    return lam * lam * form / mean_inverse_length


def lam_for_budget(form: float, budget: float, mean_inverse_length: float, max_lam: float) -> float:
    """The largest lam (at most ``max_lam``) whose predicted per-token KL is within ``budget``; a delta the Fisher
    does not see (form 0) gets ``max_lam``."""
    if budget <= 0:
        raise ValueError(f"a KL budget must be > 0, got {budget}")
    if form <= 0:
        return max_lam
    return min(max_lam, math.sqrt(budget * mean_inverse_length / form))


def kron_quadratic(dW: torch.Tensor, Q: torch.Tensor, P: torch.Tensor) -> float:
    """vec(dW)^T (Q (x) P) vec(dW) built explicitly with torch.kron (vec stacks columns): a reference for tests."""
    v = dW.double().T.reshape(-1)
    return float(v @ torch.kron(Q.double(), P.double()) @ v)


FORMS = "reports/kl/forms.parquet"         # predict_kl: one row per delta a point adds to the post model
PROPOSED = "reports/kl/proposed.parquet"   # propose: every candidate, the chosen ones marked
FORM_COLUMNS = ["family", "delta", "lr", "epoch", "mask", "rho", "diagonal_form", "kfac_form", "directional_form",
                "sq_norm", "source_sq_norm", "mean_inverse_length"]


def significant(x: float, digits: int = 4) -> float:
    """``x`` rounded down to ``digits`` significant digits (a proposed lambda is a name a user reads and types;
    down, so a budget met before rounding is met after it, the KL growing with lam)."""
    if x <= 0:
        return 0.0
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    return float(f"{math.floor(x / scale * (1 + 1e-12)) * scale:.{digits}g}")


def lam_for_measured_budget(kl_at: Callable[[float], float], budget: float, max_lam: float, rel_tol: float = 0.05,
                            max_evals: int = 12) -> tuple[float, float, int]:
    """The largest lam in (0, max_lam] found whose measured KL ``kl_at(lam)`` is within ``budget``, by secant steps
    on log KL against log lam (KL ~ c lam^a) kept inside a bracket, with geometric bisection as the fallback; stops
    when the KL is within ``rel_tol`` below the budget. Returns (lam, its KL, evaluations). Assumes the KL grows
    with lam, as it does along a ray from the post model until far past the budgets that matter."""
    if budget <= 0:
        raise ValueError(f"a KL budget must be > 0, got {budget}")
    hi, k_hi = max_lam, kl_at(max_lam)
    evals = 1
    if k_hi <= budget:
        return max_lam, k_hi, evals
    lo, k_lo = 0.0, 0.0
    guess = hi * math.sqrt(budget / k_hi)        # quadratic from the top end
    while evals < max_evals:
        if not lo < guess < hi:
            guess = math.sqrt(lo * hi) if lo > 0 else hi / 4
        k = kl_at(guess)
        evals += 1
        if k <= budget:
            lo, k_lo = guess, k
            if k >= (1 - rel_tol) * budget:
                break
        else:
            hi, k_hi = guess, k
        if lo > 0 and k_lo > 0:                  # secant in log-log through the bracket ends
            a = math.log(k_hi / k_lo) / math.log(hi / lo)
            guess = lo * (budget * (1 - rel_tol / 2) / k_lo) ** (1 / a) if a > 0 else math.sqrt(lo * hi)
        else:
            guess = hi * math.sqrt(budget * (1 - rel_tol / 2) / k_hi)
    return lo, k_lo, evals


def propose(forms: pd.DataFrame, budget: float, predictor: str, max_lam: float,
            measure: Callable[[str, float], float] | None = None) -> pd.DataFrame:
    """For every delta row, the largest lam whose per-token KL stays within ``budget``: predicted by a Fisher form,
    or (``measured``) bisected on the KL itself, ``measure(delta, lam)``, at a few lams. Then per family and finetune
    snapshot the candidate (a rho, for masked families) that applies the most of the update: the largest
    lam <M(D), D> / |D|^2 (for an entry or KFAC mask, lam |M(D)|^2 / |D|^2). Ties: the smallest rho."""
    if predictor not in PREDICTORS:
        raise ValueError(f"propose.predictor must be one of {', '.join(PREDICTORS)}, got {predictor!r}")
    if forms.empty:
        raise ValueError("propose: no deltas to propose a lambda for")
    out = forms.copy()
    if predictor == "measured":
        if measure is None:
            raise ValueError("propose: the measured predictor needs a KL meter")
        found = [lam_for_measured_budget(lambda lam, d=d: measure(d, lam), budget, max_lam) for d in out.delta]
        lams = [significant(lam) for lam, _, _ in found]
        out["evaluations"] = [n for _, _, n in found]
        # the KL at the rounded lam is what evaluate will measure: computed again, not assumed
        out["predicted_kl"] = [measure(d, lam) if lam != l0 else k for d, lam, (l0, k, _) in zip(out.delta, lams, found)]
    else:
        lams = [significant(lam_for_budget(f, budget, m, max_lam))
                for f, m in zip(out[f"{predictor}_form"], out.mean_inverse_length)]
        out["evaluations"] = 0
        out["predicted_kl"] = [per_token_kl(f, lam, m) for f, lam, m in zip(out[f"{predictor}_form"], lams,
                                                                            out.mean_inverse_length)]
    out["lam"] = lams
    out["applied"] = [lam * s / src if src > 0 else 0.0 for lam, s, src in zip(lams, out.sq_norm, out.source_sq_norm)]
    out["chosen"] = False
    for _, idx in out.groupby(["family", "lr", "epoch"], sort=True).groups.items():
        sub = out.loc[idx].assign(_rho=out.loc[idx].rho.fillna(0.0))
        best = sub.sort_values(["applied", "_rho"], ascending=[False, True], kind="stable").index[0]
        out.loc[best, "chosen"] = True
    return out.reset_index(drop=True)
