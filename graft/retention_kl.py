"""Measured retention KL of a sweep point: how far its next-token distributions moved from the post model's.

On the retention rollouts the fisher stage sampled from the post model (the distribution the Fisher is taken under),
at every response position t of rollout n the exact KL over the whole vocabulary

  KL_nt = sum_v p_post(v | z_n, y_<t) (log p_post(v | ...) - log p_point(v | ...))

is computed in fp64 from fp32 logits. Two means are reported:
  token:    sum_nt KL_nt / sum_n T_n                  the mean per-token KL (the issue's measure)
  rollout:  (1/N) sum_n (1/T_n^2) sum_t KL_nt         what 1/2 delta^T F delta estimates for our Fisher, whose
                                                      rollout gradient is that of the per-token *mean* log-likelihood
"""
from __future__ import annotations

from typing import Iterable, Sequence

import pandas as pd
import torch

from graft.fisher import rollout_batch

Rollout = tuple[Sequence[int], Sequence[int]]   # (prompt ids, response ids)
ROLLOUT_COLUMNS = ["rollout", "prompt_ids", "response_ids"]
ROLLOUTS = "data/fisher/retention_rollouts.parquet"   # the fisher stage's post-model rollouts, kept for the KL


def rollouts_table(rollouts: Sequence[Rollout]) -> pd.DataFrame:
    """The fisher stage's rollouts as a table (one row each, token ids as lists)."""
    return pd.DataFrame({"rollout": list(range(len(rollouts))),
                         "prompt_ids": [[int(t) for t in p] for p, _ in rollouts],
                         "response_ids": [[int(t) for t in r] for _, r in rollouts]}, columns=ROLLOUT_COLUMNS)


def rollouts_from_table(df: pd.DataFrame, name: str) -> list[Rollout]:
    missing = [c for c in ROLLOUT_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{name}: no column {missing[0]!r} (expected {', '.join(ROLLOUT_COLUMNS)})")
    out = [(list(map(int, p)), list(map(int, r))) for p, r in zip(df["prompt_ids"], df["response_ids"])]
    if not out:
        raise ValueError(f"{name}: no rollouts")
    for i, (p, r) in enumerate(out):
        if not p or not r:
            raise ValueError(f"{name}: rollout {i} has an empty {'prompt' if not p else 'response'}")
    return out


def read_rollouts(path: str = ROLLOUTS) -> list[Rollout]:
    """The fisher stage's rollouts table, read and checked (every error names the file)."""
    from graft.tables import read_parquet

    return rollouts_from_table(read_parquet(path), str(path))


def mean_inverse_length(rollouts: Sequence[Rollout]) -> float:
    """(1/N) sum_n 1/T_n: converts 1/2 delta^T F delta (rollout mean) to a per-token KL when KL_nt is constant."""
    return sum(1.0 / len(r) for _, r in rollouts) / len(rollouts)


def token_kl(ref_logits: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(ref) || softmax(logits)) over the last axis, in fp64."""
    ref = torch.log_softmax(ref_logits.double(), -1)
    cur = torch.log_softmax(logits.double(), -1)
    return (ref.exp() * (ref - cur)).sum(-1)


@torch.no_grad()
def retention_kl(reference: torch.nn.Module, model: torch.nn.Module, rollouts: Sequence[Rollout], pad_id: int,
                 chunk: int = 8) -> dict[str, float]:
    """Mean KL(reference || model) over the response positions of ``rollouts`` (both means, see the module doc).
    The two models share a tokenizer; padding is on the right, so it never reaches a scored position."""
    if not rollouts:
        raise ValueError("retention_kl: no rollouts")
    dev = next(model.parameters()).device
    total, tokens, weighted = 0.0, 0, 0.0
    for start in range(0, len(rollouts), chunk):
        batch = rollouts[start: start + chunk]
        ids, _ = rollout_batch(batch, pad_id)
        ids = ids.to(dev)
        ref = reference(input_ids=ids, use_cache=False).logits.float()
        cur = model(input_ids=ids, use_cache=False).logits.float()
        for i, (p, r) in enumerate(batch):
            # logits at position j predict token j + 1: the response tokens are predicted from len(p) - 1 on
            at = slice(len(p) - 1, len(p) + len(r) - 1)
            kl = token_kl(ref[i, at], cur[i, at])
            s = float(kl.sum())
            total += s
            tokens += len(r)
            weighted += s / len(r) ** 2
    return {"token": total / tokens, "rollout": weighted / len(rollouts), "tokens": tokens, "rollouts": len(rollouts)}


def brute_force_kl(reference: torch.nn.Module, model: torch.nn.Module, rollouts: Iterable[Rollout]) -> float:
    """Reference for tests: one unpadded forward per rollout, the KL summed vocabulary entry by entry."""
    total, tokens = 0.0, 0
    with torch.no_grad():
        for p, r in rollouts:
            ids = torch.tensor([list(p) + list(r)])
            a = torch.softmax(reference(input_ids=ids).logits[0].double(), -1)
            b = torch.softmax(model(input_ids=ids).logits[0].double(), -1)
            for t in range(len(p) - 1, len(p) + len(r) - 1):
                total += sum(float(a[t, v]) * (float(a[t, v].log()) - float(b[t, v].log()))
                             for v in range(a.shape[-1]))
                tokens += 1
    return total / tokens


class RetentionKL:
    """The post model (the reference) and a second copy whose weights each point overwrites in place, both fp32 on
    ``device``; ``measure`` scores one point's weights on the retention rollouts."""

    def __init__(self, post_dir: str, rollouts: Sequence[Rollout], pad_id: int, trust_remote_code: bool,
                 device: torch.device | str, chunk: int):
        from graft.modeling import load_model

        self.reference = load_model(post_dir, "float32", trust_remote_code, device)
        self.model = load_model(post_dir, "float32", trust_remote_code, device)
        self.rollouts, self.pad_id, self.chunk = list(rollouts), pad_id, chunk

    def measure(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, float]:
        from graft.inplace import overwrite_parameters

        overwrite_parameters(self.model, weights)
        return retention_kl(self.reference, self.model, self.rollouts, self.pad_id, self.chunk)
