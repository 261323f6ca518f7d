"""synthself: choose the aligner (SynthSelf Eq. 6) and keep its rewrites that kept the gold answer.

-> data/offpolicy/synthself.parquet (accepted rows of the chosen aligner, ``offpolicy`` schema),
   reports/synthself/aligners.parquet (every candidate: accuracy R, student NLL L, the student's own R and the
   student's NLL on the gold solutions, eligibility, choice), reports/synthself/summary.json
A rewrite is dropped when its answer differs from the gold answer, never replaced by the gold solution. If no
candidate satisfies both constraints the table is empty (with a warning naming the numbers): a valid result when
another source is trained on; finetuning on it fails there.
"""
from __future__ import annotations

import pandas as pd

from graft.atomic import write_json, write_parquet
from graft.chat import open_chat
from graft.cli import run_stage
from graft.openmp import use_threads
from graft.likelihood import mean_token_nll
from graft.modeling import load_model, resolve_device
from graft.offpolicy import COLUMNS, select_aligner
from graft.schema import load_params
from graft.tables import read_table


def main() -> None:
    p, chat, answer, models, compute = load_params("synthself", "chat", "answer", "models", "compute")
    train = read_table("data/mined/train.parquet", "hard_pool")
    tables = {n: pd.read_parquet(f"reports/synthself/rewrites/{n}.parquet") for n in [*sorted(p.aligners), "student"]}
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    student = load_model(models.post, "float32", models.trust_remote_code, resolve_device(compute.device))
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    gold_nll = float(pd.Series(mean_token_nll(student, [
        (fmt.prompt_ids(q), fmt.response_ids(s, a))
        for q, s, a in zip(train["question"], train["solution"], train["answer"])], fmt.pad_id)).mean())
    student_acc = float(tables["student"].accepted.mean())
    cands = pd.DataFrame([{"name": n, "model": p.aligners[n], "accuracy": float(tables[n].accepted.mean()),
                           "nll": float(tables[n].student_nll.mean())} for n in sorted(p.aligners)])
    cands["student_accuracy"], cands["gold_nll"] = student_acc, gold_nll
    cands["eligible"] = (cands.nll < gold_nll) & (cands.accuracy > student_acc)
    chosen = select_aligner(cands, student_acc, gold_nll)
    cands["chosen"] = cands.name == chosen
    write_parquet("reports/synthself/aligners.parquet", cands)
    print(cands.to_string(index=False))
    if chosen is None:
        print("synthself: WARNING no aligner satisfies Eq. 6 (student NLL of its rewrites below the gold NLL "
              f"{gold_nll:.3f} and accuracy above the student's {student_acc:.3f}); the table is empty")
        kept = tables["student"].iloc[:0]
    else:
        kept = tables[chosen][tables[chosen].accepted]
    write_json("reports/synthself/summary.json", {
        "aligner": chosen, "rewrites": len(train), "accepted": len(kept), "acceptance_rate": len(kept) / len(train),
        "student_accuracy": student_acc, "gold_nll": gold_nll})
    write_parquet("data/offpolicy/synthself.parquet", kept[COLUMNS].reset_index(drop=True))
    print(f"synthself: aligner {chosen}, accepted {len(kept)}/{len(train)} rewrites")


if __name__ == "__main__":
    run_stage(main)
