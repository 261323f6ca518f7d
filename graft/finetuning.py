"""Finetuning at scale: a learning-rate grid point trained for some epochs with a snapshot after each, gradient
accumulation to a global batch, several processes (torchrun + DDP), and resume after an interruption.

One driver serves every objective (SFT and DFT on off-policy data, OPSD on the model's own samples) and both targets
(a donor for grafting, the post model for the baselines): the objective supplies a summed loss for a list of examples
and the number that turns that sum into the global batch's mean, so a global batch gives the same gradient however it
is cut into micro-batches and processes.

Determinism: the batch order is a function of the seed alone, and the step counter is the only state besides the
weights and the optimiser, so a run resumed from a checkpoint is bitwise the uninterrupted run on CPU.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import re
import shutil
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

import torch
import torch.distributed as dist
from safetensors.torch import load_file, load_model as load_weights, save_file, save_model as save_weights
from tqdm import tqdm

from graft.atomic import atomic_dir
from graft.distributed import DistInfo
from graft.loaded_code import loaded_modules
from graft.training import IGNORE, OptimConfig, collate, make_optimizer


@dataclass(frozen=True)
class TrainSpec:
    lr: float
    epochs: int
    global_batch: int          # examples per optimiser step, over all processes and micro-batches
    micro_batch: int           # examples per forward pass in one process
    warmup_ratio: float
    weight_decay: float
    betas: tuple[float, float]
    grad_clip: float
    seed: int
    autocast: torch.dtype | None = None   # compute dtype on GPU (weights and optimiser stay in their own dtype)
    checkpoint_every: int = 0             # optimiser steps between resume checkpoints; epoch ends always checkpoint
    sharding: str = "ddp"                 # several processes: ddp (each holds the model) | fsdp (FSDP2 shards)

    def optim(self) -> OptimConfig:
        return OptimConfig(lr=self.lr, betas=self.betas, weight_decay=self.weight_decay,
                           warmup_ratio=self.warmup_ratio, grad_clip=self.grad_clip)


class Objective(Protocol):
    def normalizer(self, batch: Sequence[int]) -> float:
        """What the summed loss of a whole global batch is divided by (labelled tokens, or sequences)."""

    def loss_sum(self, model: torch.nn.Module, indices: Sequence[int], step: int) -> tuple[torch.Tensor, float]:
        """Summed (not averaged) loss of these examples, and the seconds spent sampling for it."""


def epoch_plan(n_examples: int, global_batch: int, epochs: int, seed: int) -> list[list[list[int]]]:
    """Per epoch, the global batches as example indices: a seeded shuffle each epoch, last partial batch kept."""
    if n_examples <= 0:
        raise ValueError("no training examples")
    rng = random.Random(seed)
    plan = []
    for _ in range(epochs):
        order = list(range(n_examples))
        rng.shuffle(order)
        plan.append([order[i: i + global_batch] for i in range(0, n_examples, global_batch)])
    return plan


def rank_micro_batches(batch: Sequence[int], micro: int, rank: int, world: int) -> list[list[int]]:
    """This process's micro-batches of a global batch. Every process gets the same count (an empty one where the
    batch runs out) so DDP's collective calls stay in step."""
    chunks = [list(batch[i: i + micro]) for i in range(0, len(batch), micro)]
    per_rank = math.ceil(len(chunks) / world)
    mine = chunks[rank::world]
    return mine + [[] for _ in range(per_rank - len(mine))]


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor, kind: str = "sft") -> torch.Tensor:
    """Summed next-token loss over labelled positions, in fp32.

    sft: cross-entropy.  dft: cross-entropy weighted by the detached probability of the target token (Dynamic
    Fine-Tuning, the SynthSelf paper's baseline)."""
    logits = logits[:, :-1].float()
    target = labels[:, 1:]
    keep = target != IGNORE
    logp = torch.log_softmax(logits, -1).gather(-1, target.clamp(min=0)[..., None])[..., 0]
    if kind == "sft":
        per_tok = -logp
    elif kind == "dft":
        per_tok = -logp.detach().exp() * logp
    else:
        raise ValueError(f"unknown loss {kind!r}; expected sft or dft")
    return (per_tok * keep).sum()


