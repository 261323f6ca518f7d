"""Synthetic tasks of the embedded toy world, each with a verifiable final answer.

Old-task suites (what post-training teaches): column addition and digit reversal.
New task (the hard pool): column subtraction, with a gold worked solution written in a *teacher* style that differs
from the post model's own *student* style, so that SynthSelf rewriting into the student's words is meaningful.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

OLD_SUITES = ("add", "reverse")
REWRITE_INSTRUCTION = "Rewrite the solution in your own words, keep the answer."


@dataclass(frozen=True)
class Problem:
    problem_id: str
    suite: str
    question: str
    answer: str
    student_trace: str   # the world's own reasoning style (pretraining and post-training use it)
    teacher_trace: str   # the gold solution as an outside teacher writes it


_COLUMN = ("ones", "tens", "hundreds", "thousands", "ten-thousands", "hundred-thousands")


def _digits(n: int, width: int) -> list[int]:
    return [int(c) for c in str(n).zfill(width)][::-1]


def add_problem(a: int, b: int) -> Problem:
    width = max(len(str(a)), len(str(b)))
    da, db = _digits(a, width), _digits(b, width)
    carry, steps, words = 0, [], []
    for i, (x, y) in enumerate(zip(da, db)):
        s = x + y + carry
        steps.append(f"{x}+{y}" + (f"+{carry}" if carry else "") + f"={s}")
        words.append(f"{_COLUMN[i]} {x} plus {y}" + (" plus one" if carry else "") + f" is {s}")
        carry = s // 10
    return Problem(
        problem_id=f"add-{a}-{b}", suite="add", question=f"{a}+{b}=?", answer=str(a + b),
        student_trace=" ".join(steps), teacher_trace=", ".join(words) + f"; so {a + b}")


def sub_problem(a: int, b: int) -> Problem:
    if b > a:
        raise ValueError("sub_problem expects a >= b")
    width = len(str(a))
    da, db = _digits(a, width), _digits(b, width)
    borrow, steps, words = 0, [], []
    for i, (x, y) in enumerate(zip(da, db)):
        top = x - borrow
        borrow = 1 if top < y else 0
        top += 10 * borrow
        steps.append(f"{top}-{y}={top - y}")
        words.append(f"{_COLUMN[i]} {top} minus {y} is {top - y}" + (" borrow" if borrow else ""))
    return Problem(
        problem_id=f"sub-{a}-{b}", suite="sub", question=f"{a}-{b}=?", answer=str(a - b),
        student_trace=" ".join(steps), teacher_trace=", ".join(words) + f"; so {a - b}")


def reverse_problem(s: str) -> Problem:
    r = s[::-1]
    return Problem(
        problem_id=f"rev-{s}", suite="reverse", question=f"reverse {s}", answer=r,
        student_trace=" ".join(r), teacher_trace=f"from the right {s} reads {r}")


def make_problem(suite: str, rng: random.Random) -> Problem:
    if suite == "add":
        return add_problem(rng.randint(10, 999), rng.randint(10, 999))
    if suite == "sub":
        a = rng.randint(100, 999)
        return sub_problem(a, rng.randint(10, a))
    if suite == "reverse":
        return reverse_problem("".join(rng.choice("123456789") for _ in range(rng.randint(3, 6))))
    raise ValueError(f"unknown suite {suite!r}")


def sample_problems(suite: str, n: int, rng: random.Random, exclude: set[str] | None = None) -> list[Problem]:
    """n distinct problems of a suite, none of whose ids are in ``exclude``."""
    seen = set(exclude or ())
    out: list[Problem] = []
    tries = 0
    while len(out) < n:
        p = make_problem(suite, rng)
        tries += 1
        if tries > 100 * n + 1000:
            raise RuntimeError(f"could not draw {n} distinct {suite} problems")
        if p.problem_id in seen:
            continue
        seen.add(p.problem_id)
        out.append(p)
    return out


def rewrite_question(question: str, solution: str) -> str:
    """The SynthSelf rewrite prompt: the aligner sees the problem and the gold solution."""
    return f"{REWRITE_INSTRUCTION}\nproblem: {question}\nsolution: {solution}"


def raw_text(p: Problem) -> str:
    """Pretraining form: plain text, no chat format."""
    return f"{p.question} {p.student_trace} answer {p.answer}"
