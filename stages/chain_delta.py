"""chain_delta: a chain step's delta, donor_ft - donor (graft.chain), shared by every graft chain.

python -m stages.chain_delta --step S  ->  tensors/chain/delta/S/ (fp32, streamed tensor by tensor)
"""
from __future__ import annotations


from graft.atomic import atomic_dir
from graft.chain import MODELS, delta_dir, params_and_step
from graft.cli import run_stage
from graft.tensors import check_compatible
from stages.delta import nonzero_delta


def main() -> None:
    p, step = params_and_step()
    donor = p["finetune"].donor
    check_compatible(donor, p["models"].post)   # every chain adds it to a model of post's shape
    with atomic_dir(delta_dir(step.name)) as tmp:
        norms = nonzero_delta(str(MODELS / "donor" / step.name / f"epoch{step.epochs}"), donor, tmp, step.lr)
    print(f"chain_delta {step.name}: {len(norms)} tensors, norm {sum(norms.values()) ** 0.5:.4f}")


if __name__ == "__main__":
    run_stage(main)
