"""Validation machinery for params.yaml, the only configuration of the pipeline.

A section is described by a schema of typed, range-checked fields (``graft.schema`` has them all). Unknown keys,
missing keys, wrong types and out-of-range values fail on load with one line naming the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable



class ParamsError(ValueError):
    """A value in params.yaml is missing, unknown, mistyped or out of range."""


REQUIRED = object()


@dataclass(frozen=True)
class Field:
    kind: type | tuple[type, ...]
    check: Callable[[Any], bool] | None = None
    rule: str = ""
    item: "Field | dict | None" = None  # schema of list items or of a nested section
    default: Any = REQUIRED             # a key that may be left out takes this value (validated like any other)


def positive(x: Any) -> bool:
    return x > 0


def nonneg(x: Any) -> bool:
    return x >= 0


def unit_open(x: Any) -> bool:
    return 0 <= x < 1


INT, NUM, STR, BOOL = int, (int, float), str, bool
POS_INT = Field(INT, positive, "> 0")
NONNEG_INT = Field(INT, nonneg, ">= 0")
POS_NUM = Field(NUM, positive, "> 0")
# every RNG a seed reaches takes it (torch, numpy, random, vLLM): a wider one fails deep inside a run
SEED = Field(INT, lambda x: 0 <= x < 2**32, "in [0, 2**32 - 1]")
DEVICES = ("auto", "cpu", "cuda")   # compute.device (graft.modeling.resolve_device)
DTYPE = Field(STR, lambda s: s in ("float32", "bfloat16", "float16"), "one of float32, bfloat16, float16")

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
            raise ParamsError(f"params.yaml: {path} must be a mapping (keys: {', '.join(spec)}), got "
                              f"{type(value).__name__} {value!r}")
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
    missing = [k for k in schema if k not in raw and not (isinstance(schema[k], Field)
                                                           and schema[k].default is not REQUIRED)]
    if missing:
        raise ParamsError(f"params.yaml: missing key {path}.{missing[0]}")
    return Section({k: _check_value(f"{path}.{k}", raw[k] if k in raw else schema[k].default, schema[k])
                    for k in schema})


def validate_sections(raw: dict, schema: dict[str, dict], only: bool = False) -> dict[str, Section]:
    """Validate the sections named in ``schema``; unless ``only``, any other top-level key is an error."""
    if not isinstance(raw, dict):
        raise ParamsError("params.yaml: top level must be a mapping of sections")
    if not only:
        unknown = sorted(set(raw) - set(schema))
        if unknown:
            raise ParamsError(f"params.yaml: unknown section {unknown[0]} (expected one of: {', '.join(schema)})")
    missing = [k for k in schema if k not in raw]
    if missing:
        raise ParamsError(f"params.yaml: missing section {missing[0]}")
    return {name: _check_section(name, raw[name], schema[name]) for name in schema}


def read_yaml(path: str | Path) -> dict:
    """params.yaml read exactly as DVC reads it (ruamel.yaml, safe, YAML 1.2): ``1e-3`` is a number, ``yes`` is a
    string, and a duplicated key is an error rather than a silent last-value-wins."""
    from ruamel.yaml import YAML
    from ruamel.yaml import YAMLError as RuamelError

    try:
        with open(path) as f:
            return YAML(typ="safe").load(f) or {}
    except RuamelError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ParamsError(f"{path} is not valid YAML (read as DVC reads it){where}: "
                          f"{' '.join(str(problem).split())}") from None
