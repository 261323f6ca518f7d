"""Fisher rows: the diagonal Fisher and the KFAC factors per rollout against one plain forward + backward of the same
rollouts (same model, fp32), and the KFAC eigendecompositions against the factor accumulation over the default
number of rollouts. Also checks the vmapped diagonal Fisher against the naive per-rollout reference."""
from __future__ import annotations

import torch

from benchmarks.common import Row, timed
from benchmarks.sizes import Size, config, random_rollouts
from graft.fisher import estimate_diag_fisher, naive_diag_fisher
from graft.kfac import eigh_factor, estimate_kfac_factors, kfac_linear_names
from graft.modeling import load_model

DEFAULT_ROLLOUTS = 64   # params.yaml fisher.n_rollouts


def plain_backward(model: torch.nn.Module, rolls) -> None:
    """One ordinary forward + backward of each rollout's mean response log-likelihood: the reference cost."""
    for p, r in rolls:
        ids = torch.tensor([p + r])
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(r)]
        model.zero_grad(set_to_none=True)
        (-logp.mean()).backward()
    model.zero_grad(set_to_none=True)


def fisher_rows(size: Size, check: bool) -> tuple[list[Row], dict]:
    """The rows, and the KFAC eigendecompositions (for the KFAC mask's input) when every layer's was computed."""
    model = load_model(size.post, "float32")
    for p in model.parameters():
        p.requires_grad_(True)
    rolls = random_rollouts(config(size)["vocab_size"], size.rollouts)
    n = len(rolls)
    plain_backward(model, rolls[:1])   # warm-up: first-call allocations are not per-rollout cost
    plain, _ = timed(lambda: plain_backward(model, rolls))
    note = f"{n} rollouts x 128 tokens, fp32, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters"
    rows = []
    for chunk in sorted({1, size.chunk}):   # fisher.chunk 1: a plain backward per rollout; above 1: vmapped chunks
        diag_s, fisher = timed(lambda: estimate_diag_fisher(model, rolls, 0, chunk))
        how = "fisher.chunk 1 (one plain backward per rollout)" if chunk == 1 else f"fisher.chunk {chunk} (vmapped)"
        rows.append(Row("diagonal Fisher, per rollout", size.name, "one plain forward + backward of the same rollout",
                        diag_s / n, plain / n, "<= 1.3x", note=f"{note}, {how}"))
    if check:   # the vmapped estimate equals one backward per rollout, within fp32 round-off
        naive = naive_diag_fisher(model, rolls, 0)
        worst = max(float((fisher[k] - naive[k]).abs().max() / naive[k].abs().max().clamp(min=1e-30))
                    for k in naive)
        rows.append(Row("diagonal Fisher vs the naive per-rollout reference", size.name, "1e-4 of each tensor's "
                        "largest entry", worst, 1e-4, "<= 1x", unit="max rel diff",
                        note="one ordinary backward per rollout, no padding, no vmap"))
    del fisher
    kfac_s, factors = timed(lambda: estimate_kfac_factors(model, rolls, 0, size.chunk))
    rows.append(Row("KFAC factors, per rollout", size.name, "one plain forward + backward of the same rollout",
                    kfac_s / n, plain / n, "<= 1.5x", note=f"{note}, every block linear layer at once"))
    layers = kfac_linear_names(model)
    accumulate = kfac_s / n * DEFAULT_ROLLOUTS
    eigen = None
    if size.eig_one_block:
        block = [name for name in layers if ".layers.0." in name]
        eig_s, _ = timed(lambda: [eigh_factor(m) for name in block for m in factors[name]])
        blocks = model.config.num_hidden_layers
        rows.append(Row("KFAC eigendecompositions", size.name, f"factor accumulation over {DEFAULT_ROLLOUTS} "
                        "rollouts", eig_s * blocks, accumulate, "<= 1x",
                        note=f"one block's {2 * len(block)} factors (fp64) x {blocks} blocks"))
    else:
        def decompose():
            out = {}
            for name in layers:
                Q, P = factors[name]
                out[f"{name}.weight"] = (*eigh_factor(P), *eigh_factor(Q))   # KFAC_PARTS order
            return out

        eig_s, eigen = timed(decompose)
        rows.append(Row("KFAC eigendecompositions", size.name, f"factor accumulation over {DEFAULT_ROLLOUTS} "
                        "rollouts", eig_s, accumulate, "<= 1x",
                        note=f"all {2 * len(layers)} factors (fp64); accumulation measured on {n} rollouts"))
    return rows, eigen
