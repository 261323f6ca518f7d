"""The world's pretraining mix: the chat share and which suites it covers."""
from __future__ import annotations

import random

from graft.chat import IM_END
from graft.tasks import sample_problems
from graft.world import pretraining_corpus


def test_chat_fraction_replaces_that_share_with_chat_turns_of_the_named_suites():
    held = {q.problem_id for q in sample_problems("add", 20, random.Random(9))}
    raw = pretraining_corpus(100, random.Random(0), held)
    mixed = pretraining_corpus(100, random.Random(0), held, 0.3, ("add", "reverse"), thinking=True)
    assert len(mixed) == len(raw) == 300
    chat = [t for t in mixed if IM_END in t]
    assert len(chat) == 90 and not any(IM_END in t for t in raw)
    assert {t.split("\n")[1].split()[0] == "reverse" for t in chat} == {True, False}   # both suites, no other
    assert not any("-" in t.split("\n")[1] for t in chat)                             # no subtraction turn
    questions = {t.split("\n")[1] for t in chat}
    held_q = {q.question for q in sample_problems("add", 20, random.Random(9))}
    assert not questions & held_q                                                      # held-out problems excluded
    assert pretraining_corpus(100, random.Random(0), held, 0.3, ("add", "reverse")) == mixed   # seeded
