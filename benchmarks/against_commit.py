"""Speed work, before and after: the mask stage and the merge at an earlier commit against the working tree, on the
same inputs, alternating, with every output compared byte for byte.

    python -m benchmarks.against_commit 245bd4f --size 135m --reps 2

For each rep and each of the mask kinds (diagonal, KFAC: the whole stage, ``python -m stages.mask``, start-up
included) and the merge (``graft.merging.merge_into_dir`` with lambda 0.75, start-up excluded, beside the I/O floor),
the old code runs and then the new, each in its own process. Inputs are the benchmark suite's (benchmarks/sizes.py)
with one difference: the KFAC eigenbases are random orthogonal matrices, not identities, so that a changed rotation
would show in the bytes. Prints every time and whether old and new wrote identical bytes (tensors and the mask's
JSON); exits 1 if any output differs.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import sizes as S
from benchmarks.tensor_rows import EPOCH, LR, RHO, _sandbox
from graft.tensors import TensorReader, write_safetensors_streamed

REPO = Path(__file__).resolve().parents[1]
MERGE = ("import sys, time; from pathlib import Path; from graft.merging import merge_into_dir; "
         "Path(sys.argv[3]).mkdir(); t = time.perf_counter(); merge_into_dir(sys.argv[1], sys.argv[2], 0.75, "
         "sys.argv[3]); print(time.perf_counter() - t)")
FLOOR = ("import sys; from pathlib import Path; from benchmarks.tensor_rows import io_floor; "
         "print(io_floor(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])))")


def orthogonal_kfac(size: S.Size, delta: Path) -> Path:
    path = S.work_dir(size) / "kfac-orthogonal.safetensors"
    if path.exists():
        return path
    g = torch.Generator().manual_seed(4)
    with TensorReader(S.kfac_file(size, delta, None)) as r:
        def produce(name: str) -> torch.Tensor:
            t = r.get(name)
            if name.endswith("eigvecs"):
                return torch.linalg.qr(torch.randn(t.shape, generator=g, dtype=torch.float64))[0].float()
            return t
        write_safetensors_streamed(path, [(n, torch.float32, r.shape(n)) for n in r.names()], produce)
    return path


def digest(folder: Path) -> dict[str, str]:
    return {str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(folder.rglob("*")) if f.is_file() and f.suffix in (".safetensors", ".json")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("rev", help="the earlier commit")
    ap.add_argument("--size", default="135m", choices=sorted(S.SIZES))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--work", default=".graft/bench")
    args = ap.parse_args()
    S.set_root(args.work)
    size = S.SIZES[args.size]()
    _, delta = S.finetuned_and_delta(size)
    fisher, kfac = S.diagonal_fisher(size, delta), orthogonal_kfac(size, delta)
    old = Path(tempfile.mkdtemp(prefix="old-", dir=S.work_dir(size)))
    tar = subprocess.run(["git", "archive", args.rev], cwd=REPO, check=True, capture_output=True).stdout
    tarfile.open(fileobj=io.BytesIO(tar)).extractall(old)
    box = _sandbox(size, delta, fisher, kfac)
    merged = S.work_dir(size) / "against-merged"
    times: dict[tuple[str, str], list[float]] = {}
    same = True
    try:
        for _ in range(args.reps):
            for what in ("diagonal", "kfac", "merge"):
                outs = {}
                for code, root in (("old", old), ("new", REPO)):
                    env = dict(os.environ, PYTHONPATH=str(root))
                    if what == "merge":
                        shutil.rmtree(merged, ignore_errors=True)
                        r = subprocess.run([sys.executable, "-c", MERGE, str(size.post.resolve()), str(delta.resolve()), str(merged.resolve())],
                                           env=env, capture_output=True, text=True, cwd=tempfile.gettempdir())
                        seconds = float(r.stdout.split()[-1]) if r.returncode == 0 else 0.0
                        folder = merged
                    else:
                        name = f"{what}_rho{RHO}_lr{LR}_ep{EPOCH}"
                        cmd = [sys.executable, "-m", "stages.mask", "--kind", what, "--rho", str(RHO), "--lr",
                               str(LR), "--epoch", str(EPOCH)]
                        t = time.perf_counter()
                        r = subprocess.run(cmd, cwd=box, env=env, capture_output=True, text=True)
                        seconds = time.perf_counter() - t
                        shutil.move(box / f"reports/masks/{name}.json", box / f"tensors/masked/{name}/stats.json")
                        folder = box / "tensors/masked" / name
                    if r.returncode:
                        raise SystemExit(f"{what} ({code}) failed:\n{r.stderr[-3000:]}")
                    outs[code] = digest(folder)
                    times.setdefault((what, code), []).append(round(seconds, 2))
                    shutil.rmtree(folder, ignore_errors=True)
                    print(f"{what:8s} {code}: {seconds:.2f} s", flush=True)
                if outs["old"] != outs["new"]:
                    same = False
                    print(f"{what}: OUTPUTS DIFFER: {sorted(k for k in outs['new'] if outs['new'][k] != outs['old'].get(k))}")
            shutil.rmtree(merged, ignore_errors=True)   # the merge's reference, in the same rep
            r = subprocess.run([sys.executable, "-c", FLOOR, str(size.post.resolve()), str(delta.resolve()), str(merged.resolve())],
                               env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
                               cwd=tempfile.gettempdir(), check=True)
            times.setdefault(("merge", "I/O floor"), []).append(round(float(r.stdout.split()[-1]), 2))
        print(f"\n{args.size}, {args.rev} (old) against the working tree (new), {args.reps} reps alternating:")
        for (what, code), ts in times.items():
            print(f"  {what:8s} {code:9s} {ts}")
        print("every output byte for byte the same:", same)
    finally:
        shutil.rmtree(box, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(merged, ignore_errors=True)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
