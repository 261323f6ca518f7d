"""propose: a lambda (and rho) per delta family that spends a retention-KL budget, before any evaluation.

python -m stages.propose
-> reports/kl/proposed.parquet: every delta of reports/kl/forms.parquet with the largest lam (<= propose.max_lam)
   whose per-token retention KL is within propose.kl_budget, and, per family and finetune snapshot, the chosen
   candidate (for a masked family the rho applying the most of the update). propose.predictor: measured (the KL on
   the fisher stage's rollouts, bisected on lam with a few forward passes of the post model and the point: no
   engine, no sampling) or a Fisher form of predict_kl (kfac | diagonal | directional: closed form, no model). The
   evaluate stage scores the chosen ones as proposed_<family>_<snapshot> points beside the sweep.
"""
from __future__ import annotations

from graft.atomic import write_parquet
from graft.chat import open_chat
from graft.cli import run_stage
from graft.openmp import use_threads
from graft.kl_prediction import FORMS, PROPOSED, propose
from graft.modeling import resolve_device
from graft.points import point_tensors
from graft.retention_kl import RetentionKL, read_rollouts
from graft.schema import load_all
from graft.tables import read_parquet


def main() -> None:
    allp = load_all()
    p, models = allp["propose"], allp["models"]
    measure = None
    if p.predictor == "measured":
        pad = open_chat(models.post, allp["chat"], allp["answer"], models.trust_remote_code).pad_id
        use_threads(allp["compute"].threads)   # before any torch work (graft.openmp)
        meter = RetentionKL(models.post, read_rollouts(), pad,
                            models.trust_remote_code, resolve_device(allp["compute"].device), allp["fisher"].chunk)

        def measure(delta: str, lam: float) -> float:
            return meter.measure(point_tensors(models.post, delta, lam))["token"]

    out = propose(read_parquet(FORMS), p.kl_budget, p.predictor, p.max_lam, measure)
    write_parquet(PROPOSED, out)
    print(out[out.chosen][["family", "lr", "epoch", "rho", "lam", "predicted_kl", "applied",
                           "evaluations"]].to_string(index=False))


if __name__ == "__main__":
    run_stage(main)
