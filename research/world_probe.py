"""Probe a world design in memory: is post-training a small perturbation, and does a donor delta carry the new task?

    python research/world_probe.py --chat-frac 0.3 --chat-suites all --post-lr 3e-4 --post-steps 100

Builds the world's data and tokenizer as `graft.world` does, with two levers the `world` stage does not have yet:
a share of the pretraining corpus rendered as chat turns (``--chat-frac``, for the old suites or for all suites
incl. the new one) and the post-training learning rate/steps. Then measures, with greedy decoding on held-out
problems (a quick proxy for the pipeline's sampled pass@1):
- relative weight change ||post - base|| / ||base||, accuracy along base -> post;
- donor (base) and SFT (post) finetunes on the new task in the student's style (ideal SynthSelf rewrites);
- graft post + lam * (donor_ft - base) and SFT + merge post + lam * (sft - post) at several lambdas;
- cosine between the graft and SFT deltas.
Prints one JSON line. Research code: not a pipeline stage, not tested.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import re
import time

import torch
import yaml

from graft.chat import AnswerFormat, ChatFormat, ChatSpec
from graft.family_chat import render_prompt, render_response
from graft.generation import HFGenerator, SamplingSpec
from graft.grading import Grader
from graft.modeling import new_model, qwen3_config, train_tokenizer
from graft.params import Section
from graft.tasks import OLD_SUITES
from graft.training import OptimConfig, SFTExample, finetune_sft
from graft.world import NEW_SUITE, build_data, posttrain, posttrain_examples, pretrain, pretraining_corpus
from operator_confusion import ADD_STEP  # research/ is the script's directory, so on sys.path


def section(d):
    return Section({k: section(v) if isinstance(v, dict) else v for k, v in d.items()})


def family_format(tokenizer, thinking=True) -> ChatFormat:
    return ChatFormat(tokenizer, ChatSpec(thinking), AnswerFormat("answer_tag"))


def greedy(model, tokenizer, problems, thinking=True) -> list[str]:
    fmt = family_format(tokenizer, thinking)
    g = HFGenerator.from_model(model, tokenizer, fmt.stop_ids, fmt.pad_id, batch_size=64)
    outs = g.generate([fmt.prompt_ids(q.question) for q in problems],
                      SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=64, seed=0))
    return [o[0].text for o in outs]


def accuracy(model, tokenizer, problems, thinking=True) -> float:
    texts = greedy(model, tokenizer, problems, thinking)
    grade = Grader(ChatSpec(thinking), AnswerFormat("answer_tag"), "math")
    return sum(grade(t, q.answer)[1] for t, q in zip(texts, problems)) / len(problems)


def routed_to_addition(model, tokenizer, problems, thinking=True) -> float:
    """Share of subtraction prompts answered with an addition trace: the paper's epsilon (section 3)."""
    return sum(bool(ADD_STEP.search(t)) for t in greedy(model, tokenizer, problems, thinking)) / len(problems)


def flat(model) -> torch.Tensor:
    return torch.cat([p.detach().flatten().float() for p in model.parameters()])