class SupervisedObjective:
    """SFT (or DFT) on encoded (ids, labels) pairs: the global batch's loss is the mean over its labelled tokens."""

    def __init__(self, encoded: Sequence[tuple[list[int], list[int]]], pad_id: int, kind: str = "sft"):
        if kind not in ("sft", "dft"):
            raise ValueError(f"unknown loss {kind!r}; expected sft or dft")
        self.encoded, self.pad_id, self.kind = encoded, pad_id, kind
        # targets are labels shifted by one, so the first label never counts
        self.n_targets = [sum(1 for y in labels[1:] if y != IGNORE) for _, labels in encoded]
        empty = [i for i, n in enumerate(self.n_targets) if n == 0]
        if empty:  # truncation cut the whole response: training on it would learn nothing and report success
            raise ValueError(f"{len(empty)} of {len(encoded)} training examples have no response token left after "
                             f"truncation (first: row {empty[0]}, {len(encoded[empty[0]][0])} tokens); raise "
                             "finetune.max_len")

    def normalizer(self, batch: Sequence[int]) -> float:
        return float(max(1, sum(self.n_targets[i] for i in batch)))

    def loss_sum(self, model: torch.nn.Module, indices: Sequence[int], step: int) -> tuple[torch.Tensor, float]:
        device = next(model.parameters()).device
        b = {k: v.to(device) for k, v in collate([self.encoded[i] for i in indices], self.pad_id).items()}
        out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
        return token_loss_sum(out.logits, b["labels"], self.kind), 0.0


@dataclass
class TrainLog:
    curve: list[dict]          # one record per optimiser step: step, epoch, loss, lr
    timing: list[dict]         # one record per optimiser step: step, sample_s, update_s (measurements, not results)
    resumed_from: int          # optimiser steps restored from a checkpoint (0: a fresh run)


def shard_model(model: torch.nn.Module) -> None:
    """FSDP2 (``fully_shard``) in place: each transformer block its own unit, the rest (embeddings, final norm,
    lm_head, tied or not) the root's. Parameters, gradients and optimiser states are split over the processes."""
    from torch.distributed.fsdp import fully_shard

    blocks = [layer for name, mod in model.named_modules()
              if name.endswith("layers") and isinstance(mod, torch.nn.ModuleList) for layer in mod]
    if not blocks:
        raise ValueError("finetune.parallel fsdp: the model has no `layers` list of blocks to shard")
    for block in blocks:
        fully_shard(block)
    fully_shard(model)


def full_state(model: torch.nn.Module, opt: torch.optim.Optimizer | None = None) -> tuple[dict, dict | None]:
    """The whole model's (and optimiser's) state from a sharded model, on the CPU of every process (every process
    must call it: it gathers). Keys are the model's own parameter names."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=False)
    weights = get_model_state_dict(model, options=options)
    return weights, (get_optimizer_state_dict(model, opt, options=options) if opt is not None else None)


def _unique(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tied tensors (lm_head = embed_tokens) once, under their first name, as safetensors needs."""
    seen, out = set(), {}
    for k, v in weights.items():
        if v.data_ptr() not in seen:
            seen.add(v.data_ptr())
            out[k] = v.contiguous()
    return out


