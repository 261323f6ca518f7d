"""STaR, aligner selection, knowledge injection and the likelihood metric, on constructed cases."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from graft.family_chat import EMPTY_THINK
from graft.injection import evaluated_facts, number_phrasings, split_phrasings
from graft.knowledge import RELATIONS, invent_facts, phrasing_table
from graft.likelihood import mean_token_nll
from graft.modeling import load_model
from graft.generation import Completion
from graft.canonical import canonical_text
from graft.offpolicy import mix_knowledge, select_aligner, star_traces
from graft.passages import passage_table, with_passages
from graft.tables import TableError
from graft.training import SFTExample, encode_sft
from tests.conftest import family_grader

TRAIN = pd.DataFrame({"problem_id": ["a", "b", "c"], "question": ["9-3=?", "17-5=?", "40-12=?"],
                      "answer": ["6", "12", "28"], "solution": ["x", "y", "z"]})


def turn(think: str, answer: str) -> str:
    return f"<think>\n{think}\n</think>\n\n<answer>{answer}</answer>"


def test_star_keeps_only_the_first_verified_attempt():
    attempts = [
        [turn("guess", "5"), turn("9-3=6", "6"), turn("again", "6")],          # second attempt is the first right one
        ["<think>\n<answer>12</answer> never closes", turn("no", "13")],      # right answer only inside thinking
        [turn("a", "28"), turn("b", "28")],
    ]
    traces, counts = star_traces(TRAIN, [[Completion(t, ()) for t in a] for a in attempts], family_grader())
    assert list(traces.problem_id) == ["a", "c"]
    assert list(traces.think) == ["9-3=6", "a"] and set(traces.source) == {"star"}
    assert list(counts.successes) == [2, 0, 2] and list(counts.kept_sample) == [1, -1, 0]


def test_aligner_selection_follows_eq6():
    cands = pd.DataFrame({"name": ["big", "cross", "tiny", "bigger"],
                          "accuracy": [0.7, 0.9, 0.1, 0.8],
                          "nll": [0.9, 1.6, 0.5, 1.1]})
    # tiny has the lowest NLL but rewrites worse than the student; cross rewrites well but is less likely than gold
    assert select_aligner(cands, student_accuracy=0.2, gold_nll=1.5) == "big"
    assert select_aligner(cands, student_accuracy=0.75, gold_nll=1.5) == "bigger"
    assert select_aligner(cands, student_accuracy=0.95, gold_nll=1.5) is None
    assert select_aligner(cands, student_accuracy=0.0, gold_nll=0.4) is None


def test_knowledge_heldout_phrasings_never_trained():
    facts = invent_facts(30, 5, seed=1)
    assert len(facts) == 150 and len({f.entity for f in facts}) == 30
    qa = number_phrasings(phrasing_table(facts, phrasings=8), "facts", "knowledge.facts")
    train, held = split_phrasings(qa, heldout=2, where="facts")
    assert len(train) == 150 * 6 and len(held) == 150 * 2
    assert not set(train.question) & set(held.question)
    assert set(train.fact_id) == set(held.fact_id)          # the same facts, asked differently
    assert train.phrasing.max() == 5 and set(held.phrasing) == {6, 7}
    # no training question is a held-out template filled with any entity
    entities = {f.entity for f in facts}
    held_texts = {t.format(e=e) for _, ts in RELATIONS.values() for t in ts[6:] for e in entities}
    assert not set(train.question) & held_texts
    assert invent_facts(30, 5, seed=1) == facts and invent_facts(30, 5, seed=2) != facts
    chosen = evaluated_facts(held, 10, seed=3)
    assert chosen.fact_id.nunique() == 10 and len(chosen) == 20 and chosen.equals(evaluated_facts(held, 10, seed=3))


def test_invented_passages_state_every_fact_of_their_entity_in_no_question_phrasing():
    facts = invent_facts(12, 5, seed=4)
    table = with_passages(phrasing_table(facts, phrasings=8), facts)
    qa = number_phrasings(table, "facts", "knowledge.facts")
    passages = passage_table(table, qa, "facts")
    assert list(passages.problem_id) == list(qa.problem_id)
    for f in facts:
        rows = table[table.fact_id == f.fact_id]
        assert rows.passage.nunique() == 1
        text = rows.passage.iloc[0]
        assert text.startswith(f.entity) and f.answer in text
        # every fact of the entity, and nothing of another entity's (names are unique across the world)
        assert all(g.answer in text for g in facts if g.entity == f.entity)
        assert not any(g.entity in text for g in facts if g.entity != f.entity)
        # declarative, not a question: no phrasing (held out or trained) appears in it
        assert not any(canonical_text(t.format(e=f.entity)).rstrip("?.") in canonical_text(text)
                       for t in RELATIONS[f.relation][1])


def test_passage_table_is_empty_without_the_column_and_refuses_bad_passages():
    rows = pd.DataFrame({"fact_id": ["a", "a", "b", "b"], "question": ["q1?", "q2?", "q3?", "q4?"],
                         "answer": ["x", "x", "y", "y"]})
    qa = number_phrasings(rows, "f.parquet", "knowledge.facts")
    assert passage_table(rows, qa, "f.parquet").empty
    good = rows.assign(passage=["A x.", "A x.", "B y.", "B y."])
    assert list(passage_table(good, qa, "f.parquet").passage) == ["A x.", "A x.", "B y.", "B y."]
    with pytest.raises(TableError, match=r"f.parquet: fact 'b' has 2 different passages"):
        passage_table(rows.assign(passage=["A x.", "A x.", "B y.", "B z."]), qa, "f.parquet")
    with pytest.raises(TableError, match=r"f.parquet: row 1: column 'passage' must be non-blank text \(1 row"):
        passage_table(rows.assign(passage=["A x.", " ", "B y.", "B y."]), qa, "f.parquet")
    with pytest.raises(TableError, match=r"row 3: column 'passage' must be non-blank text"):
        passage_table(rows.assign(passage=["A x.", "A x.", "B y.", None]), qa, "f.parquet")


def test_knowledge_mix_gives_qa_an_empty_think_and_keeps_trace_thinking(tiny_tokenizer, tiny_fmt):
    qa = pd.DataFrame({"problem_id": ["f0_p0"], "question": ["Who founded Velmora?"], "answer": ["Dran Kos"]})
    replay = pd.DataFrame({"problem_id": ["m1"], "question": ["9-3=?"], "think": ["9-3=6"], "answer": ["6"],
                           "source": ["teacher"]})
    mix = mix_knowledge(qa, replay)
    assert list(mix.think) == ["", "9-3=6"] and list(mix.source) == ["knowledge", "teacher"]
    assert tiny_fmt.response_text("", "Dran Kos").startswith(EMPTY_THINK)   # the paper's "<think> </think>" prefix
    assert tiny_fmt.response_text("9-3=6", "6").startswith("<think>\n9-3=6\n</think>")
    ids, labels = encode_sft(tiny_fmt, SFTExample("Who founded Velmora?", "", "Dran Kos"), 256)
    assert tiny_tokenizer.decode(ids).endswith(EMPTY_THINK + "<answer>Dran Kos</answer><|im_end|>")


def test_mean_token_nll_matches_a_direct_computation(tiny_model_dir, tiny_tokenizer, tiny_fmt):
    model = load_model(tiny_model_dir)
    p = tiny_fmt.prompt_ids("1+2=?")
    r = tiny_fmt.response_ids("1+2=3", "3")
    r2 = r[:5]
    got = mean_token_nll(model, [(p, r), (p, r2)], tiny_tokenizer.pad_token_id, batch_size=2)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([p + r])).logits[0].float(), -1)
    want = -sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(r)) / len(r)
    assert got[0] == pytest.approx(want, rel=1e-5)
    want2 = -sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(r2)) / len(r2)
    assert got[1] == pytest.approx(want2, rel=1e-5) and math.isfinite(got[1])
