"""Probe a knowledge-injection world in memory: can the family learn new facts that generalise to held-out phrasings?

    python research/knowledge_probe.py --fact-entities 100 --ft-lrs 1e-4,1e-3

The committed world's language is arithmetic only (its tokenizer and pretraining never saw English), so injected
facts cannot be recalled in unseen phrasings by any method. This probe adds to the world's pretraining corpus facts
about *other* invented entities, as chat turns in every phrasing (an empty think block, as the injection data has),
so that pretraining teaches the language of facts and that phrasings are interchangeable; injection then only has
to add entities. The rest is the world of params.yaml (arithmetic mix, post-training on add and reverse).
Measured with greedy decoding (the pipeline's knowledge grading: exact match after normalisation):
- recall of the pretraining facts (base, post), held-out-phrasing recall of the injected facts (should be ~0);
- donor (base) and SFT (post) finetunes on the injection mix (training phrasings + math replay traces), per lr;
- graft post + lam * (donor_ft - base) and SFT + merge post + lam * (sft - post): recall / old-task accuracy.
Prints one JSON line. Research code: not a pipeline stage, not tested.
"""
from __future__ import annotations

import argparse
import copy
import json
import random
import time

import torch
import yaml

from graft.chat import AnswerFormat, ChatSpec
from graft.family_chat import render_prompt, render_response
from graft.grading import Grader
from graft.injection import number_phrasings, split_phrasings
from graft.knowledge import invent_facts, phrasing_table
from graft.modeling import new_model, qwen3_config, train_tokenizer
from graft.tasks import OLD_SUITES
from graft.training import OptimConfig, SFTExample, finetune_sft
from graft.world import build_data, posttrain, posttrain_examples, pretrain, pretraining_corpus
from world_probe import accuracy, family_format, flat, greedy, section, with_weights  # research/ is on sys.path


def recall(model, tokenizer, qa) -> float:
    texts = greedy(model, tokenizer, qa, thinking=True)
    grade = Grader(ChatSpec(True), AnswerFormat("answer_tag"), "fact")
    return sum(grade(t, q.answer)[1] for t, q in zip(texts, qa)) / len(qa)


class QA:  # the probe's greedy() reads .question
    def __init__(self, question: str, answer: str):
        self.question, self.answer = question, answer


