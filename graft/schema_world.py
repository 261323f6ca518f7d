"""params.yaml schema of the sections the `world` stage reads (chat, models, data, world).

Kept apart from the other sections' schema (``graft.schema``) so that the world stage, whose committed outputs take
minutes to rebuild, depends only on the code that can change them.
"""
from __future__ import annotations

import re
from pathlib import Path

from graft.chat import FORMATS, SWITCHES
from graft.grading import GRADERS
from graft.params import (BOOL, INT, NONNEG_INT, NUM, POS_INT, POS_NUM, SEED, STR, Field, ParamsError, Section,
                          read_yaml, validate_sections)

MODEL_SHAPE = {
    "hidden_size": POS_INT,
    "intermediate_size": POS_INT,
    "num_hidden_layers": POS_INT,
    "num_attention_heads": POS_INT,
    "num_key_value_heads": POS_INT,
    "head_dim": POS_INT,
}

ANSWER_FORMAT = Field(STR, lambda s: s in FORMATS, f"one of {', '.join(FORMATS)}")
SUITE = {
    "path": Field(STR),
    "grader": Field(STR, lambda s: s in GRADERS, f"one of {', '.join(GRADERS)}", default="math"),
    # the suite's own answer format and instruction; "" takes the answer section's
    "format": Field(STR, lambda s: s == "" or s in FORMATS, f"\"\" or one of {', '.join(FORMATS)}", default=""),
    "instruction": Field(STR, default=""),
}

WORLD_SCHEMA: dict[str, dict] = {
    "chat": {
        "thinking": Field(BOOL),
        # how thinking is switched off: template (it takes enable_thinking) | prefill (an empty think block after
        # the generation prompt) | none
        "thinking_switch": Field(STR, lambda s: s in SWITCHES, f"one of {', '.join(SWITCHES)}"),
        # [open, close] of the think block, or [] for a model that writes none
        "think_markers": Field(list, lambda v: len(v) in (0, 2) and all(v), "[open, close] (non-empty) or []",
                               item=Field(STR)),
        "system_prompt": Field(STR),            # "" keeps the template's own default system turn
    },
    "models": {
        "pretrain_checkpoints": Field(list, item=Field(STR)),
        "base": Field(STR),
        "post": Field(STR),
        "aligner": Field(STR),
        "trust_remote_code": Field(BOOL),
    },
    "data": {
        # name -> a Parquet table (``problems`` schema) and how to grade it
        "old_suites": Field(dict, item=SUITE),
        "hard_pool": Field(STR),
        "retention": Field(STR),
    },
    "world": {
        "seed": SEED,
        # the family's chat turns think (set chat.thinking to match when evaluating the family); apart from chat so
        # that a real model's chat settings never rebuild the world
        "thinking": Field(BOOL),
        "tokenizer_vocab_size": Field(INT, lambda x: x >= 300, ">= 300"),
        "corpus_problems": POS_INT,
        "student": MODEL_SHAPE,
        "aligner": MODEL_SHAPE,
        "max_position_embeddings": POS_INT,
        "pretrain": {
            "steps": POS_INT,
            "aligner_steps": POS_INT,
            "batch_size": POS_INT,
            "seq_len": POS_INT,
            "lr": POS_NUM,
            "checkpoints": Field(list, item=Field(NUM, lambda x: 0 < x < 1, "in (0, 1)")),
            # share of the pretraining texts that are chat turns (student style) of these suites: the base model
            # already knows the chat format, so post-training narrows rather than teaches (paper §3)
            "chat_fraction": Field(NUM, lambda x: 0 <= x < 1, "in [0, 1)"),
            "chat_suites": Field(list, lambda v: len(set(v)) == len(v) and set(v) <= {"add", "reverse", "sub"},
                                 "distinct names among add, reverse, sub", item=Field(STR)),
            # facts about invented entities (every relation, every phrasing, chat turns with an empty think
            # block), each turn fact_repeats times: the base learns the language of facts, so that knowledge
            # injection only has to add entities; names never collide with the injected ones
            "fact_entities": NONNEG_INT,
            "fact_repeats": POS_INT,
        },
        "posttrain": {
            "steps": POS_INT,
            "batch_size": POS_INT,
            "lr": POS_NUM,
            # the aligner learns a new skill (rewriting) in post-training, so it needs its own, larger step
            "aligner_lr": POS_NUM,
            "n_examples": POS_INT,
        },
        "eval_per_suite": POS_INT,
        "hard_pool_size": POS_INT,
        "retention_size": POS_INT,
    },
}


def check_world(p: dict[str, Section]) -> None:
    if not p["data"].old_suites:
        raise ParamsError("params.yaml: data.old_suites must name at least one old-task suite")
    for key in ("student", "aligner"):
        shape = p["world"][key]
        if shape.num_attention_heads % shape.num_key_value_heads:
            raise ParamsError(f"params.yaml: world.{key}.num_attention_heads must be a multiple of num_key_value_heads")
    check_plain_names("data.old_suites", p["data"].old_suites)


PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def check_plain_names(key: str, names) -> None:
    """Names that become file names and params keys (suites, aligners): no separators, no dots, nothing hidden."""
    for name in names:
        if not isinstance(name, str) or not PLAIN_NAME.fullmatch(name):
            raise ParamsError(f"params.yaml: {key} key {name!r} must be a plain name (letters, digits, _ and -: it "
                              "becomes a file name and a params key)")


def load_world_params(path: str | Path = "params.yaml") -> dict[str, Section]:
    """The world stage's sections only (the other stages validate the whole file)."""
    out = validate_sections(read_yaml(path), WORLD_SCHEMA, only=True)
    check_world(out)
    return out
