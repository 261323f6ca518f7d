"""Writing weights into a loaded model in place (a sweep point into an engine, a point into the KL meter)."""
from __future__ import annotations

from typing import Iterable

import torch


@torch.no_grad()
def overwrite_parameters(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy ``(name, tensor)`` pairs into the model's parameters in place, each cast to the parameter's dtype and
    device; every parameter must be written (tied weights share storage, so one name covers both)."""
    params = dict(model.named_parameters())
    seen = set()
    for name, t in weights:
        if name not in params:
            raise KeyError(f"tensor {name} is not a parameter of the loaded model")
        params[name].copy_(t.to(params[name].device, params[name].dtype))
        seen.add(params[name].data_ptr())
    missing = [n for n, q in params.items() if q.data_ptr() not in seen]
    if missing:
        raise KeyError(f"no tensor for parameter {missing[0]}")
