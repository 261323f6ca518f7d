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

