"""Mask and merge rows, on files on local disk.

mask    the mask stage itself (``python -m stages.mask``, start-up included) against one streaming read of the
        tensors it needs (delta and diagonal Fisher; for KFAC also the eigenbasis), in this process
merge   graft.merging.merge_into_dir (what the export and merge stages run) against the I/O floor (read post and the
        delta, write post's bytes through the same writer, no math), and against mergekit's task_arithmetic on the
        same post and finetuned model: time, private memory, and elements off the exact fp32 merge
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from benchmarks.common import PrivatePeak, Row, timed
from benchmarks.read_tensors import touch
from benchmarks.sizes import Size, post_dtype, work_dir
from graft.kfac import kfac_rotation
from graft.tensors import TensorReader, dtype_of, write_like

REPO = Path(__file__).resolve().parents[1]
MERGEKIT = REPO / ".graft/bench/mergekit-venv/bin/mergekit-yaml"   # benchmarks/setup_mergekit.sh
RHO, LR, EPOCH = 0.01, 0.0001, 10
# each side of a mask or merge row is timed this many times, alternating, and the medians compared: one timing of a
# seconds-long stage moved 1.5x between runs here (dirty pages of the inputs just written, another process waking)
REPS = 3


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def settled(fn):
    """``fn`` timed after the kernel has written back every dirty page, so no side pays for the last one's writes."""
    os.sync()
    return timed(fn)


def _read_all(*paths: Path) -> int:
    """Every tensor's bytes read once (``touch``: taking a lazily mapped tensor alone reads nothing)."""
    total = 0
    for path in paths:
        with TensorReader(path) as r:
            for name in r.names():
                total += touch(r.get(name))
    return total


def _sandbox(size: Size, delta: Path, fisher: Path, kfac: Path) -> Path:
    """A folder laid out as the pipeline lays it out, the inputs hard-linked (no copy), params.yaml the repo's with
    the run's rho, lr and epoch."""
    box = Path(tempfile.mkdtemp(prefix="mask-", dir=work_dir(size)))
    d = box / f"tensors/delta/graft_lr{LR}_ep{EPOCH}"
    d.mkdir(parents=True)
    for f in delta.iterdir():
        os.link(f, d / f.name)
    (box / "tensors/fisher/retention").mkdir(parents=True)
    os.link(fisher, box / "tensors/fisher/retention/diagonal.safetensors")
    os.link(kfac, box / "tensors/fisher/retention/kfac.safetensors")
    p = yaml.safe_load((REPO / "params.yaml").read_text())
    p["finetune"]["lrs"], p["sweep"]["rhos"], p["sweep"]["epochs"] = [LR], [RHO], [EPOCH]
    p["donors"]["candidates"] = {}
    (box / "params.yaml").write_text(yaml.safe_dump(p, sort_keys=False))
    return box