def _save_sharded_state(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched, step: int,
                        log: TrainLog, main: bool) -> None:
    """The FSDP checkpoint: the gathered full weights and AdamW moments (keyed by parameter name), same files as
    the DDP checkpoint otherwise. Every process gathers; the first writes."""
    weights, optim = full_state(model, opt)
    if not main:
        return
    tensors = {f"opt.{name}.{key}": val.detach().contiguous().cpu()
               for name, st in optim["state"].items() for key, val in st.items()}
    meta = {"step": step, "sched": sched.state_dict(), "curve": log.curve, "timing": log.timing,
            "opt": {"params": sorted(optim["state"]), "param_groups": optim["param_groups"]}, "sharding": "fsdp"}
    with atomic_dir(path) as tmp:
        save_file(_unique(weights), str(tmp / "model.safetensors"))
        save_file(tensors, str(tmp / "state.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta))


def _load_sharded_state(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched) -> tuple[int, dict]:
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    tensors = load_file(str(path / "state.safetensors"))
    meta = json.loads((path / "state.json").read_text())
    options = StateDictOptions(full_state_dict=True)
    weights = load_file(str(path / "model.safetensors"))
    # a tied tensor was stored once: every name of the model's state gets it back
    own = full_state(model)[0]
    by_ptr = {}
    for k, v in own.items():
        by_ptr.setdefault(v.data_ptr(), []).append(k)
    for names in by_ptr.values():
        stored = next(n for n in names if n in weights)
        for n in names:
            weights[n] = weights[stored]
    set_model_state_dict(model, weights, options=options)
    state = {}
    for name in meta["opt"]["params"]:
        prefix = f"opt.{name}."
        state[name] = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    set_optimizer_state_dict(model, opt, {"state": state, "param_groups": meta["opt"]["param_groups"]},
                             options=options)
    sched.load_state_dict(meta["sched"])
    return meta["step"], meta


def _save_state(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched, step: int,
                log: TrainLog) -> None:
    """Weights, AdamW moments and step counters as safetensors + JSON (never a pickle), written atomically. The
    weights go through safetensors' own model writer, which stores tied tensors (lm_head = embed_tokens) once."""
    tensors: dict[str, torch.Tensor] = {}
    opt_sd = opt.state_dict()
    for idx, st in opt_sd["state"].items():  # keyed by parameter index: a parameter without state keeps its slot
        for key, val in st.items():
            tensors[f"opt.{idx}.{key}"] = val.detach().contiguous().cpu()
    meta = {"step": step, "sched": sched.state_dict(), "curve": log.curve, "timing": log.timing,
            "opt": {"params": sorted(opt_sd["state"]), "param_groups": opt_sd["param_groups"]}}
    with atomic_dir(path) as tmp:
        save_weights(model, str(tmp / "model.safetensors"))
        save_file(tensors, str(tmp / "state.safetensors"))
        (tmp / "state.json").write_text(json.dumps(meta))


def _load_state(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, sched) -> tuple[int, dict]:
    tensors = load_file(str(path / "state.safetensors"))
    meta = json.loads((path / "state.json").read_text())
    load_weights(model, str(path / "model.safetensors"), device=str(next(model.parameters()).device))
    state = {}
    for idx in meta["opt"]["params"]:
        prefix = f"opt.{idx}."
        state[idx] = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    opt.load_state_dict({"state": state, "param_groups": meta["opt"]["param_groups"]})
    sched.load_state_dict(meta["sched"])
    return meta["step"], meta


def train(model: torch.nn.Module, objective: Objective, n_examples: int, spec: TrainSpec, *,
          on_epoch_end: Callable[[int, torch.nn.Module, dict | None], None], workdir: Path | None = None,
          dist_info: DistInfo = DistInfo(), desc: str = "finetune",
          stop_after: int | None = None, on_step: Callable[[dict], None] | None = None) -> TrainLog:
    """Train ``model`` in place for ``spec.epochs`` epochs, calling ``on_epoch_end(epoch, model, weights)`` after
    each on the main process (``weights``: the gathered full state of a sharded model, None otherwise).

    ``workdir`` holds the resume checkpoint: a run that finds one there continues from it. ``stop_after`` ends the
    run after that many optimiser steps (tests use it to interrupt a run the way a kill would). ``on_step`` gets each
    step's curve record on the main process (the resumed part of the curve first)."""
    plan = epoch_plan(n_examples, spec.global_batch, spec.epochs, spec.seed)
    total = sum(len(e) for e in plan)
    torch.manual_seed(spec.seed)
    model.train()
    if spec.sharding not in ("ddp", "fsdp"):
        raise ValueError(f"sharding must be ddp or fsdp, got {spec.sharding!r}")
    fsdp = dist_info.world > 1 and spec.sharding == "fsdp"
    if fsdp:   # before the optimiser: it must hold the sharded parameters
        shard_model(model)
    opt, sched = make_optimizer(model, spec.optim(), total)
    ddp = model
    if dist_info.world > 1 and not fsdp:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[dist_info.device.index] if dist_info.device.type == "cuda" else None)
    log = TrainLog(curve=[], timing=[], resumed_from=0)
    start = 0
    state_dir = workdir / "state" if workdir is not None else None
    if state_dir is not None and (state_dir / "state.json").exists():
        start, meta = (_load_sharded_state if fsdp else _load_state)(state_dir, model, opt, sched)
        log = TrainLog(curve=meta["curve"], timing=meta["timing"], resumed_from=start)
    if on_step is not None and dist_info.main:
        for rec in log.curve:
            on_step(rec)
    step = 0
    bar = tqdm(total=total, initial=start, desc=desc, mininterval=2.0, disable=not dist_info.main)
    for epoch, batches in enumerate(plan, start=1):
        for i, batch in enumerate(batches):
            if step < start:
                step += 1
                continue
            if stop_after is not None and step >= stop_after:
                bar.close()
                return log
            t0 = time.perf_counter()
            norm = objective.normalizer(batch)
            micro = rank_micro_batches(batch, spec.micro_batch, dist_info.rank, dist_info.world)
            total_loss = torch.zeros((), dtype=torch.float64, device=dist_info.device)
            sample_s = 0.0
            opt.zero_grad(set_to_none=True)
            for j, chunk in enumerate(micro):
                # an empty chunk still runs (on the batch's first example, weighted 0) to keep DDP in step
                weight = 1.0 if chunk else 0.0
                # DDP syncs only the last micro-batch; FSDP reduce-scatters each (no accumulation without sync here)
                sync = ddp.no_sync() if (dist_info.world > 1 and not fsdp and j < len(micro) - 1) else nullcontext()
                with sync, torch.autocast(dist_info.device.type, dtype=spec.autocast,
                                          enabled=spec.autocast is not None):
                    loss_sum, s = objective.loss_sum(ddp, chunk or [batch[0]], step)
                    # DDP and FSDP average gradients over processes: scale by world so the result is the global sum / norm
                    loss = loss_sum * (weight * dist_info.world / norm)
                sample_s += s
                if not torch.isfinite(loss_sum):
                    raise FloatingPointError(f"{desc}: loss became {loss_sum.item()} at step {step}")
                loss.backward()
                total_loss += loss_sum.detach().double() * weight / norm
            if dist_info.world > 1:
                dist.all_reduce(total_loss)
            torch.nn.utils.clip_grad_norm_(model.parameters(), spec.grad_clip)
            lr = sched.get_last_lr()[0]   # the rate this step uses (after sched.step() it is the next step's)
            opt.step()
            sched.step()
            step += 1
            log.curve.append({"step": step, "epoch": epoch, "loss": float(total_loss), "lr": lr})
            if on_step is not None and dist_info.main:
                on_step(log.curve[-1])
            elapsed = time.perf_counter() - t0
            log.timing.append({"step": step, "sample_s": sample_s, "update_s": elapsed - sample_s})
            bar.update(1)
            bar.set_postfix(loss=f"{float(total_loss):.3f}", epoch=epoch, refresh=False)
            epoch_done = i == len(batches) - 1
            if epoch_done:
                model.eval()
                weights = full_state(model)[0] if fsdp else None   # every process gathers
                if dist_info.main:
                    on_epoch_end(epoch, model, weights)
                model.train()
            if state_dir is not None and (epoch_done or (spec.checkpoint_every and step % spec.checkpoint_every == 0)):
                if fsdp:
                    _save_sharded_state(state_dir, model, opt, sched, step, log, dist_info.main)
                elif dist_info.main:
                    _save_state(state_dir, model, opt, sched, step, log)
                if dist_info.world > 1:
                    dist.barrier()
    bar.close()
    model.eval()
    return log


def code_fingerprint() -> dict[str, str]:
    """sha256 of every graft/stages module this process has loaded, its entry point included: a checkpoint written
    by other code is never resumed (it would give a model neither version produces)."""
    return {name: hashlib.sha256(Path(f).read_bytes()).hexdigest() for name, f in loaded_modules().items()}


def fingerprint(files: Sequence[str | Path], extra: dict) -> str:
    """A key for a run's resume directory: the content of every input file and the settings. A checkpoint is only
    resumed by the exact run that wrote it."""
    h = hashlib.sha256(json.dumps(extra, sort_keys=True).encode())
    for f in files:
        f = Path(f)
        paths = sorted(p for p in f.rglob("*") if p.is_file()) if f.is_dir() else [f]
        for p in paths:
            h.update(str(p.relative_to(f) if f.is_dir() else p.name).encode())
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:24]


