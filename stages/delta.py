"""delta: the task vector of a finetune, fp32 safetensors keyed by parameter name.

python -m stages.delta --kind graft  ->  tensors/delta/graft.safetensors  (donor_ft - donor)
python -m stages.delta --kind sft    ->  tensors/delta/sft.safetensors    (sft - post)
"""
from __future__ import annotations

import argparse

from graft.atomic import atomic_file
from graft.merging import compute_delta
from graft.params import load_params
from graft.tensors import check_compatible, save_tensors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["graft", "sft"], required=True)
    kind = ap.parse_args().kind
    ft, models = load_params("finetune", "models")
    if kind == "graft":
        base = ft.donor
        check_compatible(base, models.post)  # the graft is applied to post: catch a mismatch before any work
        delta = compute_delta("models/finetuned/donor", base)
    else:
        delta = compute_delta("models/finetuned/sft", models.post)
    with atomic_file(f"tensors/delta/{kind}.safetensors") as tmp:
        save_tensors(tmp, delta)
    norm = sum(float(d.pow(2).sum()) for d in delta.values()) ** 0.5
    print(f"delta {kind}: {len(delta)} tensors, {sum(d.numel() for d in delta.values())} entries, norm {norm:.4f}")


if __name__ == "__main__":
    main()
