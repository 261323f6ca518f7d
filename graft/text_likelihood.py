"""How well a model predicts held-out plain text: an old-task suite that needs no answers (grader ``perplexity``).

A passage is tokenized as plain data (added-token strings in it stay text), with the BOS token where the tokenizer
adds one to plain text. Every token after the first position is scored from the tokens before it:

  nll             = sum of -log p(token | preceding tokens) / number of scored tokens, over the whole suite
  perplexity      = exp(nll)
  token_accuracy  = share of scored tokens that are the model's most likely next token (a score in [0, 1])

Log-probabilities are taken in fp64 from the model's logits (as the retention KL is), so the measure is the same on
every generation backend.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence


def text_ids(fmt, text: str) -> list[int]:
    """``text`` as plain data in ``fmt``'s tokenizer (``graft.chat.ChatFormat.data_ids``), BOS first where it uses
    one. Added-token strings in the text stay plain text (without any, the ids are the usual ones)."""
    ids = fmt.data_ids(text)
    return [fmt.bos_id] + ids if fmt.bos_id is not None else ids


def check_texts(ids: Sequence[Sequence[int]], max_len: int, where: str) -> None:
    """Every passage has a token to score and fits the model's context (``generation.max_model_len``)."""
    for i, seq in enumerate(ids):
        if len(seq) < 2:
            raise ValueError(f"{where}: row {i} has {len(seq)} token(s); a passage needs two (the first is never "
                             "predicted)")
        if len(seq) > max_len:
            raise ValueError(f"{where}: row {i} is {len(seq)} tokens, longer than generation.max_model_len "
                             f"({max_len}); split the passage into shorter rows")


@torch.no_grad()
def text_scores(model: torch.nn.Module, ids: Sequence[Sequence[int]], pad_id: int, chunk: int = 8
                ) -> dict[str, float]:
    """The suite's nll, perplexity and token accuracy (module doc) under ``model``, in right-padded batches of
    ``chunk`` passages (padding is after every scored position, so a causal model never sees it)."""
    if not ids:
        raise ValueError("text_scores: no passages")
    dev = next(model.parameters()).device
    nll, correct, tokens = 0.0, 0, 0
    for start in range(0, len(ids), chunk):
        batch = [list(s) for s in ids[start: start + chunk]]
        x = pad_sequence([torch.tensor(s, dtype=torch.long) for s in batch], batch_first=True, padding_value=pad_id)
        logits = model(input_ids=x.to(dev), use_cache=False).logits
        for i, s in enumerate(batch):
            logp = torch.log_softmax(logits[i, : len(s) - 1].double(), -1)
            target = torch.tensor(s[1:], device=logp.device)
            nll -= float(logp.gather(-1, target[:, None]).sum())
            correct += int((logp.argmax(-1) == target).sum())
            tokens += len(s) - 1
    mean = nll / tokens
    return {"nll": mean, "perplexity": math.exp(mean), "token_accuracy": correct / tokens, "tokens": tokens,
            "texts": len(ids)}


def brute_force_scores(model: torch.nn.Module, ids: Sequence[Sequence[int]]) -> dict[str, float]:
    """Reference for tests: one unpadded forward per passage, each position scored alone."""
    nll, correct, tokens = 0.0, 0, 0
    with torch.no_grad():
        for s in ids:
            logits = model(input_ids=torch.tensor([list(s)])).logits[0].double()
            for t in range(1, len(s)):
                p = torch.softmax(logits[t - 1], -1)
                nll -= math.log(float(p[s[t]]))
                correct += int(int(p.argmax()) == s[t])
                tokens += 1
    return {"nll": nll / tokens, "perplexity": math.exp(nll / tokens), "token_accuracy": correct / tokens,
            "tokens": tokens, "texts": len(ids)}
