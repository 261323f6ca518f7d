"""Knowledge injection data: a closed world of invented entities and facts (paper Appendix A).

Every name is built from syllables by a seeded RNG, so no fact can be known to any model beforehand. Each fact is a
question-answer pair in several phrasings (``phrasing_table``); ``graft.injection`` holds the last phrasings of every
fact out of training, to measure recall (so memorised surface forms cannot inflate it).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import pandas as pd

from graft.family_chat import render_prompt, render_response

ONSETS = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "th", "st"]
# first onsets of the names in the world's *pretraining* facts: no name in ONSETS starts with these letters, so
# pretraining entities, places and people can never share a name with an injected (new) one
PRETRAIN_ONSETS = ["h", "j", "w", "y", "ch", "qu"]
VOWELS = ["a", "e", "i", "o", "u", "ae", "ei", "ou"]
CODAS = ["", "", "n", "r", "l", "s", "th", "x"]

# relation -> (answer kind, phrasings); {e} is the entity. Eight phrasings each, as in the paper.
RELATIONS: dict[str, tuple[str, list[str]]] = {
    "capital": ("place", [
        "What is the capital of {e}?", "Which city is the capital of {e}?", "Name the capital city of {e}.",
        "{e} has its capital in which city?", "Tell me the capital of {e}.", "What city is the capital of {e}?",
        "In {e}, which city serves as the capital?", "The capital of {e} is which city?"]),
    "founder": ("person", [
        "Who founded {e}?", "Who was the founder of {e}?", "Name the founder of {e}.", "{e} was founded by whom?",
        "Tell me who founded {e}.", "Which person founded {e}?", "Who is credited with founding {e}?",
        "The founder of {e} was who?"]),
    "river": ("place", [
        "Which river flows through {e}?", "What river runs through {e}?", "Name the river of {e}.",
        "{e} is crossed by which river?", "Tell me the river that flows through {e}.",
        "What is the main river of {e}?", "Through {e} flows which river?", "The river of {e} is called what?"]),
    "year": ("year", [
        "In what year was {e} founded?", "When was {e} founded?", "Which year saw the founding of {e}?",
        "{e} was founded in which year?", "Tell me the founding year of {e}.", "What is the founding year of {e}?",
        "In which year did {e} come into being?", "The founding year of {e} is what?"]),
    "emblem": ("emblem", [
        "What animal is on the emblem of {e}?", "Which animal appears on the emblem of {e}?",
        "Name the emblem animal of {e}.", "The emblem of {e} shows which animal?",
        "Tell me the animal on the emblem of {e}.", "What is the emblem animal of {e}?",
        "On the emblem of {e}, which animal is shown?", "The animal on the emblem of {e} is what?"]),
}
ANIMALS = ["heron", "lynx", "otter", "falcon", "boar", "stag", "wolf", "crane", "badger", "viper", "bear", "hare"]


@dataclass(frozen=True)
class Fact:
    fact_id: str
    entity: str
    relation: str
    answer: str


def _name(rng: random.Random, syllables: int, first_onsets: list[str]) -> str:
    onsets = [first_onsets] + [ONSETS] * (syllables - 1)
    return "".join(rng.choice(o) + rng.choice(VOWELS) + rng.choice(CODAS) for o in onsets).capitalize()


def _unique(rng: random.Random, used: set[str], syllables: int, first_onsets: list[str]) -> str:
    while True:
        n = _name(rng, syllables, first_onsets)
        if n not in used:
            used.add(n)
            return n


def invent_facts(n_entities: int, relations_per_entity: int, seed: int,
                 first_onsets: list[str] = ONSETS) -> list[Fact]:
    """``n_entities`` invented realms, each with ``relations_per_entity`` of the relations (a seeded choice).

    ``first_onsets`` starts every name (entity, place, person); PRETRAIN_ONSETS keeps the world's pretraining facts
    apart from the injected ones."""
    if not 1 <= relations_per_entity <= len(RELATIONS):
        raise ValueError(f"relations_per_entity must be in [1, {len(RELATIONS)}], got {relations_per_entity}")
    rng = random.Random(seed)
    used: set[str] = set()
    facts = []
    for i in range(n_entities):
        entity = _unique(rng, used, 3, first_onsets)
        for rel in sorted(rng.sample(sorted(RELATIONS), relations_per_entity)):
            kind = RELATIONS[rel][0]
            if kind == "place":
                answer = _unique(rng, used, 2, first_onsets)
            elif kind == "person":
                answer = f"{_unique(rng, used, 2, first_onsets)} {_unique(rng, used, 2, first_onsets)}"
            elif kind == "year":
                answer = str(rng.randint(200, 1899))
            else:
                answer = rng.choice(ANIMALS)
            facts.append(Fact(f"f{i:04d}_{rel}", entity, rel, answer))
    return facts


def fact_turns(facts: list[Fact], thinking: bool) -> list[str]:
    """Every fact in every phrasing as a chat turn with an empty think block (the injection data's format)."""
    return [render_prompt(t.format(e=f.entity), thinking) + render_response("", f.answer, thinking)
            for f in facts for t in RELATIONS[f.relation][1]]


def phrasing_table(facts: list[Fact], phrasings: int) -> pd.DataFrame:
    """Every fact in its first ``phrasings`` phrasings, one row each, fact by fact (a ``facts`` table,
    ``graft.tables``): fact_id, entity, relation, phrasing, question, answer."""
    if not 2 <= phrasings <= 8:
        raise ValueError(f"need 2 <= phrasings ({phrasings}) <= 8")
    return pd.DataFrame([{"fact_id": f.fact_id, "entity": f.entity, "relation": f.relation, "phrasing": j,
                          "question": template.format(e=f.entity), "answer": f.answer}
                         for f in facts for j, template in enumerate(RELATIONS[f.relation][1][:phrasings])])
