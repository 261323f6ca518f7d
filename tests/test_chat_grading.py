import pytest

from graft.chat import parse_response, render_prompt, render_response
from graft.grading import grade_fact, grade_math, math_equal


@pytest.mark.parametrize("thinking", [True, False])
def test_one_template_matches_the_jinja_template(tiny_tokenizer, thinking):
    msgs = [{"role": "user", "content": "12+7=?"}]
    jinja = tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True,
                                               enable_thinking=thinking)
    assert jinja == render_prompt("12+7=?", thinking)


def test_parse_roundtrip():
    text = render_response("2+7=9 1+0=1", "19", True)
    r = parse_response(text, True)
    assert (r.think, r.answer) == ("2+7=9 1+0=1", "19")


@pytest.mark.parametrize("text, gold, ok", [
    ("<think>\nx\n</think>\n\n<answer>45</answer>", "45", True),
    ("<think>\nx\n</think>\n\n<answer>46</answer>", "45", False),
    ("<think>\n<answer>45</answer>\n</think>\n\nthe end", "45", False),          # answer only inside thinking
    ("<think>\n<answer>45</answer> still thinking", "45", False),                 # think never closes
    ("", "45", False),                                                             # empty output
    ("<think>\n</think>\n<answer></answer>", "45", False),                         # empty answer
    ("<think>\n</think>\n<answer>1/2</answer>", "0.5", True),                      # equivalent forms
    ("<think>\n</think>\n<answer>\\frac{3}{4}</answer>", "3/4", True),             # latex fraction
    ("<think>\n</think>\n<answer>\\boxed{\\boxed{12}}</answer>", "12", True),      # nested boxes
    ("<think>\n</think>\n<answer>3</answer> <answer>4</answer>", "4", True),       # last tag wins
    ("<think>\n</think>\n<answer>45</answer><|im_end|><answer>9</answer>", "45", True),  # nothing after end of turn
])
def test_grade_math_edge_cases(text, gold, ok):
    assert grade_math(text, gold, thinking=True)[1] is ok


def test_non_thinking_mode_reads_whole_turn():
    assert grade_math("<answer>7</answer>", "7", thinking=False)[1]


def test_math_equal_is_not_lenient_on_prefixes():
    assert not math_equal("4", "45")
    assert not math_equal("", "0")


def test_fact_exact_match_after_normalisation():
    assert grade_fact("<think>\n</think>\n<answer> Velmora  City. </answer>", "velmora city", True)[1]
    assert not grade_fact("<think>\n</think>\n<answer>Velmora</answer>", "velmora city", True)[1]