def mask_rows(size: Size, delta: Path, fisher: Path, kfac: Path) -> list[Row]:
    rows = []
    box = _sandbox(size, delta, fisher, kfac)
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        for kind in ("diagonal", "kfac"):
            files = [delta, fisher] + ([kfac] if kind == "kfac" else [])
            _read_all(*files)                   # warm the page cache for both
            warm_s, entries = timed(lambda: _read_all(*files))
            reader = [sys.executable, "-m", "benchmarks.read_tensors", *map(str, files)]
            cmd = [sys.executable, "-m", "stages.mask", "--kind", kind, "--rho", str(RHO), "--lr", str(LR),
                   "--epoch", str(EPOCH)]
            reads, stages = [], []
            for _ in range(REPS):
                reads.append(settled(lambda: subprocess.run(reader, cwd=REPO, check=True, capture_output=True))[0])
                shutil.rmtree(box / "tensors/masked", ignore_errors=True)
                seconds, r = settled(lambda: subprocess.run(cmd, cwd=box, env=env, capture_output=True, text=True))
                if r.returncode:
                    raise SystemExit(f"mask stage failed:\n{r.stderr[-3000:]}")
                stages.append(seconds)
            read_s, stage_s = median(reads), median(stages)
            with TensorReader(delta) as dr:
                n = sum(torch.Size(dr.shape(k)).numel() for k in dr.names())
            read = "delta + diagonal Fisher" + (" + KFAC eigenbases" if kind == "kfac" else "")
            rows.append(Row(f"exact global top-rho mask ({kind}), whole stage", size.name,
                            f"one streaming read of the {read}, in a fresh process", stage_s, read_s, "<= 3x",
                            note=f"rho {RHO} of {n / 1e6:.0f}M entries; both start a Python process and torch; "
                                 f"the read alone, in this process, {warm_s:.2f} s; medians of {REPS} "
                                 f"alternating runs (stage {_seconds(stages)}; read {_seconds(reads)})",
                            extra={"read_in_process_s": round(warm_s, 3), "stage_s": stages, "read_s": reads}))
            if kind == "kfac":
                inputs = _kfac_inputs(delta, kfac)
                products = [timed(lambda: _kfac_products(inputs))[0] for _ in range(REPS)]
                del inputs
                rows.append(Row("KFAC mask against its own arithmetic", size.name,
                                "its matrix products alone (U^T dW V and U R V^T of every KFAC layer, inputs in "
                                "memory, in this process)", stage_s, median(products), "",
                                note=f"a diagnostic, no goal: the stage cannot go below these products on this CPU, so "
                                     f"3x a read is reachable only where they cost less; products "
                                     f"{_seconds(products)}",
                                extra={"products_s": products}))
            shutil.rmtree(box / "tensors/masked", ignore_errors=True)
    finally:
        shutil.rmtree(box, ignore_errors=True)
    return rows


def _kfac_inputs(delta: Path, kfac: Path) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(dW, U, V) of every KFAC layer, read into memory."""
    with TensorReader(delta) as d, TensorReader(kfac) as k:
        layers = [n[: -len(".P_eigvecs")] for n in k.names() if n.endswith(".P_eigvecs")]
        return [(d.get(n).float().clone(), k.get(f"{n}.P_eigvecs").clone(), k.get(f"{n}.Q_eigvecs").clone())
                for n in layers]


def _kfac_products(inputs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> None:
    """The four fp32 matrix products the KFAC mask does per layer (two to score, two to project every layer with a
    dropped direction): the arithmetic the stage is made of, without its I/O or selection."""
    for dW, U, V in inputs:
        U @ kfac_rotation(dW, U, V) @ V.T


def _process(cmd: list[str], out_dir: Path, **popen) -> tuple[float, float, int, str, str]:
    """One fresh process writing ``out_dir`` (removed first, dirty pages written back): (seconds, peak private MB,
    return code, stdout, stderr)."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.sync()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)
    with PrivatePeak(proc.pid) as mem:
        seconds, (out, err) = timed(proc.communicate)
    return seconds, mem.peak, proc.returncode, out, err


def _seconds(xs: list[float]) -> str:
    return ", ".join(f"{x:.3g}" for x in xs) + " s"


def io_floor(post: Path, delta: Path, out: Path) -> float:
    """Read post and the delta tensor by tensor, write post's bytes through the same streaming writer."""
    def run():
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        # the delta's bytes read (the merge reads them); post's are read by writing them
        with TensorReader(post) as p, TensorReader(delta) as d:
            write_like(p, out, None, lambda n: (touch(d.get(n)), p.get(n))[1])
    seconds, _ = settled(run)
    return seconds


def _elements_off(result: Path, reference: Path) -> tuple[int, int, float]:
    """(elements that differ, elements, largest absolute difference) between two model directories."""
    off = total = 0
    worst = 0.0
    with TensorReader(result) as a, TensorReader(reference) as b:
        for name in b.names():
            x, y = a.get(name).float(), b.get(name).float()
            off += int((x != y).sum())
            total += y.numel()
            worst = max(worst, float((x - y).abs().max()))
    return off, total, worst


