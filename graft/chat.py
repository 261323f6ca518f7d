"""Prompts and training targets in the model's own chat format, and reading answers back out of what it writes.

Every stage (mining, STaR, rewriting, finetuning, OPSD, Fisher rollouts, evaluation) turns a question into prompt
ids and a (think, answer) pair into response ids here, through ``tokenizer.apply_chat_template``: the model's system
turn, role headers, BOS and end-of-turn tokens are whatever its template and tokenizer say. Student and teacher
prompts (OPSD) come from the same ``prompt_ids``.

Data is never control: a question, trace or fact that contains ``<|im_end|>``, ``<answer>`` or Qwen3's ``<think>`` is
tokenized as plain text, so it can neither end the turn, open or close a think block, nor inject an answer. The
template is rendered with placeholders for message contents; when no added token falls inside a content span the
whole string's tokens are used as they are (exactly what the model saw in training); otherwise the content spans are
tokenized apart, each as if the tokenizer had no added tokens (``ChatFormat.data_ids``).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from graft.registry import ANSWER_TAG, FORMATS, SWITCHES


@dataclass(frozen=True)
class ChatSpec:
    """params.yaml ``chat``.

    thinking: the model reasons in a think block before answering.
    thinking_switch: ``template``: the chat template takes ``enable_thinking`` (Qwen3, the embedded family);
        ``prefill``: it does not, so thinking off pre-fills an empty think block after the generation prompt;
        ``none``: no switch (thinking off only means no think block is asked for or trained).
    think_markers: the (open, close) strings of the think block, or () for a model that writes none (its reasoning,
        if any, is plain text before the answer, and the whole turn is read for the answer).
    system_prompt: a system turn; "" leaves the template's own default (e.g. SmolLM2's) in place.
    """
    thinking: bool
    thinking_switch: str = "template"
    think_markers: tuple[str, ...] = ("<think>", "</think>")
    system_prompt: str = ""

    def __post_init__(self) -> None:
        if self.thinking_switch not in SWITCHES:
            raise ValueError(f"chat.thinking_switch must be one of {SWITCHES}, got {self.thinking_switch!r}")
        if len(self.think_markers) not in (0, 2):
            raise ValueError("chat.think_markers must be [open, close] or []")

    @classmethod
    def from_params(cls, p) -> "ChatSpec":
        return cls(p.thinking, p.thinking_switch, tuple(p.think_markers), p.system_prompt)


@dataclass(frozen=True)
class AnswerFormat:
    """How the model writes its final answer, and the instruction appended to each question that asks for it.

    answer_tag: ``<answer>...</answer>`` (the embedded family); boxed: ``\\boxed{...}`` (what math models write);
    final_line: the last non-empty line of the turn, as it is (facts, short answers)."""
    format: str = "answer_tag"
    instruction: str = ""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"answer format must be one of {FORMATS}, got {self.format!r}")

    def render(self, answer: str) -> str:
        if self.format == "answer_tag":
            return f"{ANSWER_TAG[0]}{answer}{ANSWER_TAG[1]}"
        if self.format == "boxed":
            return f"\\boxed{{{answer}}}"
        return answer

    def wrapper(self) -> tuple[str, str]:
        """The text before and after the answer in ``render`` (structure, not data)."""
        head, _, tail = self.render("\0").partition("\0")
        return head, tail

    def before_answer(self, text: str) -> str:
        """The text before the final answer: the reasoning of a model that writes no think block."""
        if self.format == "final_line":
            lines = text.rstrip().splitlines()
            return "\n".join(lines[:-1]).strip()
        cut = text.rfind(ANSWER_TAG[0] if self.format == "answer_tag" else "\\boxed{")
        return text[:cut].strip() if cut >= 0 else text.strip()

    def extract(self, final: str) -> str | None:
        if self.format == "answer_tag":
            found = _ANSWER_RE.findall(final)
            return found[-1].strip() if found else None
        if self.format == "boxed":
            return last_boxed(final)
        lines = [ln.strip() for ln in final.splitlines() if ln.strip()]
        return lines[-1] if lines else None


_ANSWER_RE = re.compile(re.escape(ANSWER_TAG[0]) + r"(.*?)" + re.escape(ANSWER_TAG[1]), re.S)


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces balanced); None if there is none or it never closes."""
    start = text.rfind("\\boxed{")
    while start >= 0:
        depth, i = 0, start + len("\\boxed")
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i + 1: j].strip()
        start = text.rfind("\\boxed{", 0, start)  # unclosed: an earlier complete one still counts
    return None


