"""delta: the task vector of a finetune snapshot, fp32 safetensors keyed by parameter name, streamed tensor by tensor.

python -m stages.delta --kind graft --lr L --epoch E  ->  tensors/delta/graft_lr<L>_ep<E>/  (donor_ft - donor)
python -m stages.delta --kind sft --lr L --epoch E    ->  tensors/delta/sft_lr<L>_ep<E>/    (sft - post)
python -m stages.delta --kind post                   ->  tensors/delta/post_vs_base/        (post - base: what
    post-training changed; the diagnostics evaluate base + t * (post - base) and compare the deltas with it)
python -m stages.delta --kind candidate --name N     ->  tensors/delta/candidate_<N>/lr<L>_ep<E>/ for every epoch of
    sweep.epochs at donors.lr (candidate_ft - candidate: the donor sweep)
"""
from __future__ import annotations

import argparse

from graft.cli import run_stage
from graft.atomic import atomic_dir
from graft.merging import write_delta
from graft.schema import load_all
from graft.sweep import require, run_tag
from graft.tensors import check_compatible


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["graft", "sft", "post", "candidate"], required=True)
    ap.add_argument("--name", help="candidate: a key of donors.candidates")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--epoch", type=int)
    args = ap.parse_args()
    p = load_all()
    ft, models = p["finetune"], p["models"]
    if args.kind == "post":
        with atomic_dir("tensors/delta/post_vs_base") as tmp:
            norms = write_delta(models.post, models.base, tmp)
        print(f"delta post_vs_base: {len(norms)} tensors, norm {sum(norms.values()) ** 0.5:.4f}")
        return
    if args.kind == "candidate":
        write_candidate_deltas(p, args.name)
        return
    if args.lr is None or args.epoch is None:
        raise ValueError(f"--kind {args.kind} needs --lr and --epoch")
    require(args.lr, ft.lrs, "finetune.lrs", "--lr")
    require(args.epoch, p["sweep"].epochs, "sweep.epochs", "--epoch")
    tag = run_tag(args.lr, args.epoch)
    if args.kind == "graft":
        check_compatible(ft.donor, models.post)  # the graft is applied to post: catch a mismatch before any work
        pair = (f"models/finetuned/donor_lr{args.lr}/epoch{args.epoch}", ft.donor)
    else:
        pair = (f"models/finetuned/sft_lr{args.lr}/epoch{args.epoch}", models.post)
    with atomic_dir(f"tensors/delta/{args.kind}_{tag}") as tmp:
        norms = nonzero_delta(*pair, tmp, args.lr)
    print(f"delta {args.kind}_{tag}: {len(norms)} tensors, norm {sum(norms.values()) ** 0.5:.4f}")


def nonzero_delta(ft: str, start: str, out, lr: float) -> dict[str, float]:
    """``ft - start`` into ``out``; a zero delta is an error (raised inside an atomic_dir block: nothing is written)."""
    norms = write_delta(ft, start, out)
    if not any(norms.values()):
        raise ValueError(f"{ft} equals {start} in every weight: the finetune at lr {lr} learned nothing by this "
                         "epoch, and a zero delta would score as the post model under every method (check "
                         "finetune.lrs and the training data)")
    return norms


def write_candidate_deltas(p, name: str | None) -> None:
    """Every swept snapshot of one donor candidate's finetune minus the candidate, in one folder (one stage's out)."""
    donors = p["donors"]
    if name is None:
        raise ValueError("--kind candidate needs --name")
    require(name, donors.candidates, "donors.candidates", "--name")
    model = donors.candidates[name]
    check_compatible(model, p["models"].post)  # grafted onto post like finetune.donor's delta
    with atomic_dir(f"tensors/delta/candidate_{name}") as tmp:
        for ep in p["sweep"].epochs:
            tag = run_tag(donors.lr, ep)
            norms = nonzero_delta(f"models/finetuned/candidate_{name}/epoch{ep}", model, tmp / tag, donors.lr)
            print(f"delta candidate_{name}/{tag}: {len(norms)} tensors, norm {sum(norms.values()) ** 0.5:.4f}")


if __name__ == "__main__":
    run_stage(main)
