"""KFAC retention Fisher and the KFAC projection mask (paper Appendix F).

For a linear layer h = W a (W: d_out x d_in) the Fisher block is approximated by Q (x) P with
  Q = E[a a^T]                      (mean over every non-pad token position of every rollout)
  P = E_n[ sum_t g_t g_t^T ]        (g_t = dL_n/dh_t for the per-token-normalised loss L_n of rollout n)
so that vec(dW)^T (Q (x) P) vec(dW) = tr(P dW Q dW^T) approximates the diagonal-free quadratic form E_n[<G_n, dW>^2],
on the same scale as the diagonal Fisher used for the other tensors. With P = U S U^T and Q = V D V^T, the score of
direction u_i v_j^T is s_ij = sigma_i d_j (u_i^T dW v_j)^2, and the masked update is dW' = U (M * (U^T dW V)) V^T.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch
from tqdm import tqdm

from graft.fisher import Reduce, reduced_count, rollout_batch
from graft.tensors import write_safetensors_streamed

# per layer, in file (name) order. Only the eigendecompositions are stored: every reader (mask, KL prediction, donor
# choice) works in the eigenbasis, and the factors themselves would double the file (U diag(sigma) U^T rebuilds P)
KFAC_PARTS = ("P_eigvals", "P_eigvecs", "Q_eigvals", "Q_eigvecs")


def kfac_part_shapes(weight: str, n_out: int, n_in: int) -> dict[str, list[int]]:
    """{file name: shape} of one linear weight's KFAC parts (P is n_out x n_out, Q is n_in x n_in)."""
    shapes = {}
    for part in KFAC_PARTS:
        n = n_out if part.startswith("P") else n_in
        shapes[f"{weight}.{part}"] = [n] if part.endswith("eigvals") else [n, n]
    return shapes


def kfac_linear_names(model: torch.nn.Module) -> list[str]:
    """Linear layers inside the transformer blocks (embeddings, lm_head, norms use the diagonal Fisher)."""
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            out.append(name)
    return sorted(out)