@dataclass(frozen=True)
class ParsedResponse:
    think: str | None      # None when a think block was expected and never closed
    final: str             # text after the think block: the only place an answer may be read from
    answer: str | None     # the answer the format extracts from ``final``


def parse_response(text: str, chat: ChatSpec, fmt: AnswerFormat) -> ParsedResponse:
    """Split a generated assistant turn (generation stops at the end of turn, so nothing follows it). An answer
    inside the think block never counts; an unclosed think block has no final part."""
    if not chat.think_markers:  # no think block: whatever precedes the answer is the reasoning
        return ParsedResponse(think=fmt.before_answer(text), final=text.strip(), answer=fmt.extract(text))
    open_, close = chat.think_markers
    if chat.thinking:
        if close not in text:
            return ParsedResponse(think=None, final="", answer=None)
        think, final = text.split(close, 1)
        think = think.replace(open_, "", 1).strip()
    else:
        think, final = "", text
        if close in final:  # a pre-filled empty think block may be echoed by a backend
            final = final.split(close, 1)[1]
    return ParsedResponse(think=think, final=final.strip(), answer=fmt.extract(final))


def _sentinel(i: int) -> str:
    # private-use characters: no template or tokenizer gives them meaning, and no data set contains them
    return f"\ue000graft{i}\ue001"


def generation_stop_ids(model_dir: str | Path | None) -> list[int]:
    """End-of-sequence ids a model directory's ``generation_config.json`` names (an int or a list)."""
    if model_dir is None:
        return []
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return []
    try:
        eos = json.loads(path.read_text()).get("eos_token_id")
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if eos is None:
        return []
    return [int(x) for x in (eos if isinstance(eos, list) else [eos])]


