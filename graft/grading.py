"""Grading of final answers: math-verify for math, normalised exact match for facts.

The answer is read only after the think block, in the answer format the model writes (``graft.chat``). Math answers
are compared by ``math_verify`` (fractions, boxed forms, equivalent expressions); facts by exact match after
normalising case, spacing and surrounding punctuation.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

from graft.chat import AnswerFormat, ChatSpec, ParsedResponse, parse_response

# math: math-verify equivalence; fact: exact match after normalising; contains: the normalised gold answer appears as
# whole words in the normalised answer (free-text answers of instruct models: "The capital of France is Paris.").
# An old suite of plain text (PERPLEXITY) is scored by the likelihood the model gives it, not by grading answers.
from graft.registry import GRADERS, PERPLEXITY, SUITE_KINDS, suite_schema  # noqa: F401 (names graders share)


def normalise_fact(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower().strip()
    text = re.sub(r"[\s]+", " ", text)
    return text.strip(" .!?,;:\"'")


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?")


def last_number(sentence: str) -> str | None:
    """The last number written in a line of prose ("7 + 5 = 12." -> "12"; thousands commas dropped)."""
    found = _NUMBER.findall(sentence)
    return found[-1].replace(",", "") if found else None


@lru_cache(maxsize=65536)
def _parsed(text: str):
    # A bare answer like "45" or "3/4" is parsed as math; wrapping in $...$ lets math-verify read LaTeX too.
    from math_verify import parse   # here, not at import: it loads sympy (seconds), and params loading imports us

    return parse(f"${text}$")


def math_equal(pred: str, gold: str, sentence: bool = False) -> bool:
    """``sentence``: the prediction is a line of prose (final_line): its answer is the last number in it, and a
    line with none is read as math as it is."""
    if sentence:
        pred = last_number(pred) or pred
    if pred.strip() == gold.strip():
        return True
    g, p = _parsed(gold), _parsed(pred)
    if not g or not p:
        return False
    from math_verify import verify

    return bool(verify(g, p))


def fact_equal(pred: str, gold: str) -> bool:
    return normalise_fact(pred) == normalise_fact(gold)


def fact_contained(pred: str, gold: str) -> bool:
    g = normalise_fact(gold)
    return bool(g) and re.search(rf"(?<!\w){re.escape(g)}(?!\w)", normalise_fact(pred)) is not None


@dataclass(frozen=True)
class Grader:
    """One suite's grading: how the turn is split (chat), where the answer is (format), how it is compared."""
    chat: ChatSpec
    answer: AnswerFormat
    kind: str = "math"

    def __post_init__(self) -> None:
        if self.kind not in GRADERS:
            raise ValueError(f"grader must be one of {GRADERS}, got {self.kind!r}")

    def parse(self, text: str) -> ParsedResponse:
        return parse_response(text, self.chat, self.answer)

    def grade(self, completion, gold: str) -> tuple[str | None, bool]:
        """(extracted answer, correct) for one ``generation.Completion``. A turn cut at max_new_tokens has no final
        line: under ``final_line`` it is wrong (whatever number the cut happened to end on); a tag or box it wrote
        before the cut still counts."""
        if self.answer.format == "final_line" and not completion.finished:
            return None, False
        return self(completion.text, gold)

    def __call__(self, text: str, gold: str) -> tuple[str | None, bool]:
        """(extracted answer, correct) for one generated assistant turn (a finished one)."""
        answer = self.parse(text).answer
        if answer is None or answer == "":
            return answer, False
        if self.kind == "math":
            return answer, math_equal(answer, gold, sentence=self.answer.format == "final_line")
        return answer, (fact_equal if self.kind == "fact" else fact_contained)(answer, gold)
