"""The one chat-template function of the project.

Mining, rewriting, training, Fisher rollouts and evaluation all build their strings here, so student and teacher
prompts can never drift apart (a known bug class in OPSD code). ``CHAT_TEMPLATE_JINJA`` is the same template for
``tokenizer.apply_chat_template`` users; a test checks the two agree.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
EOS = "<|endoftext|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [EOS, PAD, IM_START, IM_END, THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE]

EMPTY_THINK = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


def render_prompt(question: str, thinking: bool) -> str:
    """The prompt up to where the model starts writing. Thinking off pre-fills an empty think block (Qwen3 style)."""
    head = f"{IM_START}user\n{question}{IM_END}\n{IM_START}assistant\n"
    return head if thinking else head + EMPTY_THINK


def render_response(think: str, answer: str, thinking: bool) -> str:
    """The assistant turn after ``render_prompt``, ending with the end-of-turn token."""
    body = f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}{IM_END}"
    if thinking:
        return f"{THINK_OPEN}\n{think}\n{THINK_CLOSE}\n\n{body}"
    return body


# Jinja for tokenizer_config.json; mirrors render_prompt/render_response for a single user turn.
CHAT_TEMPLATE_JINJA = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}"
    "{{- '<think>\\n\\n</think>\\n\\n' -}}"
    "{%- endif -%}"
    "{%- endif -%}"
)


@dataclass(frozen=True)
class ParsedResponse:
    think: str | None      # None when thinking mode was on and the think block never closed
    final: str             # text after the think block: the only place an answer may be read from
    answer: str | None     # content of the last <answer>...</answer> in ``final``


_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.S)


def parse_response(text: str, thinking: bool) -> ParsedResponse:
    """Split a generated assistant turn. An answer inside the think block never counts; an unclosed think is empty."""
    text = text.split(IM_END, 1)[0]
    if thinking:
        if THINK_CLOSE not in text:
            return ParsedResponse(think=None, final="", answer=None)
        think, final = text.split(THINK_CLOSE, 1)
        think = think.replace(THINK_OPEN, "", 1).strip()
    else:
        think, final = "", text
        if THINK_CLOSE in final:  # a pre-filled empty think block may be echoed by a backend
            final = final.split(THINK_CLOSE, 1)[1]
    found = _ANSWER_RE.findall(final)
    return ParsedResponse(think=think, final=final.strip(), answer=found[-1].strip() if found else None)