def merge_rows(size: Size, ft: Path, delta: Path, lam: float = 0.5, mergekit: bool = True) -> list[Row]:
    w = work_dir(size)
    for d in ("floor", "merged", "mergekit"):
        shutil.rmtree(w / d, ignore_errors=True)
    _read_all(size.post, delta)   # warm cache, as for every competitor below
    # in a fresh process, so that the private memory is the merge's own (this one holds what earlier rows freed)
    cmd = [sys.executable, "-m", "benchmarks.merge_once", str(size.post), str(delta), str(lam), str(w / "merged")]
    floors, merges, walls, owns, peaks = [], [], [], [], []
    for _ in range(REPS):
        floors.append(io_floor(size.post, delta, w / "floor"))
        wall, peak, code, out, err = _process(cmd, w / "merged", cwd=REPO)
        if code:
            raise SystemExit(f"merge failed:\n{err[-2000:]}")
        done = json.loads(out.strip().splitlines()[-1])
        merges.append(done["seconds"])
        walls.append(wall)
        owns.append(peak - done["baseline_mb"])
        peaks.append(peak)
    floor, ours, wall = median(floors), median(merges), median(walls)
    own, mem_peak = max(owns), max(peaks)
    with TensorReader(size.post) as p:
        largest = max(torch.Size(p.shape(n)).numel() for n in p.names()) * 4 / 2**20   # fp32 MB
    dtype = str(post_dtype(size)).removeprefix("torch.")
    rows = [Row("merge / export of post + lam * M(delta)", size.name, "the I/O floor: read post and delta, write "
                "the result, no math", ours, floor, "<= 1.43x",
                note=f"{dtype} post, fp32 delta, fp32 math, start-up excluded; 1.43x = 0.7x the floor's speed; "
                     f"private memory {own:.0f} MB above the process after start-up ({mem_peak:.0f} MB in all; "
                     f"largest of {REPS}), largest tensor {largest:.0f} MB in fp32; medians of {REPS} alternating runs "
                     f"(merge {_seconds(merges)}; floor {_seconds(floors)})",
                extra={"private_mb": round(own, 1), "process_private_mb": round(mem_peak, 1),
                       "largest_tensor_fp32_mb": round(largest, 1), "merge_s": merges, "floor_s": floors,
                       "merge_process_s": walls})]
    if mergekit:
        rows.append(_mergekit_row(size, ft, lam, wall, w, largest, dtype))
    shutil.rmtree(w / "floor", ignore_errors=True)
    return rows


def _mergekit_row(size: Size, ft: Path, lam: float, ours: float, w: Path, largest: float, dtype: str) -> Row:
    if not MERGEKIT.exists():
        return Row("merge / export", size.name, "mergekit task_arithmetic on identical inputs", ours, None,
                   ">= 2.5x", note="not run: benchmarks/setup_mergekit.sh makes its environment")
    cfg = {"merge_method": "task_arithmetic", "base_model": str(size.post.resolve()),
           "models": [{"model": str(ft.resolve()), "parameters": {"weight": lam}}],
           "parameters": {"normalize": False}, "dtype": "float32", "out_dtype": dtype}
    (w / "mergekit.yml").write_text(yaml.safe_dump(cfg))
    cmd = [str(MERGEKIT), str(w / "mergekit.yml"), str(w / "mergekit"), "--no-copy-tokenizer", "--lazy-unpickle",
           "--out-shard-size", "800M"]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    run = lambda: subprocess.run(cmd, env=env, capture_output=True, text=True)
    proc_s, r = timed(run)   # warm-up run: its own imports and the page cache
    runs, peak = [], 0.0
    for _ in range(REPS):
        seconds, used, code, out, err = _process(cmd, w / "mergekit", env=env)
        if code:
            why = err.strip().splitlines()[-1] if err.strip() else code
            return Row("merge / export", size.name, "mergekit task_arithmetic on identical inputs", ours, None,
                       ">= 2.5x", note=f"mergekit failed: {why}")
        runs.append(seconds)
        peak = max(peak, used)
    secs = median(runs)
    off, total, worst = _elements_off(w / "mergekit", w / "merged")
    return Row("merge / export, whole process", size.name,
               "mergekit 0.1.5 task_arithmetic (dtype float32) on identical inputs, whole process", ours, secs,
               ">= 2.5x",
               note=f"both processes' wall time incl. start-up, medians of {REPS} (mergekit {_seconds(runs)}); "
                    f"mergekit's private memory {peak:.0f} MB; "
                    f"{off / total:.2%} of its elements differ from the exact fp32 merge (largest {worst:.2g})",
               extra={"mergekit_private_mb": round(peak, 1), "mergekit_elements_off": off, "elements": total,
                      "mergekit_s": runs})
