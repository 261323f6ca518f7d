"""delta: the task vector of a finetune, fp32 safetensors keyed by parameter name, streamed tensor by tensor.

python -m stages.delta --kind graft  ->  tensors/delta/graft/  (donor_ft - donor, sharded like donor_ft)
python -m stages.delta --kind sft    ->  tensors/delta/sft/    (sft - post)
"""
from __future__ import annotations

import argparse

from graft.atomic import atomic_dir
from graft.merging import write_delta
from graft.schema import load_params
from graft.tensors import check_compatible


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["graft", "sft"], required=True)
    kind = ap.parse_args().kind
    ft, models = load_params("finetune", "models")
    if kind == "graft":
        check_compatible(ft.donor, models.post)  # the graft is applied to post: catch a mismatch before any work
        pair = ("models/finetuned/donor", ft.donor)
    else:
        pair = ("models/finetuned/sft", models.post)
    with atomic_dir(f"tensors/delta/{kind}") as tmp:
        norms = write_delta(*pair, tmp)
    print(f"delta {kind}: {len(norms)} tensors, norm {sum(norms.values()) ** 0.5:.4f}")


if __name__ == "__main__":
    main()