def work_name(out: Path) -> str:
    """The resume directory's name for output ``out``: its whole path, so two outputs never share one."""
    return "_".join(out.parts)


def stale_workdirs(work_root: Path, out: Path, key: str) -> list[Path]:
    """Resume directories of ``out`` under a key other than ``key``: a run with other inputs, settings or code can
    never resume them (at 1B a directory is weights and optimiser state, several GB)."""
    if not work_root.is_dir():
        return []
    name = re.compile(re.escape(work_name(out)) + r"-[0-9a-f]{24}")
    return sorted(p for p in work_root.iterdir()
                  if name.fullmatch(p.name) and p.name != f"{work_name(out)}-{key}" and not p.is_symlink())


def assemble_snapshots(workdir: Path, epochs: Sequence[int], out: Path) -> None:
    """Move the finished run's epoch snapshots into ``out`` (atomically) and drop the work directory."""
    with atomic_dir(out) as tmp:
        for e in epochs:
            src = workdir / f"epoch{e}"
            if not (src / "config.json").exists():
                raise FileNotFoundError(f"{src}: snapshot of epoch {e} is missing")
            shutil.copytree(src, tmp / f"epoch{e}")
    shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def live_curve(path: Path | None) -> Iterator[Callable[[dict], None] | None]:
    """A dvclive logger of curve records. Only values and step numbers are written (no timestamps), so a rerun
    writes the same files; a resumed run replays the saved part of the curve first. The curve of a run in progress
    is written beside ``path`` (``.<name>.tmp-*``) and replaces it when the run succeeds: a failed run leaves the
    last good run's curve as it was."""
    if path is None:
        yield None
        return
    from dvclive import Live

    with atomic_dir(path) as tmp, Live(str(tmp), dvcyaml=None, save_dvc_exp=False, report=None) as live:
        def log(rec: dict) -> None:
            live.step = rec["step"]
            live.log_metric("train/loss", rec["loss"])
            live.log_metric("train/lr", rec["lr"])
            live.make_summary()

        yield log


