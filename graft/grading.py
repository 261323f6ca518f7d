"""Grading of final answers: math-verify for math, normalised exact match for facts.

The answer is read only from the answer tag after the think block (``chat.parse_response``). When the tag holds
math, ``math_verify`` decides equivalence (fractions, boxed forms, equivalent expressions).
"""
from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from math_verify import parse, verify

from graft.chat import parse_response


def normalise_fact(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).lower().strip()
    text = re.sub(r"[\s]+", " ", text)
    return text.strip(" .!?,;:\"'")


@lru_cache(maxsize=65536)
def _parsed(text: str):
    # A bare answer like "45" or "3/4" is parsed as math; wrapping in $...$ lets math-verify read LaTeX too.
    return parse(f"${text}$")


def math_equal(pred: str, gold: str) -> bool:
    if pred.strip() == gold.strip():
        return True
    g, p = _parsed(gold), _parsed(pred)
    if not g or not p:
        return False
    return bool(verify(g, p))


def grade_math(text: str, gold: str, thinking: bool) -> tuple[str | None, bool]:
    """(extracted answer, correct) for one generated assistant turn."""
    answer = parse_response(text, thinking).answer
    if answer is None or answer == "":
        return answer, False
    return answer, math_equal(answer, gold)


def grade_fact(text: str, gold: str, thinking: bool) -> tuple[str | None, bool]:
    answer = parse_response(text, thinking).answer
    if answer is None:
        return None, False
    return answer, normalise_fact(answer) == normalise_fact(gold)
