"""Names of sweep points. dvc.yaml spells the same names (values rendered with Python's str(), as DVC does), so a
stage's output path and the report's list of points agree."""
from __future__ import annotations

from graft.params import ParamsError


def run_tag(lr: float, epoch: int) -> str:
    """A finetune snapshot: learning rate of the grid and the epoch after which it was taken."""
    return f"lr{lr}_ep{epoch}"


def require(value, allowed, key: str, flag: str) -> None:
    """A stage argument must be one of the values params.yaml declares (params.yaml is the only config)."""
    if value not in allowed:
        raise ParamsError(f"{flag} {value} is not in params.yaml {key} {list(allowed)}")


def point_names(p: dict) -> list[str]:
    """Every point the current params declare, in report order."""
    sweep, ft, opsd = p["sweep"], p["finetune"], p["opsd"]
    runs = [run_tag(lr, ep) for lr in ft.lrs for ep in sweep.epochs]
    names = ["post"]
    names += [f"sft_{r}" for r in runs]
    names += [f"sft_merge_lam{lam}_{r}" for lam in sweep.lams for r in runs]
    names += [f"fisher_merge_lam{lam}_{r}" for lam in sweep.fisher_merge_lams for r in runs]
    names += [f"graft_lam{lam}_{r}" for lam in sweep.lams for r in runs]
    names += [f"graft_{kind}_lam{lam}_rho{rho}_{r}" for kind in sweep.masks for lam in sweep.lams
              for rho in sweep.rhos for r in runs]
    names += [f"opsd_alpha{a}_{r}" for a in opsd.alphas for r in runs]
    return names