def train_to_snapshots(model: torch.nn.Module, tokenizer, objective: Objective, n_examples: int, spec: TrainSpec, *,
                       out: Path, inputs: Sequence[str | Path], settings: dict, dist_info: DistInfo,
                       desc: str, work_root: Path = Path(".graft/work"), live_dir: Path | None = None,
                       snapshots: Sequence[int] | None = None) -> TrainLog:
    """Train with a resumable work directory keyed by the inputs and settings; write ``out/epoch<e>/`` (complete HF
    model directories) atomically when the last epoch is done, for every epoch or those of ``snapshots`` (a chain
    keeps its last only). ``live_dir`` gets dvclive logs of the loss and learning rate per step, written as training
    runs (``dvc plots show``, ``dvc exp show``)."""
    kept = list(range(1, spec.epochs + 1)) if snapshots is None else sorted(snapshots)
    from graft.modeling import save_snapshot

    key = fingerprint(inputs, {**settings, "world": dist_info.world, "code": code_fingerprint()})
    workdir = work_root / f"{work_name(out)}-{key}"
    if dist_info.main:
        for stale in stale_workdirs(work_root, out, key):
            shutil.rmtree(stale, ignore_errors=True)
            print(f"{desc}: removed {stale} (resume state of this output under other inputs, settings or code)")

    def save_epoch(epoch: int, m: torch.nn.Module, weights: dict | None) -> None:
        if epoch not in kept:
            return
        with atomic_dir(workdir / f"epoch{epoch}") as tmp:
            save_snapshot(m, tokenizer, tmp, weights)

    with live_curve(live_dir if dist_info.main else None) as on_step:
        log = train(model, objective, n_examples, spec, on_epoch_end=save_epoch, workdir=workdir,
                    dist_info=dist_info, desc=desc, on_step=on_step)
    if dist_info.main:
        if log.resumed_from:
            print(f"{desc}: resumed from a checkpoint at step {log.resumed_from}")
        assemble_snapshots(workdir, kept, out)
    if dist_info.world > 1:
        dist.barrier()
    return log


def recipe_settings(p, from_donor: bool) -> dict:
    """The finetune keys a run uses, for its resume key: all but the rate grid (the run's own rate is keyed apart),
    and the donor path only when the run starts from the donor (the SFT and OPSD runs start from post)."""
    return {k: p[k] for k in p if k != "lrs" and (from_donor or k != "donor")}


def spec_from_params(p, lr: float) -> TrainSpec:
    """The finetune section of params.yaml as a TrainSpec; each process sees the same global batch."""
    autocast = None if p.autocast == "none" else getattr(torch, p.autocast)
    return TrainSpec(lr=lr, epochs=p.epochs, global_batch=p.global_batch_size, micro_batch=p.micro_batch_size,
                     warmup_ratio=p.warmup_ratio, weight_decay=p.weight_decay, betas=tuple(p.betas),
                     grad_clip=p.grad_clip, seed=p.seed, autocast=autocast, checkpoint_every=p.checkpoint_every,
                     sharding=p.parallel)
