"""star: STaR data, the post model's own verified successes on the mined training problems.

-> data/offpolicy/star.parquet (``offpolicy`` schema: one verified trace per solved problem),
   reports/star/counts.parquet (per problem: attempts, successes, kept sample), reports/star/summary.json
Up to ``star.attempts`` samples per problem at ``star.temperature``; the first verified one (sample order) is kept.
An empty table is a valid result here (a problem set the model never solves); finetuning on it fails there.
"""
from __future__ import annotations

from graft.atomic import write_json, write_parquet
from graft.chat import open_chat
from graft.cli import run_stage
from graft.openmp import use_threads
from graft.generation import SamplingSpec, open_generator, table_labels
from graft.grading import Grader
from graft.modeling import resolve_device
from graft.offpolicy import star_traces
from graft.schema import load_params
from graft.tables import read_table


def main() -> None:
    p, gen, chat, answer, models, compute = load_params("star", "generation", "chat", "answer", "models", "compute")
    train = read_table("data/mined/train.parquet", "hard_pool")
    fmt = open_chat(models.post, chat, answer, models.trust_remote_code)
    use_threads(compute.threads)   # before any torch work (graft.openmp)
    generator = open_generator(models.post, gen, fmt, models.trust_remote_code, device=resolve_device(compute.device))
    outs = generator.generate([fmt.prompt_ids(q) for q in train["question"]],
                              SamplingSpec(n=p.attempts, temperature=p.temperature, top_p=gen.top_p,
                                           max_new_tokens=p.max_new_tokens, seed=p.seed),
                              labels=table_labels("data/mined/train.parquet", train["problem_id"]))
    generator.close()
    traces, counts = star_traces(train, outs, Grader(fmt.chat, fmt.answer, "math"))
    write_parquet("reports/star/counts.parquet", counts)
    write_json("reports/star/summary.json", {"problems": len(train), "solved": len(traces),
                                             "attempts_per_problem": p.attempts,
                                             "solve_rate": len(traces) / len(train)})
    write_parquet("data/offpolicy/star.parquet", traces)
    print(f"star: {len(traces)}/{len(train)} problems solved in {p.attempts} attempts")


if __name__ == "__main__":
    run_stage(main)
