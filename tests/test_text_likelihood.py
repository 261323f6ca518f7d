"""Plain-text old suites (grader perplexity): the scores against a one-passage-at-a-time reference, tokenization as
data, and the table they are read from."""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from graft.inputs import InputSpec, read_input
from graft.modeling import load_model
from graft.tables import TableError
from graft.tasks import make_problem, raw_text
from graft.text_likelihood import brute_force_scores, check_texts, text_ids, text_scores


@pytest.fixture(scope="module")
def passages(tiny_fmt):
    rng = random.Random(3)
    texts = [raw_text(make_problem(s, rng)) for s in ("add", "sub", "reverse") for _ in range(3)]
    return [text_ids(tiny_fmt, t) for t in texts]


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_scores_equal_the_one_passage_reference_whatever_the_batching(tiny_model_dir, passages, tiny_fmt, chunk):
    model = load_model(tiny_model_dir, "float32")
    assert len({len(p) for p in passages}) > 1   # padding is exercised
    got = text_scores(model, passages, tiny_fmt.pad_id, chunk)
    ref = brute_force_scores(model, passages)
    assert got["tokens"] == ref["tokens"] == sum(len(p) - 1 for p in passages)
    assert got["texts"] == len(passages)
    assert got["nll"] == pytest.approx(ref["nll"], rel=1e-5)
    assert got["perplexity"] == pytest.approx(math.exp(got["nll"]))
    assert got["token_accuracy"] == ref["token_accuracy"]
    assert got["perplexity"] > 1


class NextIsPlusOne(torch.nn.Module):
    """Logits that make token t + 1 (mod V) the most likely after t, as a causal LM's output."""

    def __init__(self, vocab: int = 11):
        super().__init__()
        self.table = torch.nn.Parameter(torch.roll(torch.eye(vocab) * 3.0, 1, dims=1))

    def forward(self, input_ids, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


def test_token_accuracy_counts_the_tokens_the_model_ranks_first():
    model = NextIsPlusOne()
    got = text_scores(model, [[1, 2, 3, 5], [4, 5], [9, 10, 0, 0]], pad_id=0, chunk=2)
    # right: 1->2, 2->3, 4->5, 9->10, 10->0; wrong: 3->5, 0->0
    assert got["tokens"] == 7 and got["token_accuracy"] == pytest.approx(5 / 7)
    assert got == brute_force_scores(model, [[1, 2, 3, 5], [4, 5], [9, 10, 0, 0]]) | {"nll": got["nll"],
                                                                                        "perplexity": got["perplexity"]}


def test_a_changed_model_changes_the_scores(tiny_model_dir, passages, tiny_fmt):
    model = load_model(tiny_model_dir, "float32")
    before = text_scores(model, passages, tiny_fmt.pad_id)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(0.5)
    after = text_scores(model, passages, tiny_fmt.pad_id)
    assert after["nll"] != before["nll"]


def test_special_token_strings_in_a_passage_stay_text(tiny_fmt):
    tok = tiny_fmt.tokenizer
    special = next(t for t in tok.added_tokens_decoder.values() if t.special).content
    ids = text_ids(tiny_fmt, f"x {special} y")
    assert not set(ids) & set(tok.added_tokens_decoder), "a control token was parsed out of data"
    plain = text_ids(tiny_fmt, "12+3=15")
    assert plain == tok("12+3=15", add_special_tokens=False)["input_ids"]


def test_bos_comes_first_where_the_tokenizer_uses_one(tiny_fmt):
    with_bos = SimpleNamespace(data_ids=tiny_fmt.data_ids, bos_id=7)
    assert text_ids(with_bos, "12+3") == [7] + text_ids(tiny_fmt, "12+3")


def test_passages_too_short_or_too_long_are_refused_with_their_row():
    check_texts([[1, 2], [1, 2, 3]], 3, "t.parquet")
    with pytest.raises(ValueError, match=r"t.parquet: row 1 has 1 token"):
        check_texts([[1, 2], [5]], 8, "t.parquet")
    with pytest.raises(ValueError, match=r"t.parquet: row 0 is 4 tokens, longer than generation.max_model_len \(3\)"):
        check_texts([[1, 2, 3, 4]], 3, "t.parquet")


def test_a_text_table_gets_ids_from_its_text_and_refuses_duplicates(tmp_path):
    path = tmp_path / "texts.jsonl"
    pd.DataFrame({"body": ["The river ran north.", "It rained all day."]}).to_json(path, orient="records", lines=True)
    table = read_input(InputSpec(str(path), columns={"text": "body"}), "texts")
    assert list(table.columns) == ["text_id", "text"] and table.text_id.nunique() == 2
    pd.DataFrame({"text": ["Same.", "Same."]}).to_json(path, orient="records", lines=True)
    with pytest.raises(TableError, match="rows 0 and 1 have the same text"):
        read_input(InputSpec(str(path)), "texts")
    pd.DataFrame({"text": ["One.", " "]}).to_json(path, orient="records", lines=True)
    with pytest.raises(TableError, match="column 'text' is blank"):
        read_input(InputSpec(str(path)), "texts")
