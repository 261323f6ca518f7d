"""Likelihood of responses under a model: logits at the response positions (OPSD's divergence, SynthSelf's NLL)."""
from __future__ import annotations

from typing import Sequence

import torch


def response_logits(model: torch.nn.Module, prompts: Sequence[list[int]], responses: Sequence[list[int]],
                    pad_id: int) -> list[torch.Tensor]:
    """For each (prompt, response): the logits that predict each response token (one row per response token).
    One right-padded forward pass; gradients flow unless the caller disables them."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(len(s) for s in seqs)
    device = next(model.parameters()).device
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
    logits = model(input_ids=ids.to(device), attention_mask=attn.to(device)).logits
    return [logits[i, len(p) - 1: len(p) - 1 + len(r)] for i, (p, r) in enumerate(zip(prompts, responses))]


@torch.no_grad()
def mean_token_nll(model: torch.nn.Module, pairs: Sequence[tuple[list[int], list[int]]], pad_id: int,
                   batch_size: int = 32) -> list[float]:
    """For each (prompt ids, response ids): mean negative log-likelihood per response token, in fp32."""
    out: list[float] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start: start + batch_size]
        for i, (_, r) in enumerate(chunk):
            if not r:
                raise ValueError(f"response {start + i} is empty: no likelihood to measure")
        rows = response_logits(model, [p for p, _ in chunk], [r for _, r in chunk], pad_id)
        for (_, r), logits in zip(chunk, rows):
            logp = torch.log_softmax(logits.float(), -1)
            out.append(float(-logp[torch.arange(len(r)), torch.tensor(r)].mean()))
    return out
