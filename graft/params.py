"""Load and validate params.yaml: the only configuration of the pipeline.

Every section is described by a schema of typed, range-checked fields. Unknown keys, missing keys, wrong types and
out-of-range values fail on load with one line naming the key, long before any model is touched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import yaml


class ParamsError(ValueError):
    """A value in params.yaml is missing, unknown, mistyped or out of range."""


@dataclass(frozen=True)
class Field:
    kind: type | tuple[type, ...]
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    item: "Field | dict | None" = None  # schema of list items or of a nested section


def _positive(x: Any) -> bool:
    return x > 0


def _nonneg(x: Any) -> bool:
    return x >= 0


def _unit_open(x: Any) -> bool:
    return 0 <= x < 1


def _prob(x: Any) -> bool:
    return 0 <= x <= 1


INT, NUM, STR, BOOL = int, (int, float), str, bool
POS_INT = Field(INT, _positive, "> 0")
NONNEG_INT = Field(INT, _nonneg, ">= 0")
POS_NUM = Field(NUM, _positive, "> 0")
SEED = NONNEG_INT
DTYPE = Field(STR, lambda s: s in ("float32", "bfloat16", "float16"), "one of float32, bfloat16, float16")

MODEL_SHAPE = {
    "hidden_size": POS_INT,
    "intermediate_size": POS_INT,
    "num_hidden_layers": POS_INT,
    "num_attention_heads": POS_INT,
    "num_key_value_heads": POS_INT,
    "head_dim": POS_INT,
}

SCHEMA: dict[str, dict[str, Any]] = {
    "chat": {"thinking": Field(BOOL)},
    "models": {
        "pretrain_checkpoints": Field(list, item=Field(STR)),
        "base": Field(STR),
        "post": Field(STR),
        "aligner": Field(STR),
        "trust_remote_code": Field(BOOL),
    },
    "data": {
        "old_suites": Field(dict, item=Field(STR)),
        "hard_pool": Field(STR),
        "retention": Field(STR),
    },
    "generation": {
        "backend": Field(STR, lambda s: s in ("vllm", "hf"), "one of vllm, hf"),
        "dtype": DTYPE,
        "top_p": Field(NUM, lambda x: 0 < x <= 1, "in (0, 1]"),
        "batch_size": POS_INT,
        "max_model_len": POS_INT,
        "vllm_memory_fraction": Field(NUM, lambda x: 0 < x <= 1, "in (0, 1]"),
        "vllm_enforce_eager": Field(BOOL),
    },
    "world": {
        "seed": SEED,
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
        },
        "posttrain": {
            "steps": POS_INT,
            "batch_size": POS_INT,
            "lr": POS_NUM,
            "n_examples": POS_INT,
        },
        "eval_per_suite": POS_INT,
        "hard_pool_size": POS_INT,
        "retention_size": POS_INT,
    },
    "mine": {
        "k": POS_INT,
        "temperature": POS_NUM,
        "max_successes": NONNEG_INT,
        "heldout": POS_INT,
        "max_new_tokens": POS_INT,
        "seed": SEED,
    },
    "synthself": {"max_new_tokens": POS_INT},
    "finetune": {
        "donor": Field(STR),
        "source": Field(STR, lambda s: s in ("teacher", "synthself"), "one of teacher, synthself"),
        "lr": POS_NUM,
        "epochs": POS_INT,
        "batch_size": POS_INT,
        "max_len": POS_INT,
        "warmup_ratio": Field(NUM, _unit_open, "in [0, 1)"),
        "weight_decay": Field(NUM, _nonneg, ">= 0"),
        "betas": Field(list, lambda b: len(b) == 2 and all(0 <= x < 1 for x in b), "two values in [0, 1)",
                       item=Field(NUM)),
        "grad_clip": POS_NUM,
        "dtype": DTYPE,
        "seed": SEED,
    },
    "fisher": {
        "n_rollouts": POS_INT,
        "max_new_tokens": POS_INT,
        "temperature": POS_NUM,
        "seed": SEED,
    },
    "sweep": {
        "lams": Field(list, lambda v: len(v) > 0, "non-empty", item=Field(NUM, _positive, "> 0")),
        "rhos": Field(list, lambda v: len(v) > 0, "non-empty", item=Field(NUM, _unit_open, "in [0, 1)")),
    },
    "evaluate": {
        "n_samples": POS_INT,
        "temperature": POS_NUM,
        "pass_k": Field(list, lambda v: len(v) > 0, "non-empty", item=POS_INT),
        "max_new_tokens": POS_INT,
        "seed": SEED,
    },
}


class Section(dict):
    """A validated params section; keys read as attributes (``p.lr``) or items (``p["lr"]``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def _check_value(path: str, value: Any, spec: Any) -> Any:
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise ParamsError(f"params.yaml: {path} must be a mapping, got {type(value).__name__}")
        return _check_section(path, value, spec)
    assert isinstance(spec, Field)
    # bool is an int in Python; a flag written where a number is expected is a typo, not a 1.
    if isinstance(value, bool) and spec.kind is not BOOL:
        raise ParamsError(f"params.yaml: {path} must be {_kind_name(spec.kind)}, got a boolean")
    if not isinstance(value, spec.kind):
        raise ParamsError(f"params.yaml: {path} must be {_kind_name(spec.kind)}, got {type(value).__name__} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ParamsError(f"params.yaml: {path} must be finite, got {value!r}")
    if spec.item is not None:
        if isinstance(value, list):
            value = [_check_value(f"{path}[{i}]", v, spec.item) for i, v in enumerate(value)]
        elif isinstance(value, dict):
            value = Section({k: _check_value(f"{path}.{k}", v, spec.item) for k, v in value.items()})
    if spec.check is not None and not spec.check(value):
        raise ParamsError(f"params.yaml: {path} must be {spec.rule}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if kind == NUM:
        return "a number"
    return {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "a mapping"}.get(
        kind, str(kind))  # type: ignore[arg-type]


def _check_section(path: str, raw: dict, schema: dict) -> Section:
    unknown = sorted(set(raw) - set(schema))
    if unknown:
        raise ParamsError(f"params.yaml: unknown key {path}.{unknown[0]} (expected one of: {', '.join(schema)})")
    missing = [k for k in schema if k not in raw]
    if missing:
        raise ParamsError(f"params.yaml: missing key {path}.{missing[0]}")
    return Section({k: _check_value(f"{path}.{k}", raw[k], schema[k]) for k in schema})


def validate(raw: dict) -> dict[str, Section]:
    """Validate a whole params mapping; returns the sections as ``Section`` objects."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml: top level must be a mapping of sections")
    unknown = sorted(set(raw) - set(SCHEMA))
    if unknown:
        raise ParamsError(f"params.yaml: unknown section {unknown[0]} (expected one of: {', '.join(SCHEMA)})")
    missing = [k for k in SCHEMA if k not in raw]
    if missing:
        raise ParamsError(f"params.yaml: missing section {missing[0]}")
    out = {name: _check_section(name, raw[name], SCHEMA[name]) for name in SCHEMA}
    _check_cross(out)
    return out


def _check_cross(p: dict[str, Section]) -> None:
    if len(set(p["sweep"].lams)) != len(p["sweep"].lams):
        raise ParamsError("params.yaml: sweep.lams has a repeated value")
    if len(set(p["sweep"].rhos)) != len(p["sweep"].rhos):
        raise ParamsError("params.yaml: sweep.rhos has a repeated value")
    if not p["data"].old_suites:
        raise ParamsError("params.yaml: data.old_suites must name at least one old-task suite")
    for key in ("student", "aligner"):
        shape = p["world"][key]
        if shape.num_attention_heads % shape.num_key_value_heads:
            raise ParamsError(f"params.yaml: world.{key}.num_attention_heads must be a multiple of num_key_value_heads")


def load_all(path: str | Path = "params.yaml") -> dict[str, Section]:
    with open(path) as f:
        raw = yaml.safe_load(f)
    return validate(raw)


def load_params(*sections: str, path: str | Path = "params.yaml") -> Section | tuple[Section, ...]:
    """Validate the whole file (a typo anywhere fails every stage at once) and return the named sections."""
    allp = load_all(path)
    got = tuple(allp[s] for s in sections)
    return got[0] if len(got) == 1 else got