def with_weights(model, vec):
    m = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(vec, m.parameters())
    return m


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--chat-frac", type=float, default=0.0)
    ap.add_argument("--chat-suites", default="all",
                    help="old | all | a comma list of suites; repeating one weights it: add,reverse,add,reverse,sub")
    ap.add_argument("--sub-raw", type=int, default=-1,
                    help="raw-text subtraction problems in pretraining (-1: world.corpus_problems, as every suite)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--pretrain-steps", type=int, default=600)
    ap.add_argument("--post-lr", type=float, default=1e-3)
    ap.add_argument("--post-steps", type=int, default=200)
    ap.add_argument("--ft-lr", type=float, default=1e-3)
    ap.add_argument("--ft-epochs", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=0, help="student hidden size (0: params.yaml)")
    ap.add_argument("--post-suites", default="add,reverse")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    raw = yaml.safe_load(open("params.yaml"))["world"]
    raw["seed"] = args.seed
    raw["pretrain"]["steps"] = args.pretrain_steps
    raw["posttrain"].update(lr=args.post_lr, steps=args.post_steps)
    if args.hidden:
        raw["student"].update(hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                              num_attention_heads=args.hidden // 32)
    p = section(raw)
    thinking = True
    rng = random.Random(p.seed)
    torch.manual_seed(p.seed)
    data = build_data(p, rng)
    taken = {q.problem_id for qs in data.values() for q in qs}
    suites = {"all": (*OLD_SUITES, NEW_SUITE), "old": OLD_SUITES}.get(args.chat_suites)
    suites = suites or tuple(args.chat_suites.split(","))
    corpus = pretraining_corpus(p.corpus_problems, rng, taken, args.chat_frac, suites, thinking)
    if args.sub_raw >= 0:  # thin the raw subtraction text: a weak skill the chat turns still route correctly
        raw_sub = [t for t in corpus if re.match(r"\d+-\d+=\? ", t)]
        drop = set(raw_sub[args.sub_raw:])
        corpus = [t for t in corpus if t not in drop]
    post_ex = [e for e in posttrain_examples(p.posttrain.n_examples, rng, taken, rewrite=False)]
    tok_texts = corpus + [render_prompt(e.question, thinking) + render_response(e.think, e.answer, thinking)
                          for e in post_ex[:2000]] + [q.teacher_trace for q in data["hard_pool"]]
    tokenizer = train_tokenizer(tok_texts, p.tokenizer_vocab_size)
    model = new_model(qwen3_config(tokenizer, p.student, p.max_position_embeddings), p.seed)
    pretrain(model, tokenizer, corpus, p.pretrain, p.seed, p.pretrain.steps, "pretrain")
    base = copy.deepcopy(model)
    posttrain(model, tokenizer, post_ex, p.posttrain, thinking, p.seed, "post-train", args.post_lr)
    post = model
    hard = data["hard_pool"]
    train, held = hard[:224], hard[224:]
    old = {s: data[s] for s in OLD_SUITES}

    def scores(m) -> dict:
        o = {s: accuracy(m, tokenizer, qs) for s, qs in old.items()}
        return {"new": accuracy(m, tokenizer, held), "old": sum(o.values()) / len(o), **o}

    wb, wp = flat(base), flat(post)
    out = {"args": vars(args), "rel_change_post": float((wp - wb).norm() / wb.norm()),
           "base": scores(base), "post": scores(post),
           "epsilon": {"base": routed_to_addition(base, tokenizer, held),
                       "post": routed_to_addition(post, tokenizer, held)}}
    out["base_to_post"] = {t: scores(with_weights(base, wb + t * (wp - wb)))["old"] for t in (0.25, 0.5, 0.75)}
    ft_ex = [SFTExample(q.question, q.student_trace, q.answer) for q in train]
    cfg = OptimConfig(lr=args.ft_lr)
    donor = copy.deepcopy(base)
    finetune_sft(donor, family_format(tokenizer, thinking), ft_ex, 192, 16, args.ft_epochs, cfg, 0, "donor")
    sft = copy.deepcopy(post)
    finetune_sft(sft, family_format(tokenizer, thinking), ft_ex, 192, 16, args.ft_epochs, cfg, 0, "sft")
    dg, ds = flat(donor) - wb, flat(sft) - wp
    out["donor_ft"], out["sft"] = scores(donor), scores(sft)
    out["rel_delta_graft"], out["rel_delta_sft"] = float(dg.norm() / wp.norm()), float(ds.norm() / wp.norm())
    out["cos_graft_sft"] = float(torch.nn.functional.cosine_similarity(dg, ds, dim=0))
    out["graft"] = {lam: scores(with_weights(post, wp + lam * dg)) for lam in (0.25, 0.5, 1.0, 1.5)}
    out["sft_merge"] = {lam: scores(with_weights(post, wp + lam * ds)) for lam in (0.25, 0.5, 0.75)}
    out["seconds"] = round(time.time() - t0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
