"""Per-sample likelihood of responses under a model (the SynthSelf alignment metric)."""
from __future__ import annotations

from typing import Sequence

import torch


@torch.no_grad()
def mean_token_nll(model: torch.nn.Module, pairs: Sequence[tuple[list[int], list[int]]], pad_id: int,
                   batch_size: int = 32) -> list[float]:
    """For each (prompt ids, response ids): mean negative log-likelihood per response token, in fp32."""
    out: list[float] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start: start + batch_size]
        width = max(len(p) + len(r) for p, r in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for i, (p, r) in enumerate(chunk):
            ids[i, : len(p) + len(r)] = torch.tensor(p + r)
            attn[i, : len(p) + len(r)] = 1
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float(), -1)
        for i, (p, r) in enumerate(chunk):
            if not r:
                raise ValueError(f"response {start + i} is empty: no likelihood to measure")
            pos = torch.arange(len(p) - 1, len(p) + len(r) - 1)
            out.append(float(-logp[i, pos, torch.tensor(r)].mean()))
    return out
