"""KFAC retention Fisher and the KFAC projection mask (paper Appendix F).

For a linear layer h = W a (W: d_out x d_in) the Fisher block is approximated by Q (x) P with
  Q = E[a a^T]                      (mean over every non-pad token position of every rollout)
  P = E_n[ sum_t g_t g_t^T ]        (g_t = dL_n/dh_t for the per-token-normalised loss L_n of rollout n)
so that vec(dW)^T (Q (x) P) vec(dW) = tr(P dW Q dW^T) approximates the diagonal-free quadratic form E_n[<G_n, dW>^2],
on the same scale as the diagonal Fisher used for the other tensors. With P = U S U^T and Q = V D V^T, the score of
direction u_i v_j^T is s_ij = sigma_i d_j (u_i^T dW v_j)^2, and the masked update is dW' = U (M * (U^T dW V)) V^T.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tqdm import tqdm

from graft.fisher import rollout_batch


def kfac_linear_names(model: torch.nn.Module) -> list[str]:
    """Linear layers inside the transformer blocks (embeddings, lm_head, norms use the diagonal Fisher)."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            out.append(name)
    return sorted(out)


def estimate_kfac_factors(model: torch.nn.Module, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]],
                          pad_id: int, chunk: int = 8) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{linear layer name: (Q, P)} in fp32, from the model's own rollouts (prompt ids, response ids)."""
    if not rollouts:
        raise ValueError("estimate_kfac_factors: no rollouts")
    names = kfac_linear_names(model)
    mods = dict(model.named_modules())
    for n in names:
        if mods[n].bias is not None:
            raise ValueError(f"layer {n} has a bias; KFAC here covers bias-free linear layers only")
    dev = next(model.parameters()).device
    Q = {n: torch.zeros(mods[n].in_features, mods[n].in_features, device=dev) for n in names}
    P = {n: torch.zeros(mods[n].out_features, mods[n].out_features, device=dev) for n in names}
    acts: dict[str, torch.Tensor] = {}
    positions = 0
    valid: torch.Tensor | None = None

    def fwd_hook(name):
        def hook(mod, inp, out):
            a = inp[0].detach().float()
            acts[name] = a
            out.register_hook(lambda g: grads_cb(name, g))
        return hook

    def grads_cb(name: str, g: torch.Tensor) -> None:
        # g[b, t] = dL/dh_t where L = sum_b L_b (each L_b already normalised by its response length), so the
        # per-rollout sum over t of g g^T is sum_t g_t g_t^T of that rollout's own loss.
        gv = g.detach().float()[valid]
        P[name] += gv.T @ gv

    handles = [mods[n].register_forward_hook(fwd_hook(n)) for n in names]
    try:
        model.eval()
        for start in tqdm(range(0, len(rollouts), chunk), desc="kfac", mininterval=2.0):
            batch = rollouts[start: start + chunk]
            ids, w = rollout_batch(batch, pad_id)
            valid = torch.zeros(ids.shape, dtype=torch.bool)
            for i, (p, r) in enumerate(batch):
                valid[i, : len(p) + len(r)] = True
            ids, w, valid = ids.to(dev), w.to(dev), valid.to(dev)
            model.zero_grad(set_to_none=True)
            logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
            loss = -(logp * w[:, 1:]).sum()  # sum over rollouts of per-token-normalised NLL
            loss.backward()
            for n in names:
                a = acts[n][valid]
                Q[n] += a.T @ a
            positions += int(valid.sum())
            acts.clear()
    finally:
        for h in handles:
            h.remove()
        model.zero_grad(set_to_none=True)
    return {n: ((Q[n] / positions).cpu(), (P[n] / len(rollouts)).cpu()) for n in names}


def eigh_factor(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (clamped at 0: a covariance is PSD; tiny negatives are round-off) and eigenvectors, in fp64."""
    vals, vecs = torch.linalg.eigh(((m + m.T) / 2).double())
    return vals.clamp(min=0).float(), vecs.float()


def kfac_scores(dW: torch.Tensor, U: torch.Tensor, sigma: torch.Tensor, V: torch.Tensor, d: torch.Tensor
                ) -> torch.Tensor:
    """s_ij = sigma_i d_j (u_i^T dW v_j)^2 for dW of shape (d_out, d_in)."""
    rot = U.T @ dW.float() @ V
    return sigma[:, None] * d[None, :] * rot.pow(2)


def kfac_project(dW: torch.Tensor, U: torch.Tensor, V: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """Remove the selected eigen-directions: U ((1 - drop) * (U^T dW V)) V^T. Nothing dropped: dW exactly."""
    if not bool(drop.any()):
        return dW.float()
    rot = U.T @ dW.float() @ V
    return U @ rot.masked_fill(drop, 0.0) @ V.T

