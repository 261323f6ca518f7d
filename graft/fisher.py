"""Diagonal retention Fisher of the post model (paper Eq. 4, diagonal approximation).

F_j = (1/N) sum_n (d/d theta_j  (1/T_n) sum_t log p(y_t | z_n, y_<t))^2, where y_n is sampled from the post model
itself on old-task prompt z_n. Per-sample gradients come from ``torch.func.vmap`` over a chunk of rollouts (one
backward per chunk, not per token or per sample; a chunk of one is a plain backward); squares accumulate in fp32.

Across processes (torchrun): each process takes its share of the rollouts (``rank_share``) and passes a ``reduce``
that sums a tensor over processes in place (``torch.distributed.all_reduce``); the sums and the counts are reduced
once, at the end, so every process holds the whole estimate.
"""
from __future__ import annotations

from typing import Callable, Sequence, TypeVar

import torch
from tqdm import tqdm

Reduce = Callable[[torch.Tensor], None]   # in-place sum over processes
T = TypeVar("T")


def rank_share(items: Sequence[T], rank: int, world: int) -> list[T]:
    """This process's items: every world-th one from its rank on (shares differ in size by at most one)."""
    return list(items[rank::world])


def reduced_count(n: int, reduce: Reduce | None, device: torch.device | str = "cpu") -> int:
    """``n`` summed over processes (itself without ``reduce``)."""
    if reduce is None:
        return n
    t = torch.tensor(float(n), dtype=torch.float64, device=device)
    reduce(t)
    return int(round(t.item()))


def rollout_batch(rollouts: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and per-position weights 1/T on response tokens (so each rollout's log-lik is a mean)."""
    width = max(len(p) + len(r) for p, r in rollouts)
    ids = torch.full((len(rollouts), width), pad_id, dtype=torch.long)
    w = torch.zeros((len(rollouts), width), dtype=torch.float32)
    for i, (p, r) in enumerate(rollouts):
        if len(r) == 0:
            raise ValueError(f"rollout {i} has an empty response: nothing to score")
        ids[i, : len(p) + len(r)] = torch.tensor(list(p) + list(r))
        w[i, len(p): len(p) + len(r)] = 1.0 / len(r)  # weight on the position of each response token
    return ids, w


def _mean_loglik(model: torch.nn.Module, params: dict[str, torch.Tensor], ids: torch.Tensor, w: torch.Tensor
                 ) -> torch.Tensor:
    """Per-token-normalised log-likelihood of one right-padded rollout (causal: padding never leaks left)."""
    from torch.func import functional_call   # torch.func loads ~1 s of modules: only the Fisher needs it

    logits = functional_call(model, params, (ids[None],), {"use_cache": False}).logits[0, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[1:, None])[:, 0]
    return (logp * w[1:]).sum()


def estimate_diag_fisher(model: torch.nn.Module, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]],
                         pad_id: int, chunk: int = 8, reduce: Reduce | None = None) -> dict[str, torch.Tensor]:
    """Diagonal Fisher keyed by parameter name, fp32, averaged over rollouts (prompt ids, response ids). Computed on
    the model's device, returned on the CPU. Tied parameters (lm_head = embed_tokens) appear once, under the name
    the checkpoint stores. With ``reduce``, ``rollouts`` is this process's share and the mean is over all shares."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    dev = next(iter(params.values())).device
    n = reduced_count(len(rollouts), reduce, dev)
    if not n:
        raise ValueError("estimate_diag_fisher: no rollouts")
    model.eval()
    fisher = {k: torch.zeros(v.shape, dtype=torch.float32, device=dev) for k, v in params.items()}
    from torch.func import grad, vmap

    one = grad(lambda p, x, w: _mean_loglik(model, p, x, w))
    per_sample = vmap(one, in_dims=(None, 0, 0))
    for start in tqdm(range(0, len(rollouts), chunk), desc="fisher", mininterval=2.0):
        ids, w = rollout_batch(rollouts[start: start + chunk], pad_id)
        # each gradient is fresh and ours: squared in place, not into a temporary of its size (a large fresh tensor
        # is paid in page faults on a CPU; the same products, so the same bits as g.pow(2))
        if len(ids) == 1:   # one rollout: a plain backward (vmap batching one sample only costs, attention most)
            for k, g in one(params, ids[0].to(dev), w[0].to(dev)).items():
                g = g.float()
                fisher[k] += g.mul_(g)
            continue
        grads = per_sample(params, ids.to(dev), w.to(dev))
        for k, g in grads.items():
            g = g.float()
            fisher[k] += g.mul_(g).sum(0)
    if reduce is not None:
        for v in fisher.values():
            reduce(v)
    return {k: (v / n).cpu() for k, v in fisher.items()}


def naive_diag_fisher(model: torch.nn.Module, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]],
                      pad_id: int) -> dict[str, torch.Tensor]:
    """Reference: one ordinary backward per rollout, no padding. For tests."""
    names = [k for k, _ in model.named_parameters()]
    fisher = {k: torch.zeros(v.shape, dtype=torch.float32) for k, v in model.named_parameters()}
    for p, r in rollouts:
        ids = torch.tensor([list(p) + list(r)])
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(r) - 1), torch.tensor(list(r))]
        model.zero_grad(set_to_none=True)
        logp.mean().backward()
        for k, prm in zip(names, model.parameters()):
            fisher[k] += prm.grad.float().pow(2)
    return {k: v / len(rollouts) for k, v in fisher.items()}


def directional_fisher(model: torch.nn.Module, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]], pad_id: int,
                       direction: dict[str, torch.Tensor], chunk: int = 8) -> float:
    """D^T F D for the full (not diagonal, not KFAC) empirical Fisher of ``estimate_diag_fisher``:
    (1/N) sum_n (g_n . D)^2 with g_n the gradient of rollout n's mean log-likelihood, from the same per-sample
    gradients (fp64 dot products). The quantity the diagonal and KFAC forms approximate, exactly, along one D."""
    params = {k: v.detach() for k, v in model.named_parameters()}
    missing = sorted(set(params) - set(direction))
    if missing:
        raise KeyError(f"directional_fisher: no direction for parameter {missing[0]}")
    if not rollouts:
        raise ValueError("directional_fisher: no rollouts")
    dev = next(iter(params.values())).device
    d = {k: direction[k].to(dev, torch.float64) for k in params}
    model.eval()
    from torch.func import grad, vmap

    per_sample = vmap(grad(lambda p, x, w: _mean_loglik(model, p, x, w)), in_dims=(None, 0, 0))
    total = 0.0
    for start in range(0, len(rollouts), chunk):
        ids, w = rollout_batch(rollouts[start: start + chunk], pad_id)
        grads = per_sample(params, ids.to(dev), w.to(dev))
        dots = sum((g.double().reshape(g.shape[0], -1) @ d[k].reshape(-1)) for k, g in grads.items())
        total += float(dots.pow(2).sum())
    return total / len(rollouts)
