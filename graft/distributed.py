"""Several processes under torchrun (the launcher that ships with torch): which process this is, joining the group,
and a stage relaunching itself under torchrun when params ask for more than one process. Used by the training
stages (DDP) and the Fisher stage (rollouts split by rank, sums all-reduced)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_name: str = "auto") -> DistInfo:
    """Join the process group torchrun set up (gloo on CPU, nccl on GPU); a plain run is one process.
    ``device_name``: params.yaml ``compute.device``; each process takes the CUDA device of its local rank."""
    from graft.modeling import resolve_device

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name)
    if device.type == "cuda":
        device = torch.device("cuda", local)
    if world == 1:
        return DistInfo(0, 1, device)
    if not dist.is_initialized():
        # generous: in the Fisher stage the other processes wait while the first one samples every rollout
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(hours=6))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return DistInfo(dist.get_rank(), dist.get_world_size(), device)


def relaunch_under_torchrun(num_processes: int, module: str, argv: Sequence[str]) -> bool:
    """When params ask for several processes and this is not yet a torchrun worker, run the same stage under
    torchrun (the launcher that ships with torch) and report True; the caller then has nothing left to do."""
    if num_processes == 1 or "LOCAL_RANK" in os.environ:
        return False
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc_per_node={num_processes}", "-m", module, *argv], check=True)
    return True


def broadcast_token_lists(lists: list[list[int]] | None, info: DistInfo) -> list[list[int]]:
    """The first process's lists of token ids, on every process: sent as two integer tensors (lengths, then the
    ids), never pickled. The first process passes its lists, the others None."""
    if info.world == 1:
        return list(lists or [])
    sizes = torch.zeros(2, dtype=torch.long, device=info.device)
    if info.main:
        sizes[0], sizes[1] = len(lists), sum(len(x) for x in lists)
    dist.broadcast(sizes, src=0)
    n, total = int(sizes[0]), int(sizes[1])
    lengths = torch.zeros(n, dtype=torch.long, device=info.device)
    flat = torch.zeros(total, dtype=torch.long, device=info.device)
    if info.main:
        lengths.copy_(torch.tensor([len(x) for x in lists], dtype=torch.long))
        flat.copy_(torch.tensor([t for x in lists for t in x], dtype=torch.long))
    dist.broadcast(lengths, src=0)
    dist.broadcast(flat, src=0)
    out, at = [], 0
    for length in lengths.tolist():
        out.append(flat[at: at + length].tolist())
        at += length
    return out
