"""Continual learning as a chain: step k's update lands on the model step k-1 made (params.yaml ``chain``).

Each method is its own chain of models, one model directory per step (``models/chain/<method>/<step>``), beside a
state file (``<step>.json``: the directory and its content hash) that the next step's stages depend on. The root of
every chain is ``models/chain/<method>/post.json``, naming models.post: a step's ``after`` (``post`` for the first)
spells the path of the state it lands on, so dvc.yaml needs no arithmetic on step positions.

    graft, graft_<kind>:  model_k = model_{k-1} + lam_k * M_k(delta_k),  delta_k = donor_ft_k - donor, M_k masked by the
                          retention Fisher of model_{k-1} (the unmasked and random chains need none)
    sft:                  model_k = SFT of model_{k-1} on step k's data
    sft_merge:            model_k = model_{k-1} + lam_k * (SFT(model_{k-1}) - model_{k-1})
    joint:                SFT of post on the union of every step's data (the reference; one model)

The metrics of a chain (``accuracy_matrix``, ``backward_transfer``) are the continual-learning suites' (TRACE, GEM):
R[i][j] is the model after step i on task j's held-out suite, i = 0 the post model.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import pandas as pd

from graft.registry import FISHER_MASKS, GRAFT, SFT_MERGE, SWEPT_MASKS, masked_method

ROOT = "post"                                  # the name every chain starts from (no step may take it)
GRAFT_CHAINS = (GRAFT, *map(masked_method, SWEPT_MASKS))   # graft, graft_diagonal, graft_kfac, graft_random
FISHER_CHAINS = tuple(map(masked_method, FISHER_MASKS))     # chains whose mask reads the Fisher of their own model
SFT_CHAINS = ("sft", SFT_MERGE)
JOINT = "joint"
CHAINS = (*GRAFT_CHAINS, *SFT_CHAINS)          # methods with one model per step
DATA, MODELS, TENSORS = Path("data/chain"), Path("models/chain"), Path("tensors/chain")
REPORTS = Path("reports/chain")
SCORES = ["method", "after", "task", "pass@1", "metrics"]   # a chain report's scores table (metrics: JSON of all)


@dataclass(frozen=True)
class Step:
    name: str
    after: str           # the step before it, ``post`` for the first
    source: str          # one of graft's sources or a key of data.offpolicy
    heldout: Mapping     # the held-out suite of a data.offpolicy source ({} for graft's own sources)
    lr: float
    epochs: int
    rho: float
    lam: float


def _step(name: str, s: Mapping) -> Step:
    return Step(name, s.after, s.source, s.heldout, float(s.lr), int(s.epochs), float(s.rho), float(s.lam))


def chain_steps(p: Mapping) -> list[Step]:
    """The steps of params ``chain.steps`` in order (schema.check_chain has checked the ``after`` links)."""
    return [_step(name, s) for name, s in p["chain"].steps.items()]


def find_step(p: Mapping, name: str) -> Step:
    """One step's params, read alone: a stage of step S declares only S's keys."""
    steps = p["chain"].steps
    if name not in steps:
        raise KeyError(f"--step {name!r} is not a key of params.yaml chain.steps {sorted(steps)}")
    return _step(name, steps[name])


def params_and_step() -> tuple[dict, Step]:
    """For a stage whose one argument is ``--step``: the validated params and that step (an unknown name is refused,
    naming the keys there are)."""
    import argparse

    from graft.schema import load_all

    ap = argparse.ArgumentParser(description="one chain step (see the stage's docstring)")
    ap.add_argument("--step", required=True, help="a key of chain.steps")
    name = ap.parse_args().step
    allp = load_all()
    return allp, find_step(allp, name)


def train_table(step: str) -> Path:
    return DATA / step / "train.parquet"


def heldout_table(step: str) -> Path:
    return DATA / step / "heldout.parquet"


def retention_table(step: str) -> Path:
    return DATA / step / "retention.parquet"


def state_file(method: str, step: str) -> Path:
    """The state of ``method``'s chain after ``step`` (``post``: its root)."""
    return MODELS / method / f"{step}.json"


def model_dir(method: str, step: str) -> Path:
    return MODELS / method / step


def delta_dir(step: str) -> Path:
    """donor_ft - donor of one step: shared by every graft chain (the donor never changes)."""
    return TENSORS / "delta" / step


def masked_dir(kind: str, step: str) -> Path:
    return TENSORS / "masked" / kind / step


