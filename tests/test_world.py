"""The world's pretraining mix: the chat share, which suites it covers, and the pretraining facts."""
from __future__ import annotations

import random

from graft.family_chat import IM_END
from tests.conftest import family_grader
from graft.knowledge import RELATIONS, fact_turns, invent_facts
from graft.tasks import sample_problems
from graft.world import pretraining_corpus, pretraining_facts


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


def test_pretraining_facts_never_share_a_name_with_injected_facts_and_come_in_every_phrasing():
    assert pretraining_facts(0, 0) == []                       # the lever off: nothing added, no rng drawn
    pre = pretraining_facts(60, 0)
    injected = invent_facts(60, 5, seed=0)                     # the knowledge stage's facts, same seed on purpose
    names = lambda fs: {f.entity for f in fs} | {n for f in fs if f.relation in ("capital", "river", "founder")
                                                 for n in f.answer.split()}
    assert len(pre) == 60 * len(RELATIONS) and not names(pre) & names(injected)
    assert all(n[0].lower() in "hjwycq" for n in names(pre))
    turns = fact_turns(pre[:3], thinking=True)
    assert len(turns) == 3 * 8
    for t, f in zip(turns, [f for f in pre[:3] for _ in range(8)]):
        prompt, response = t.split("<|im_start|>assistant\n")
        assert f.entity in prompt and family_grader("fact")(response, f.answer) == (f.answer, True)
        assert family_grader("fact").parse(response).think == ""     # the injection data's empty think block
