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


def leave_distributed(info: DistInfo) -> None:
    """Leave the group at the end of a stage, as torch asks of a normal exit: every process waits until all are done
    (the first one writes the outputs after the last collective), then destroys the group. A process that exits with
    its group alive can leave a peer's pending operation (NCCL) or gloo's threads (at interpreter exit) behind.
    Not called on an error: torchrun stops the other processes then."""
    if info.world > 1 and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


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


# what torchrun puts in a worker's environment; an engine replica removes them (see become_replica)
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                 "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                 "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
                 "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING")


def replica_gpus(local_rank: int, gpus_per_replica: int, visible: str | None) -> str:
    """The CUDA devices of one engine replica: its own consecutive slice of ``visible`` (CUDA_VISIBLE_DEVICES, or
    devices 0, 1, ... when unset). Replica r of a node takes devices [r * g, (r + 1) * g)."""
    ids = [d.strip() for d in visible.split(",") if d.strip()] if visible else None
    want = range(local_rank * gpus_per_replica, (local_rank + 1) * gpus_per_replica)
    if ids is None:
        return ",".join(str(i) for i in want)
    if want[-1] >= len(ids):
        raise ValueError(f"replica {local_rank} needs devices {want[0]}-{want[-1]} of CUDA_VISIBLE_DEVICES="
                         f"{visible}: generation.data_parallel_size x vllm_tensor_parallel_size is more than it lists")
    return ",".join(ids[i] for i in want)


def become_replica(gpus_per_replica: int) -> tuple[int, int]:
    """In a torchrun worker that runs an engine replica on its own share of the work (no process group: replicas
    never talk to each other): its (rank, world); its CUDA devices pinned to its own slice before anything opens
    CUDA; and torchrun's variables removed, so an engine that sets up process groups of its own (vLLM's workers)
    never takes itself for one of torchrun's ranks."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    os.environ["CUDA_VISIBLE_DEVICES"] = replica_gpus(local, gpus_per_replica, os.environ.get("CUDA_VISIBLE_DEVICES"))
    for var in TORCHRUN_VARS:
        os.environ.pop(var, None)
    return rank, world