class ChatFormat:
    """A tokenizer's chat template bound to the chat and answer settings: prompt ids, response ids, stop ids."""

    def __init__(self, tokenizer, chat: ChatSpec, answer: AnswerFormat, model_dir: str | Path | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"{model_dir or 'tokenizer'}: the tokenizer has no chat template; graft renders every "
                             "prompt with the model's own template (add one to its tokenizer_config.json)")
        self.tokenizer, self.chat, self.answer = tokenizer, chat, answer
        self._added = {i for i in tokenizer.added_tokens_decoder}
        self._plain = None   # the tokenizer without its added tokens, built on the first data that needs it
        plain = tokenizer("a", add_special_tokens=True)["input_ids"]
        bare = tokenizer("a", add_special_tokens=False)["input_ids"]
        bos = tokenizer.bos_token_id
        # BOS only where the tokenizer itself adds it to plain text (Gemma, Llama); ChatML models name one but don't
        self.bos_id: int | None = bos if bos is not None and plain[:1] == [bos] and bare[:1] != [bos] else None
        # the text the template writes after an assistant message: its end-of-turn token comes first
        turn = self._render([("user", _sentinel(0)), ("assistant", _sentinel(1))], generation_prompt=False)
        after = turn.split(_sentinel(1), 1)[1] if _sentinel(1) in turn else ""
        after_ids = tokenizer(after, add_special_tokens=False)["input_ids"]
        eot = next((i for i in after_ids if i in self._added), None)
        stops: list[int] = []
        for i in [eot, tokenizer.eos_token_id, *generation_stop_ids(model_dir)]:
            if i is not None and i not in stops:
                stops.append(i)
        if not stops:
            raise ValueError(f"{model_dir or 'tokenizer'}: no end-of-turn or EOS token: generation could not stop")
        self.stop_ids: tuple[int, ...] = tuple(stops)
        # a training target ends with the template's end-of-turn token (not what the template writes after it)
        self.end_of_turn: list[int] = (after_ids[: after_ids.index(eot) + 1] if eot is not None
                                       else [self.stop_ids[0]])
        pad = tokenizer.pad_token_id
        self.pad_id: int = pad if pad is not None else self.stop_ids[0]

    def _render(self, messages: Sequence[tuple[str, str]], generation_prompt: bool) -> str:
        kwargs = {"enable_thinking": self.chat.thinking} if self.chat.thinking_switch == "template" else {}
        msgs = [{"role": r, "content": c} for r, c in messages]
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt,
                                                  **kwargs)

    def _encode(self, pieces: Sequence[tuple[str, bool]]) -> list[int]:
        """Ids of the concatenated pieces, (text, is_data). Tokens of the whole string where no added token falls
        inside data; otherwise each piece alone, data with special tokens split into plain text."""
        text = "".join(t for t, _ in pieces)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        spans, pos = [], 0
        for t, is_data in pieces:
            if is_data and t:
                spans.append((pos, pos + len(t)))
            pos += len(t)
        hostile = any(i in self._added and any(a < e and s < b for a, b in spans)
                      for i, (s, e) in zip(enc["input_ids"], enc["offset_mapping"]))
        if not hostile:
            return list(enc["input_ids"])
        ids: list[int] = []
        for t, is_data in pieces:
            if t:
                ids += self.data_ids(t) if is_data else self.tokenizer(t, add_special_tokens=False)["input_ids"]
        return ids

    def data_ids(self, text: str) -> list[int]:
        """``text`` as plain data: the ids the tokenizer gives it when no added token is in it, otherwise the ids it
        would give if it had no added tokens at all. Not ``split_special_tokens``: that splits only the tokens marked
        special, and Qwen3's ``<think>`` and ``</think>``, Qwen2.5's ``<tool_call>`` are added tokens marked
        non-special, which the tokenizer matches in any text."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not any(i in self._added for i in ids):
            return list(ids)
        if self._plain is None:
            from tokenizers import Tokenizer

            spec = json.loads(self.tokenizer.backend_tokenizer.to_str())
            # the same normalizer, pre-tokenizer and model; no added-token matching, no padding or truncation
            spec.update(added_tokens=[], padding=None, truncation=None)
            self._plain = Tokenizer.from_str(json.dumps(spec))
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def user_content(self, question: str, instruction: str | None = None) -> str:
        instruction = self.answer.instruction if instruction is None else instruction
        return f"{question}\n\n{instruction}" if instruction else question

    def prompt_ids(self, question: str, instruction: str | None = None) -> list[int]:
        """The prompt up to where the model starts writing: system turn (if set), the question with the answer
        instruction, the generation prompt, and an empty think block when thinking is off and must be pre-filled."""
        contents = ([("system", self.chat.system_prompt)] if self.chat.system_prompt else [])
        contents.append(("user", self.user_content(question, instruction)))
        text = self._render([(r, _sentinel(i)) for i, (r, _) in enumerate(contents)], generation_prompt=True)
        pieces: list[tuple[str, bool]] = []
        for i, (_, content) in enumerate(contents):
            head, sep, text = text.partition(_sentinel(i))
            if not sep:
                raise ValueError("the chat template changes message contents (a placeholder was not found in its "
                                 "output); graft cannot keep data apart from control tokens with it")
            pieces += [(head, False), (content, True)]
        pieces.append((text, False))
        if not self.chat.thinking and self.chat.thinking_switch == "prefill" and self.chat.think_markers:
            pieces.append((f"{self.chat.think_markers[0]}\n\n{self.chat.think_markers[1]}\n\n", False))
        ids = self._encode(pieces)
        if self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id] + ids
        return ids

    def response_pieces(self, think: str, answer: str) -> list[tuple[str, bool]]:
        head, tail = self.answer.wrapper()
        final = [(head, False), (answer, True), (tail, False)]
        if not self.chat.thinking:
            return final
        if not self.chat.think_markers:   # reasoning as plain text before the answer
            return ([(think, True), ("\n\n", False)] if think else []) + final
        open_, close = self.chat.think_markers
        return [(f"{open_}\n", False), (think, True), (f"\n{close}\n\n", False)] + final

    def response_ids(self, think: str, answer: str) -> list[int]:
        """The assistant turn after ``prompt_ids``: think block (when thinking), the formatted answer, end of turn."""
        return self._encode(self.response_pieces(think, answer)) + self.end_of_turn

    def response_text(self, think: str, answer: str) -> str:
        """What ``response_ids`` holds before the end of turn, as text (the form generations are parsed in)."""
        return "".join(t for t, _ in self.response_pieces(think, answer))

    def parse(self, text: str) -> ParsedResponse:
        return parse_response(text, self.chat, self.answer)


def answer_format(answer_p, suite=None) -> AnswerFormat:
    """params.yaml ``answer``, with an old suite's own format and instruction where it sets them."""
    fmt = (suite.format if suite is not None and suite.format else answer_p.format)
    instruction = (suite.instruction if suite is not None and suite.instruction else answer_p.instruction)
    return AnswerFormat(fmt, instruction)


def open_chat(model_dir: str | Path, chat_p, answer_p, trust_remote_code: bool = False) -> ChatFormat:
    """The ChatFormat of a model directory's tokenizer under params.yaml ``chat`` and ``answer``."""
    from graft.modeling import load_tokenizer

    return ChatFormat(load_tokenizer(model_dir, trust_remote_code), ChatSpec.from_params(chat_p),
                      answer_format(answer_p), model_dir)
