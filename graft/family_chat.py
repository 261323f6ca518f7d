"""The embedded toy family's own chat format: its special tokens and the template its tokenizer ships.

Only the world builder writes chat strings with ``render_prompt``/``render_response`` (its pretraining and
post-training corpora, before the family's tokenizer exists); every other stage renders prompts through the
tokenizer's own chat template (``graft.chat.ChatFormat``), which for this family is ``CHAT_TEMPLATE_JINJA``. A test
checks the two agree.
"""
from __future__ import annotations

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
