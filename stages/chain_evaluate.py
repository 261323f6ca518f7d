"""chain_evaluate: every chain's model after one step, on every task so far and the old suites (graft.chain).

python -m stages.chain_evaluate --step S  ->  reports/chain/eval/S/
    points.json             per model (post, each chain's model after S, joint SFT up to S): pass@1 (and pass@k) on
                            the held-out suite of every step up to S and on every graded old suite, the old task (their
                            mean), and the retention KL to post and to the model the chain had before S
    samples/<model>.parquet one row per sample, with its grade (graft.evaluation.SAMPLE_COLUMNS)
One engine scores every model (each written into it in place, as the single-step sweep). A step's held-out suite is
sampled evaluate.n_samples times at evaluate.temperature; a suite graded ``fact`` greedily once (exact recall, as the
knowledge task of the single-step pipeline). Both KLs are per-token, on the post model's retention rollouts (the fisher
stage's): the second takes the chain's previous model as the reference instead of post.
"""
from __future__ import annotations

import time

import pandas as pd
from tqdm import tqdm

from graft.atomic import atomic_dir, write_json, write_parquet
from graft.chain import CHAINS, DATA, JOINT, ROOT, params_and_step, read_state, state_file
from graft.chat import AnswerFormat, ChatFormat, ChatSpec, answer_format, open_chat
from graft.cli import run_stage
from graft.evaluation import SUITES, Suite, sample_and_grade, task_metrics
from graft.generation import SamplingSpec, open_generator
from graft.grading import Grader
from graft.modeling import load_tokenizer, resolve_device
from graft.openmp import use_threads
from graft.params import Section
from graft.points import POINT_LOADER, point_tensors
from graft.retention_kl import RetentionKL, read_rollouts
from graft.registry import PERPLEXITY
from graft.tables import read_parquet, read_table

OUT = "reports/chain/eval"


def step_suites(allp, heldouts: pd.DataFrame) -> tuple[dict[str, Suite], dict[str, Suite]]:
    """Every step's held-out suite so far, by step name, graded and sampled as its params said; and every graded
    old suite (as the single-step evaluation samples them)."""
    p, gen, chat, answer, models = (allp[s] for s in ("evaluate", "generation", "chat", "answer", "models"))
    tokenizer = load_tokenizer(models.post, models.trust_remote_code)
    spec_chat = ChatSpec.from_params(chat)
    sampled = SamplingSpec(n=p.n_samples, temperature=p.temperature, top_p=gen.top_p,
                           max_new_tokens=p.max_new_tokens, seed=p.seed)
    greedy = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=p.max_new_tokens, seed=p.seed)
    out = {}
    for name, rows in heldouts.groupby("step", sort=False):
        first = rows.iloc[0]
        fmt: AnswerFormat = answer_format(answer, Section(format=first.format, instruction=first.instruction))
        chat_fmt = ChatFormat(tokenizer, spec_chat, fmt, models.post)
        out[str(name)] = Suite(rows[["problem_id", "question", "answer"]].reset_index(drop=True),
                               f"{DATA}/{name}/heldout.parquet", chat_fmt, Grader(spec_chat, fmt, first.grader),
                               greedy if first.grader == "fact" else sampled)
    old = {}
    for name, suite in sorted(allp["data"].old_suites.items()):
        if suite.grader == PERPLEXITY:
            continue
        fmt = answer_format(answer, suite)
        path = SUITES / f"{name}.parquet"
        old[name] = Suite(read_table(path, "problems"), str(path), ChatFormat(tokenizer, spec_chat, fmt, models.post),
                          Grader(spec_chat, fmt, suite.grader), sampled)
    return out, old


def main() -> None:
    allp, step = params_and_step()
    models, gen, p = allp["models"], allp["generation"], allp["evaluate"]
    use_threads(allp["compute"].threads)
    device = resolve_device(allp["compute"].device)
    tasks, old = step_suites(allp, read_parquet(DATA / step.name / "heldouts.parquet"))
    # what each model is (its directory, checked against its state) and the model its chain had before this step
    memo: dict[str, str] = {}
    points = {"post": (models.post, models.post)}
    for method in (*CHAINS, JOINT):
        points[method] = (read_state(state_file(method, step.name), memo),
                          read_state(state_file(method, step.after), memo))
    fmt = open_chat(models.post, allp["chat"], allp["answer"], models.trust_remote_code)
    records: dict[str, dict] = {}
    samples: dict[str, pd.DataFrame] = {}
    t0 = time.perf_counter()
    generator = open_generator(models.post, gen, fmt, models.trust_remote_code, POINT_LOADER, device)
    try:
        for name, (model, _) in tqdm(points.items(), desc=f"chain evaluate {step.name}", mininterval=2.0):
            generator.load_point(model, None, None)
            # post is scored on this step's task alone: its scores on earlier tasks were taken at their steps
            mine = {step.name: tasks[step.name]} if name == "post" else tasks
            frames = [sample_and_grade(generator, s, f"step:{t}") for t, s in mine.items()]
            frames += [sample_and_grade(generator, old[n], f"old:{n}") for n in sorted(old)]
            table = pd.concat(frames, ignore_index=True)
            rec: dict = {"model": str(model)}
            for task in dict.fromkeys(table.task):
                n = (mine[task[5:]] if task.startswith("step:") else old[task[4:]]).spec.n
                rec[task] = task_metrics(table[table.task == task], n, p.pass_k)
            rec["old_task"] = sum(rec[f"old:{n}"]["pass@1"] for n in old) / len(old)
            records[name], samples[name] = rec, table
            print(f"chain evaluate {step.name} {name}: " + ", ".join(
                f"{k} {v['pass@1']:.3f}" for k, v in rec.items() if isinstance(v, dict)))
    finally:
        generator.close()
    rollouts = read_rollouts()
    meter = RetentionKL(models.post, rollouts, fmt.pad_id, models.trust_remote_code, device, allp["fisher"].chunk)
    for name, (model, before) in points.items():
        records[name]["kl_post"] = meter.measure(point_tensors(model, None, None))["token"]
    for name, (model, before) in points.items():   # the previous model as the reference (post for the first step)
        if step.after == ROOT or name == "post":
            records[name]["kl_previous"] = records[name]["kl_post"]
            continue
        ref = RetentionKL(before, rollouts, fmt.pad_id, models.trust_remote_code, device, allp["fisher"].chunk)
        records[name]["kl_previous"] = ref.measure(point_tensors(model, None, None))["token"]
        del ref
    with atomic_dir(f"{OUT}/{step.name}") as tmp:
        (tmp / "samples").mkdir()
        for name, table in samples.items():
            write_parquet(tmp / "samples" / f"{name}.parquet", table)
        write_json(tmp / "points.json", records)
    print(f"chain evaluate {step.name}: {len(points)} models in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    run_stage(main)