def phrase_facts(facts, kp: dict):
    """(train, heldout) QA pairs of ``facts`` as the knowledge stage splits them."""
    qa = number_phrasings(phrasing_table(facts, kp["invent"]["phrasings"]), "probe", "knowledge")
    return split_phrasings(qa, kp["heldout_phrasings"], "probe")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fact-entities", type=int, default=100, help="invented entities whose facts pretraining holds")
    ap.add_argument("--fact-repeats", type=int, default=1, help="copies of every pretraining fact turn")
    ap.add_argument("--pretrain-steps", type=int, default=0, help="0: params.yaml")
    ap.add_argument("--ft-lrs", default="1e-4,1e-3")
    ap.add_argument("--ft-epochs", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.time()
    params = yaml.safe_load(open("params.yaml"))
    raw, kp = params["world"], params["knowledge"]
    raw["seed"] = args.seed
    if args.pretrain_steps:
        raw["pretrain"]["steps"] = args.pretrain_steps
    p = section(raw)
    thinking = True
    rng = random.Random(p.seed)
    torch.manual_seed(p.seed)
    data = build_data(p, rng)
    taken = {q.problem_id for qs in data.values() for q in qs}
    corpus = pretraining_corpus(p.corpus_problems, rng, taken, p.pretrain.chat_fraction,
                                tuple(p.pretrain.chat_suites), thinking)

    injected = invent_facts(kp["invent"]["entities"], kp["invent"]["relations_per_entity"], kp["seed"])
    inj_names = {f.entity for f in injected} | {f.answer for f in injected}
    # pretraining entities: a different seed; drop any whose name or answer collides with the injected world (this
    # also drops every fact whose answer is an animal or a year any injected fact has). The pipeline's lever
    # (world.pretrain.fact_entities, graft.world.pretraining_facts) keeps all facts and keeps *names* apart instead.
    pre = [f for f in invent_facts(args.fact_entities, kp["invent"]["relations_per_entity"], 10_000 + p.seed)
           if f.entity not in inj_names and f.answer not in inj_names]
    pre_train, pre_held = phrase_facts(pre, kp)
    pre_all = list(pre_train.itertuples()) + list(pre_held.itertuples())
    fact_turns = [render_prompt(r.question, thinking) + render_response("", r.answer, thinking) for r in pre_all]
    corpus = corpus + fact_turns * args.fact_repeats
    rng.shuffle(corpus)

    post_ex = posttrain_examples(p.posttrain.n_examples, rng, taken, rewrite=False)
    tok_texts = corpus + [render_prompt(e.question, thinking) + render_response(e.think, e.answer, thinking)
                          for e in post_ex[:2000]] + [q.teacher_trace for q in data["hard_pool"]]
    tokenizer = train_tokenizer(tok_texts, p.tokenizer_vocab_size)
    model = new_model(qwen3_config(tokenizer, p.student, p.max_position_embeddings), p.seed)
    pretrain(model, tokenizer, corpus, p.pretrain, p.seed, p.pretrain.steps, "pretrain")
    base = copy.deepcopy(model)
    posttrain(model, tokenizer, post_ex, p.posttrain, thinking, p.seed, "post-train", p.posttrain.lr)
    post = model

    inj_train, inj_held = phrase_facts(injected, kp)
    held = [QA(r.question, r.answer) for r in inj_held.itertuples()][:128]
    seen = [QA(r.question, r.answer) for r in inj_train.sample(n=min(128, len(inj_train)), random_state=0).itertuples()]
    pre_probe = [QA(r.question, r.answer)
                 for r in pre_held.sample(n=min(128, len(pre_held)), random_state=0).itertuples()]
    old = {s: data[s] for s in OLD_SUITES}

    def scores(m) -> dict:
        o = {s: accuracy(m, tokenizer, qs) for s, qs in old.items()}
        return {"new": recall(m, tokenizer, held), "seen": recall(m, tokenizer, seen),
                "old": sum(o.values()) / len(o), **o}

    wb, wp = flat(base), flat(post)
    out = {"args": vars(args), "pretrain_facts": len(pre), "rel_change_post": float((wp - wb).norm() / wb.norm()),
           "pretrain_fact_recall": {"base": recall(base, tokenizer, pre_probe),
                                    "post": recall(post, tokenizer, pre_probe)},
           "base": scores(base), "post": scores(post)}
    # injection mix as the pipeline builds it: QA pairs with an empty think block + math traces that keep thinking
    replay = [SFTExample(q.question, q.teacher_trace, q.answer) for q in data["hard_pool"][:224]]
    ft_ex = [SFTExample(r.question, "", r.answer) for r in inj_train.itertuples()] + replay
    for lr in [float(x) for x in args.ft_lrs.split(",")]:
        cfg = OptimConfig(lr=lr)
        donor = copy.deepcopy(base)
        finetune_sft(donor, family_format(tokenizer, thinking), ft_ex, 192, 16, args.ft_epochs, cfg, 0,
                     f"donor lr {lr}")
        sft = copy.deepcopy(post)
        finetune_sft(sft, family_format(tokenizer, thinking), ft_ex, 192, 16, args.ft_epochs, cfg, 0,
                     f"sft lr {lr}")
        dg, ds = flat(donor) - wb, flat(sft) - wp
        out[f"lr{lr}"] = {
            "donor_ft": scores(donor), "sft": scores(sft),
            "rel_delta_graft": float(dg.norm() / wp.norm()), "rel_delta_sft": float(ds.norm() / wp.norm()),
            "cos_graft_sft": float(torch.nn.functional.cosine_similarity(dg, ds, dim=0)),
            "graft": {lam: scores(with_weights(post, wp + lam * dg)) for lam in (0.5, 0.75, 1.0)},
            "sft_merge": {lam: scores(with_weights(post, wp + lam * ds)) for lam in (0.5, 0.75, 1.0)}}
    out["seconds"] = round(time.time() - t0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