def fisher_dir(method: str, step: str) -> Path:
    """The retention Fisher of ``method``'s model before ``step`` (the model the step lands on)."""
    return TENSORS / "fisher" / method / step


def update_dir(method: str, step: str) -> Path:
    """What a graft chain adds at ``step``, before lam: the delta, or its mask."""
    if method == GRAFT:
        return delta_dir(step)
    kind = method[len(GRAFT) + 1:]
    if kind not in SWEPT_MASKS:
        raise ValueError(f"{method} is not a graft chain ({', '.join(GRAFT_CHAINS)})")
    return masked_dir(kind, step)


def write_state(path: Path, model: str | Path, sha256: str) -> None:
    """A chain state: the model directory and its content hash (the next step's stages depend on this file)."""
    from graft.atomic import write_json

    write_json(path, {"model": str(model), "sha256": sha256})


def read_state(path: str | Path, memo: dict[str, str] | None = None) -> str:
    """The model directory a state names, after checking it still holds the bytes the state was written with."""
    from graft.hashing import content_hash

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no chain state; run the stage that writes it (dvc repro)")
    rec = json.loads(path.read_text())
    model = rec["model"]
    if not Path(model).is_dir():
        raise FileNotFoundError(f"{path} names {model}, which is missing (dvc checkout brings it back)")
    if content_hash(model, memo) != rec["sha256"]:
        raise ValueError(f"{path}: {model} no longer holds the weights this state was written with; rerun its stage "
                         "(dvc repro)")
    return model


def interleave(groups: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """Rows of every group taken in turn (first rows of each, then second rows, ...), so the first n rows share n
    between the groups as evenly as they can (the Fisher takes its prompts from the top of the table)."""
    order = []
    longest = max((len(g) for g in groups), default=0)
    for i in range(longest):
        order += [g.iloc[i] for g in groups if i < len(g)]
    cols = list(groups[0].columns) if groups else []
    return pd.DataFrame(order, columns=cols).reset_index(drop=True)


# -- the continual-learning metrics: R[i][j], i = 0 (post) .. T, j = 1 .. T -------------------------------------------

def accuracy_matrix(scores: Mapping[tuple[int, int], float], n_steps: int) -> list[list[float | None]]:
    """R as a list of rows (post first); an entry never measured is None."""
    return [[scores.get((i, j)) for j in range(1, n_steps + 1)] for i in range(n_steps + 1)]


def backward_transfer(r: Sequence[Sequence[float | None]]) -> float | None:
    """Mean over earlier tasks j < T of R[T][j] - R[j][j] (GEM's BWT: negative is forgetting); None for one step."""
    t = len(r) - 1
    diffs = [r[t][j - 1] - r[j][j - 1] for j in range(1, t) if r[t][j - 1] is not None and r[j][j - 1] is not None]
    return sum(diffs) / len(diffs) if diffs else None


def final_average(r: Sequence[Sequence[float | None]]) -> float | None:
    """Mean of the last row over every task: what the chain's final model knows of all of them."""
    last = [x for x in r[-1] if x is not None]
    return sum(last) / len(last) if len(last) == len(r[-1]) and last else None


def flat_cosine(a: Mapping[str, "object"], b: Mapping[str, "object"]) -> tuple[float, float, float]:
    """<a, b>, |a|^2, |b|^2 over every tensor the two hold (fp64 sums of fp32 tensors)."""
    dot = na = nb = 0.0
    for name in a:
        x, y = a[name].double(), b[name].double()   # type: ignore[attr-defined]
        dot += float((x * y).sum())
        na += float((x * x).sum())
        nb += float((y * y).sum())
    return dot, na, nb


def shared_questions(train: pd.DataFrame, heldout: pd.DataFrame) -> list[tuple[int, str]]:
    """(row, problem_id) of every training row whose question is one of ``heldout``'s in the canonical form
    (graft.canonical): across tasks only the question is compared, since two tables' ids need not mean the same."""
    from graft.canonical import canonical_text

    asked = {canonical_text(q) for q in heldout["question"]}
    return [(i, str(pid)) for i, (q, pid) in enumerate(zip(train["question"], train["problem_id"]))
            if canonical_text(q) in asked]


def retention_groups(table: pd.DataFrame) -> list[pd.DataFrame]:
    """A retention table split back into its tasks, in the order they first appear, each in its own order."""
    return [table[table.task == t].reset_index(drop=True) for t in dict.fromkeys(table.task)]
