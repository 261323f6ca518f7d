"""On-policy self-distillation (OPSD), the on-policy baseline (paper §2 and Appendix C).

For each problem the student (the model being trained) samples one response to the plain prompt; a frozen copy of the
starting model, prompted with the same problem plus the off-policy demonstration (or, for knowledge QA pairs, a
passage stating the facts: opsd.teacher_context), is the teacher. The loss is the sum
over response tokens of D_alpha(teacher || student) between next-token distributions restricted to the teacher's
top-k tokens. Both prompts come from the same ``ChatFormat.prompt_ids`` (the model's own template), so the response is
scored under the same template the student sampled it with.

D_alpha is the generalised Jensen-Shannon family of GKD (Agarwal et al. 2023): with M = alpha T + (1 - alpha) S,
D_alpha = alpha KL(T || M) + (1 - alpha) KL(S || M) for 0 < alpha < 1, and its endpoints alpha = 0: KL(T || S)
(forward KL) and alpha = 1: KL(S || T) (reverse KL); alpha = 0.5 is the Jensen-Shannon divergence.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Sequence

import torch

from graft.chat import ChatFormat
from graft.generation import HFGenerator, SamplingSpec, request_seed
from graft.likelihood import response_logits


def generalized_jsd(t_logp: torch.Tensor, s_logp: torch.Tensor, alpha: float) -> torch.Tensor:
    """D_alpha(T || S) over the last axis of two log-distributions (teacher, student)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 0.0:
        return (t_logp.exp() * (t_logp - s_logp)).sum(-1)
    if alpha == 1.0:
        return (s_logp.exp() * (s_logp - t_logp)).sum(-1)
    m = torch.logsumexp(torch.stack([t_logp + math.log(alpha), s_logp + math.log(1 - alpha)]), dim=0)
    kl_t = (t_logp.exp() * (t_logp - m)).sum(-1)
    kl_s = (s_logp.exp() * (s_logp - m)).sum(-1)
    return alpha * kl_t + (1 - alpha) * kl_s


def topk_divergence(teacher_logits: torch.Tensor, student_logits: torch.Tensor, alpha: float,
                    top_k: int) -> torch.Tensor:
    """D_alpha per position on the teacher's top-k tokens, both distributions renormalised over that support."""
    k = min(top_k, teacher_logits.size(-1))
    idx = teacher_logits.float().topk(k, dim=-1).indices
    t = torch.log_softmax(teacher_logits.float().gather(-1, idx), -1)
    s = torch.log_softmax(student_logits.float().gather(-1, idx), -1)
    return generalized_jsd(t, s, alpha)


def _stopped_everywhere(model: torch.nn.Module):
    """For an FSDP-sharded student, "all rows stopped" over every process (each forward gathers weights, so the
    processes must run the same number); None otherwise (nothing to agree on)."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return None
    import torch.distributed as dist

    def agree(stopped: bool) -> bool:
        flag = torch.tensor(1.0 if stopped else 0.0, device=next(model.parameters()).device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item() == 1.0)
    return agree


def demonstration_question(question: str, think: str, answer: str) -> str:
    """The teacher's user turn: the problem and the off-policy demonstration it may draw on."""
    shown = f"{think}\nFinal answer: {answer}" if think else f"Final answer: {answer}"
    return f"{question}\n\nA worked solution:\n{shown}\n\nNow solve the problem."


def passage_question(question: str, passage: str) -> str:
    """The teacher's user turn for a knowledge QA pair (paper Appendix C): a passage stating the facts, then the
    question; the answer is never shown, the teacher has to read it out of the passage."""
    return f"Read this passage:\n{passage}\n\nUsing the passage, answer the question.\n{question}"


@dataclass(frozen=True)
class OPSDExample:
    question: str
    think: str
    answer: str
    passage: str = ""   # non-empty: the teacher reads this passage instead of the demonstration

    def teacher_question(self) -> str:
        if self.passage:
            return passage_question(self.question, self.passage)
        return demonstration_question(self.question, self.think, self.answer)


class OPSDObjective:
    """The OPSD loss for the shared training driver: summed over response tokens, averaged over sequences."""

    def __init__(self, teacher: torch.nn.Module, tokenizer, fmt: ChatFormat, examples: Sequence[OPSDExample],
                 alpha: float, top_k: int, temperature: float, top_p: float, max_new_tokens: int, seed: int,
                 max_len: int, teacher_max_len: int | None = None):
        """``max_len`` bounds the student's sequences (prompt + response: the ones trained on, finetune.max_len);
        ``teacher_max_len`` the teacher's (its prompt holds the demonstration, and it runs without gradients:
        generation.max_model_len, the longest sequence the model is run on; ``max_len`` when None)."""
        self.teacher, self.tokenizer, self.fmt, self.examples = teacher, tokenizer, fmt, list(examples)
        self.alpha, self.top_k = alpha, top_k
        self.temperature, self.top_p, self.max_new_tokens, self.seed = temperature, top_p, max_new_tokens, seed
        for p in teacher.parameters():
            p.requires_grad_(False)

        self.student_prompts = [fmt.prompt_ids(e.question) for e in self.examples]
        self.teacher_prompts = [fmt.prompt_ids(e.teacher_question()) for e in self.examples]
        limits = (("student", self.student_prompts, max_len, "finetune.max_len"),
                  ("teacher", self.teacher_prompts, teacher_max_len or max_len,
                   "generation.max_model_len" if teacher_max_len else "finetune.max_len"))
        for who, prompts, limit, key in limits:
            for i, ids in enumerate(prompts):
                if len(ids) + max_new_tokens > limit:
                    raise ValueError(f"opsd: example {i}: {who} prompt ({len(ids)} tokens) + opsd.max_new_tokens "
                                     f"({max_new_tokens}) exceeds {key} ({limit})")

    def normalizer(self, batch: Sequence[int]) -> float:
        return float(len(batch))

    def sample(self, model: torch.nn.Module, indices: Sequence[int], step: int) -> list[list[int]]:
        """One response per example from the current student; the seed depends on (step, example) only, so the
        samples do not depend on how a batch is split over micro-batches or processes."""
        gen = HFGenerator.from_model(model, self.tokenizer, self.fmt.stop_ids, self.fmt.pad_id,
                                     batch_size=len(indices), all_stopped=_stopped_everywhere(model))
        spec = SamplingSpec(n=1, temperature=self.temperature, top_p=self.top_p,
                            max_new_tokens=self.max_new_tokens, seed=0)
        rows = [(self.student_prompts[i],
                 torch.Generator().manual_seed(request_seed(request_seed(self.seed, step), i))) for i in indices]
        return gen.generate_rows(rows, spec)

    def loss_sum(self, model: torch.nn.Module, indices: Sequence[int], step: int) -> tuple[torch.Tensor, float]:
        raw = getattr(model, "module", model)  # sample with the bare module: no DDP hooks on a no-grad pass
        t0 = time.perf_counter()
        responses = self.sample(raw, indices, step)
        sample_s = time.perf_counter() - t0
        with torch.no_grad():
            t_logits = response_logits(self.teacher, [self.teacher_prompts[i] for i in indices], responses,
                                        self.fmt.pad_id)
        s_logits = response_logits(model, [self.student_prompts[i] for i in indices], responses, self.fmt.pad_id)
        total = sum(topk_divergence(t, s, self.alpha, self.top_k).sum() for t, s in zip(t_logits, s_logits))
        return total, sample_s
