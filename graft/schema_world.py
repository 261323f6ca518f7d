"""params.yaml schema of the one section the `world` stage reads (``world``).

Kept apart from the other sections' schema (``graft.schema``) so that the world stage, whose committed outputs take
minutes to rebuild, depends only on the code that can change them.
"""
from __future__ import annotations

from pathlib import Path

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

WORLD_SCHEMA: dict[str, dict] = {
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
    for key in ("student", "aligner"):
        shape = p["world"][key]
        if shape.num_attention_heads % shape.num_key_value_heads:
            raise ParamsError(f"params.yaml: world.{key}.num_attention_heads must be a multiple of num_key_value_heads")


def load_world_params(path: str | Path = "params.yaml") -> dict[str, Section]:
    """The world stage's section only (the other stages validate the whole file): no other section's schema is
    part of the world's code, so pointing the pipeline at your own model and data never rebuilds it."""
    out = validate_sections(read_yaml(path), WORLD_SCHEMA, only=True)
    check_world(out)
    return out
