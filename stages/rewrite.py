"""rewrite: one SynthSelf candidate (or the student itself) greedily rewrites every gold solution.

python -m stages.rewrite --name <key of synthself.aligners, or student>
-> reports/synthself/rewrites/<name>.parquet: every rewrite, its extracted answer, whether it kept the gold answer,
   and its mean per-token NLL under the student (the post model, prompted with the plain question).
"""
from __future__ import annotations

import argparse

from graft.atomic import write_parquet
from graft.chat import open_chat
from graft.cli import run_stage
from graft.openmp import use_threads
from graft.generation import SamplingSpec, open_generator, table_labels
from graft.grading import Grader
from graft.likelihood import mean_token_nll
from graft.modeling import load_model, resolve_device
from graft.offpolicy import accept_rewrites
from graft.schema import load_params
from graft.tables import read_table
from graft.tasks import rewrite_question


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    name = ap.parse_args().name
    p, gen, chat, answer, models, compute = load_params("synthself", "generation", "chat", "answer", "models",
                                                        "compute")
    if name != "student" and name not in p.aligners:
        raise ValueError(f"--name {name} is not a key of params.yaml synthself.aligners {sorted(p.aligners)}")
    model_dir = models.post if name == "student" else p.aligners[name]
    train = read_table("data/mined/train.parquet", "hard_pool")
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    device = resolve_device(compute.device)
    # the candidate writes in its own family's template (same tokenizer as the student: check_compatible)
    cand = open_chat(model_dir, chat, answer, models.trust_remote_code)
    prompts = [cand.prompt_ids(rewrite_question(q, s)) for q, s in zip(train["question"], train["solution"])]
    generator = open_generator(model_dir, gen, cand, models.trust_remote_code, device=device)
    outs = generator.generate(prompts, SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=p.max_new_tokens,
                                                    seed=0),
                              labels=table_labels("data/mined/train.parquet (rewrite)", train["problem_id"]))
    generator.close()
    table = accept_rewrites(train, [o[0] for o in outs], Grader(cand.chat, cand.answer, "math"))
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    student = load_model(models.post, "float32", models.trust_remote_code, device)
    pairs = [(fmt.prompt_ids(q), list(o[0].token_ids)) for q, o in zip(train["question"], outs)]
    table["student_nll"] = mean_token_nll(student, pairs, fmt.pad_id)
    table["candidate"] = name
    write_parquet(f"reports/synthself/rewrites/{name}.parquet", table)
    print(f"rewrite {name}: {int(table.accepted.sum())}/{len(table)} kept the gold answer, "
          f"student NLL {table.student_nll.mean():.3f}/token")


if __name__ == "__main__":
    run_stage(main)