def estimate_kfac_factors(model: torch.nn.Module, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]],
                          pad_id: int, chunk: int = 8, reduce: Reduce | None = None,
                          layers: Sequence[str] | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{linear layer name: (Q, P)} in fp32, from the model's own rollouts (prompt ids, response ids), for ``layers``
    (default: every ``kfac_linear_names`` layer; a subset bounds the memory to those layers' factors). With
    ``reduce``, ``rollouts`` is this process's share and the means are over all shares."""
    dev = next(model.parameters()).device
    if not reduced_count(len(rollouts), reduce, dev):
        raise ValueError("estimate_kfac_factors: no rollouts")
    names = list(layers) if layers is not None else kfac_linear_names(model)
    mods = dict(model.named_modules())
    for n in names:
        if mods[n].bias is not None:
            raise ValueError(f"layer {n} has a bias; KFAC here covers bias-free linear layers only")
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
    # Only gradients with respect to activations are needed: with the weights frozen and the embedding output as
    # the graph's leaf, the backward skips every weight gradient (about a third of its work and a model's worth of
    # memory); the activation gradients are computed exactly as before.
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    handles.append(model.get_input_embeddings().register_forward_hook(lambda mod, inp, out: out.requires_grad_()))
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
        for p in trainable:
            p.requires_grad_(True)
        model.zero_grad(set_to_none=True)
    count = len(rollouts)
    if reduce is not None:
        for n in names:
            reduce(Q[n])
            reduce(P[n])
        positions, count = reduced_count(positions, reduce, dev), reduced_count(count, reduce, dev)
    return {n: ((Q[n] / positions).cpu(), (P[n] / count).cpu()) for n in names}


def eigh_factor(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenvalues (clamped at 0: a covariance is PSD; tiny negatives are round-off) and eigenvectors, in fp64."""
    vals, vecs = torch.linalg.eigh(((m + m.T) / 2).double())
    return vals.clamp(min=0).float(), vecs.float()


def kfac_rotation(dW: torch.Tensor, U: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
    """U^T dW V: dW in the eigenbasis, entry (i, j) its coordinate along u_i v_j^T."""
    return U.T @ dW.float() @ V


def kfac_scores_rotated(rot: torch.Tensor, sigma: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """s_ij = sigma_i d_j rot_ij^2 from ``kfac_rotation``'s result."""
    return torch.mul(rot, rot).mul_(sigma[:, None] * d[None, :])   # (sigma_i d_j) rot_ij^2, bitwise, one temporary fewer


def kfac_scores(dW: torch.Tensor, U: torch.Tensor, sigma: torch.Tensor, V: torch.Tensor, d: torch.Tensor
                ) -> torch.Tensor:
    """s_ij = sigma_i d_j (u_i^T dW v_j)^2 for dW of shape (d_out, d_in)."""
    return kfac_scores_rotated(kfac_rotation(dW, U, V), sigma, d)


def kfac_project_rotated(dW: torch.Tensor, rot: torch.Tensor, U: torch.Tensor, V: torch.Tensor, drop: torch.Tensor
                         ) -> torch.Tensor:
    """``kfac_project`` given ``rot`` = kfac_rotation(dW, U, V), kept from scoring: bitwise the same result with two
    matrix products instead of four."""
    if not bool(drop.any()):
        return dW.float()
    return U @ rot.masked_fill(drop, 0.0) @ V.T


def kfac_project(dW: torch.Tensor, U: torch.Tensor, V: torch.Tensor, drop: torch.Tensor) -> torch.Tensor:
    """Remove the selected eigen-directions: U ((1 - drop) * (U^T dW V)) V^T. Nothing dropped: dW exactly."""
    if not bool(drop.any()):   # checked before rotating: the rotation is then not needed
        return dW.float()
    return kfac_project_rotated(dW, kfac_rotation(dW, U, V), U, V, drop)


def write_kfac(model: torch.nn.Module, layers: Sequence[str], rollouts: Sequence[tuple[Sequence[int], Sequence[int]]],
               pad_id: int, chunk: int, reduce: Reduce | None, per_pass: int, path: str | Path | None) -> None:
    """Every layer's KFAC factors P, Q as their eigendecompositions (``eigh_factor``), ``per_pass`` layers per pass
    over the rollouts (0: all in one pass), streamed into one safetensors file at ``path`` in name order: the same
    bytes as writing them all at once, with only one group's factors in memory. Under several processes every
    process runs the passes (each all-reduces); only the one given a ``path`` writes."""
    per_pass = per_pass or len(layers)
    mods = dict(model.named_modules())
    shapes = {}
    for layer in layers:
        n_out, n_in = mods[layer].out_features, mods[layer].in_features
        shapes.update(kfac_part_shapes(f"{layer}.weight", n_out, n_in))
    order = sorted(shapes)
    layer_of = {f"{layer}.weight.{part}": layer for layer in layers for part in KFAC_PARTS}
    # passes follow the file order, so each group is estimated once and dropped before the next
    sequence = list(dict.fromkeys(layer_of[n] for n in order))
    groups = [sequence[i: i + per_pass] for i in range(0, len(sequence), per_pass)]
    group_of = {layer: g for g, members in enumerate(groups) for layer in members}
    current: dict = {"group": None, "tensors": {}}

    def produce(name: str):
        g = group_of[layer_of[name]]
        if current["group"] != g:
            if current["group"] is not None and g < current["group"]:
                raise RuntimeError(f"kfac: {name} asked for after its group was dropped")
            current["tensors"].clear()
            for layer, (Q, P) in estimate_kfac_factors(model, rollouts, pad_id, chunk, reduce, groups[g]).items():
                w = f"{layer}.weight"
                current["tensors"][f"{w}.P_eigvals"], current["tensors"][f"{w}.P_eigvecs"] = eigh_factor(P)
                current["tensors"][f"{w}.Q_eigvals"], current["tensors"][f"{w}.Q_eigvecs"] = eigh_factor(Q)
            current["group"] = g
        return current["tensors"].pop(name)

    if path is None:
        for name in order:
            produce(name)
        return
    write_safetensors_streamed(path, [(n, torch.float32, shapes[n]) for n in order], produce)
