"""The finetuning driver (accumulation, resume, processes), DFT, and OPSD's divergence and objective."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from graft.distributed import DistInfo
from graft.finetuning import (SupervisedObjective, TrainSpec, epoch_plan, rank_micro_batches, token_loss_sum,
                              train)
from graft.modeling import load_model
from graft.opsd import (OPSDExample, OPSDObjective, demonstration_question, generalized_jsd, passage_question,
                        topk_divergence)
from graft.training import IGNORE, SFTExample, encode_sft, warmup_cosine
from tests.conftest import family_format, run_worker
from tests.ddp_worker import EXAMPLES
from tests.test_bad_inputs import box  # noqa: F401  (a fixture)


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.sum(p * np.log(p / q)))


P = np.array([0.7, 0.2, 0.05, 0.05])   # teacher
Q = np.array([0.02, 0.18, 0.4, 0.4])     # student


def _d(alpha: float) -> float:
    t, s = torch.tensor(np.log(P)), torch.tensor(np.log(Q))
    return float(generalized_jsd(t, s, alpha))


def test_d_alpha_endpoints_are_forward_and_reverse_kl():
    forward, reverse = _kl(P, Q), _kl(Q, P)
    assert abs(forward - reverse) > 0.1          # the case tells the two directions apart
    assert _d(0.0) == pytest.approx(forward, rel=1e-12)   # alpha 0: KL(teacher || student)
    assert _d(1.0) == pytest.approx(reverse, rel=1e-12)   # alpha 1: KL(student || teacher)


def test_d_alpha_half_is_jensen_shannon():
    m = (P + Q) / 2
    assert _d(0.5) == pytest.approx(0.5 * _kl(P, m) + 0.5 * _kl(Q, m), rel=1e-12)
    assert _d(0.5) <= math.log(2)


def test_d_alpha_interior_is_the_gkd_mixture_and_zero_on_equal():
    a = 0.3
    m = a * P + (1 - a) * Q
    assert _d(a) == pytest.approx(a * _kl(P, m) + (1 - a) * _kl(Q, m), rel=1e-12)
    same = torch.tensor(np.log(P))
    for alpha in (0.0, 0.3, 1.0):
        assert float(generalized_jsd(same, same, alpha)) == pytest.approx(0.0, abs=1e-15)
    with pytest.raises(ValueError, match="alpha"):
        generalized_jsd(same, same, 1.5)


def test_topk_divergence_uses_the_teachers_support():
    t = torch.tensor([[3.0, 2.0, -1.0, 0.5]])
    s = torch.tensor([[0.0, 1.0, 4.0, 0.0]])
    full = topk_divergence(t, s, 0.0, 10)
    assert float(full) == pytest.approx(float(generalized_jsd(t.log_softmax(-1), s.log_softmax(-1), 0.0)))
    # k=2: the teacher's top tokens are 0 and 1; the student's large logit on token 2 must not count
    top2 = topk_divergence(t, s, 0.0, 2)
    tk, sk = t[:, :2].log_softmax(-1), s[:, :2].log_softmax(-1)
    assert float(top2) == pytest.approx(float((tk.exp() * (tk - sk)).sum()))


def test_dft_weights_cross_entropy_by_detached_probability():
    logits = torch.randn(1, 5, 7, requires_grad=True)
    labels = torch.tensor([[IGNORE, IGNORE, 3, 1, 6]])
    ce = token_loss_sum(logits, labels, "sft")
    dft = token_loss_sum(logits, labels, "dft")
    logp = logits[0, :-1].log_softmax(-1)[torch.arange(4), labels[0, 1:].clamp(min=0)]
    keep = labels[0, 1:] != IGNORE
    assert float(ce) == pytest.approx(float(-(logp * keep).sum()), rel=1e-6)
    assert float(dft) == pytest.approx(float(-(logp.exp() * logp * keep).sum()), rel=1e-6)
    (g,) = torch.autograd.grad(dft, logits)
    (g_ce,) = torch.autograd.grad(-(logp.detach().exp() * logp * keep).sum(), logits)
    assert torch.allclose(g, g_ce)


def test_supervised_loss_ignores_every_prompt_token(tiny_tokenizer):
    ids, labels = encode_sft(family_format(tiny_tokenizer), EXAMPLES[0], 256)
    obj = SupervisedObjective([(ids, labels)], tiny_tokenizer.pad_token_id)
    n_resp = sum(1 for y in labels if y != IGNORE)
    assert obj.normalizer([0]) == n_resp
    logits = torch.randn(1, len(ids), len(tiny_tokenizer), requires_grad=True)
    token_loss_sum(logits, torch.tensor([labels])).backward()
    first_target = labels.index(next(y for y in labels if y != IGNORE))
    # positions before the last prompt token predict prompt tokens: no gradient reaches them
    assert float(logits.grad[0, : first_target - 1].abs().sum()) == 0.0
    assert float(logits.grad[0, first_target - 1].abs().sum()) > 0.0


def test_epoch_plan_and_rank_split_cover_every_example_once():
    plan = epoch_plan(10, 4, 3, seed=1)
    assert [len(e) for e in plan] == [3, 3, 3]
    for epoch in plan:
        assert sorted(i for b in epoch for i in b) == list(range(10))
    batch = [5, 1, 7, 2, 9]
    parts = [rank_micro_batches(batch, 2, r, 2) for r in range(2)]
    assert len(parts[0]) == len(parts[1]) == 2
    assert sorted(i for p in parts for c in p for i in c) == sorted(batch)
    assert parts[1][-1] == []   # an empty slot keeps DDP's collective calls in step


def _spec(**kw) -> TrainSpec:
    base = dict(lr=1e-3, epochs=2, global_batch=4, micro_batch=4, warmup_ratio=0.1, weight_decay=0.01,
                betas=(0.9, 0.95), grad_clip=1.0, seed=5)
    return TrainSpec(**{**base, **kw})


def _fit(model_dir, tok, spec, **kw):
    torch.use_deterministic_algorithms(True)
    model = load_model(model_dir)
    encoded = [encode_sft(family_format(tok), ex, 128) for ex in EXAMPLES]
    snaps = {}
    log = train(model, SupervisedObjective(encoded, tok.pad_token_id), len(encoded), spec,
                on_epoch_end=lambda e, m, w: snaps.__setitem__(e, {k: v.clone() for k, v in m.state_dict().items()}),
                **kw)
    return model, snaps, log


def test_warmup_moves_the_weights_from_the_first_step():
    # transformers' schedule gives step 0 a rate of 0: a one-step finetune would learn nothing
    assert [warmup_cosine(s, 2, 10) for s in range(3)] == [pytest.approx(1 / 3), pytest.approx(2 / 3), 1.0]
    assert all(0 < warmup_cosine(s, 1, 10) <= 1 for s in range(10))
    assert warmup_cosine(0, 1, 1) == 0.5 and warmup_cosine(9, 0, 10) > 0   # the last step too


def test_a_one_step_finetune_changes_every_trained_weight(tiny_model_dir, tiny_tokenizer):
    start = load_model(tiny_model_dir).state_dict()
    model, _, log = _fit(tiny_model_dir, tiny_tokenizer, _spec(epochs=1, global_batch=len(EXAMPLES)))
    assert len(log.curve) == 1 and log.curve[0]["lr"] == pytest.approx(0.5e-3)   # warmup 1 step: half the rate
    moved = [n for n, v in model.state_dict().items() if not torch.equal(v, start[n])]
    assert moved and "model.embed_tokens.weight" in moved


def test_gradient_accumulation_matches_the_full_batch(tiny_model_dir, tiny_tokenizer):
    full, _, l1 = _fit(tiny_model_dir, tiny_tokenizer, _spec(micro_batch=4))
    acc, _, l2 = _fit(tiny_model_dir, tiny_tokenizer, _spec(micro_batch=1))
    for (n, a), (_, b) in zip(full.state_dict().items(), acc.state_dict().items()):
        assert torch.allclose(a, b, rtol=0, atol=1e-5), n   # fp32 summation order only
    assert [r["loss"] for r in l1.curve] == pytest.approx([r["loss"] for r in l2.curve], rel=1e-5)


def test_resume_after_interruption_is_bitwise_the_uninterrupted_run(tiny_model_dir, tiny_tokenizer, tmp_path):
    ref, ref_snaps, ref_log = _fit(tiny_model_dir, tiny_tokenizer, _spec(checkpoint_every=1))
    work = tmp_path / "work"
    _, _, cut = _fit(tiny_model_dir, tiny_tokenizer, _spec(checkpoint_every=1), workdir=work, stop_after=3)
    assert len(cut.curve) == 3 and (work / "state" / "state.json").exists()
    resumed, snaps, log = _fit(tiny_model_dir, tiny_tokenizer, _spec(checkpoint_every=1), workdir=work)
    assert log.resumed_from == 3
    assert [r["loss"] for r in log.curve] == [r["loss"] for r in ref_log.curve]
    for (n, a), (_, b) in zip(ref.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), n
    assert set(snaps) == {2}  # epoch 1 finished before the cut; its snapshot is on disk, not re-made
    for k in ref_snaps[2]:
        assert torch.equal(ref_snaps[2][k], snaps[2][k])


def _worker(args: list[str], processes: int = 1) -> None:
    run_worker("ddp_worker.py", args, processes)


@pytest.fixture(scope="module")
def one_process_run(tiny_model_dir, tmp_path_factory):
    """The reference: one process, micro-batch 4 (final weights and epoch snapshots)."""
    out = tmp_path_factory.mktemp("one_process") / "one.safetensors"
    _worker([str(tiny_model_dir), str(out), "4"])
    return out


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tiny_model_dir, one_process_run, tmp_path):
    _worker([str(tiny_model_dir), str(tmp_path / "two.safetensors"), "1"], processes=2)
    one, two = load_file(str(one_process_run)), load_file(str(tmp_path / "two.safetensors"))
    assert one.keys() == two.keys()
    base = load_model(tiny_model_dir).state_dict()
    for k in one:
        # stated tolerance: 1e-5 absolute (fp32 reduction order differs: micro-batches, all-reduce)
        assert torch.allclose(one[k], two[k], rtol=0, atol=1e-5), k
    assert any(not torch.equal(one[k], base[k]) for k in one)   # it trained


@pytest.mark.slow
def test_two_fsdp_processes_match_one_process_and_resume_bitwise(tiny_model_dir, one_process_run, tmp_path):
    """FSDP2 (finetune.parallel: fsdp) over two gloo processes: the final weights and every epoch snapshot (gathered
    full state) match one process within 1e-5; a run stopped after 2 steps and resumed from its sharded checkpoint
    is bitwise the uninterrupted two-process run."""
    model = str(tiny_model_dir)
    _worker([model, str(tmp_path / "fsdp.safetensors"), "1", "fsdp"], processes=2)
    for name in ("", ".epoch1.safetensors", ".epoch2.safetensors"):   # final weights, then the snapshots
        a = load_file(f"{one_process_run}{name}")
        b = load_file(str(tmp_path / f"fsdp.safetensors{name}"))
        assert a.keys() == b.keys(), name
        for k in a:
            assert torch.allclose(a[k], b[k], rtol=0, atol=1e-5), (name, k)
    base = load_model(tiny_model_dir).state_dict()
    assert any(not torch.equal(load_file(str(tmp_path / "fsdp.safetensors"))[k], base[k]) for k in base)
    work = tmp_path / "work"
    _worker([model, str(tmp_path / "stopped.safetensors"), "1", "fsdp", str(work), "2"], processes=2)
    assert (work / "state" / "state.json").exists()
    _worker([model, str(tmp_path / "resumed.safetensors"), "1", "fsdp", str(work)], processes=2)
    whole, resumed = load_file(str(tmp_path / "fsdp.safetensors")), load_file(str(tmp_path / "resumed.safetensors"))
    assert all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.slow
def test_the_finetune_stage_under_two_processes_matches_one(box):
    """`python -m stages.finetune` with finetune.num_processes 2 relaunches itself under torchrun (two gloo
    processes), trains, leaves the group and exits 0; its snapshots and loss curve match the one-process stage's
    within 1e-5 (fp32 reduction order differs)."""
    import os
    import shutil
    import subprocess
    import sys

    import pandas as pd

    from tests.conftest import REPO
    from tests.test_bad_inputs import edit_params

    (box / "data/offpolicy").mkdir()
    pd.DataFrame({"problem_id": [f"e{i}" for i in range(len(EXAMPLES))], "question": [e.question for e in EXAMPLES],
                  "think": [e.think for e in EXAMPLES], "answer": [e.answer for e in EXAMPLES],
                  "source": "synthself"}).to_parquet(box / "data/offpolicy/synthself.parquet", index=False)
    out = box / "models/finetuned/sft_lr0.001"

    def run(processes: int) -> tuple[dict, list]:
        def edit(p):
            p["finetune"].update(epochs=2, global_batch_size=4, micro_batch_size=2, num_processes=processes)
            p["sweep"]["epochs"] = [2]
            p["compute"]["threads"] = 1   # two processes on two cores
        edit_params(box, edit)
        r = subprocess.run([sys.executable, "-m", "stages.finetune", "--target", "sft", "--lr", "0.001"], cwd=box,
                           env={**os.environ, "PYTHONPATH": str(REPO), "PYTHONFAULTHANDLER": "1"},
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-3000:]
        snaps = {e: load_file(str(out / f"epoch{e}/model.safetensors")) for e in (1, 2)}
        curve = json.loads((box / "reports/finetune/sft_lr0.001.json").read_text())
        shutil.rmtree(out)
        return snaps, curve

    one, one_curve = run(1)
    two, two_curve = run(2)
    assert [r["step"] for r in one_curve] == [r["step"] for r in two_curve] == list(range(1, 5))
    assert all(abs(a["loss"] - b["loss"]) < 1e-5 for a, b in zip(one_curve, two_curve))
    for e in (1, 2):
        assert one[e].keys() == two[e].keys()
        for k in one[e]:
            assert torch.allclose(one[e][k], two[e][k], rtol=0, atol=1e-5), (e, k)
    base = load_file(str(box / "models/post/model.safetensors"))
    assert any(not torch.equal(two[2][k], base[k]) for k in base if k in two[2])   # it trained


def test_opsd_objective_is_independent_of_the_micro_batch_split(tiny_model_dir, tiny_tokenizer):
    torch.use_deterministic_algorithms(True)
    student, teacher = load_model(tiny_model_dir), load_model(tiny_model_dir)
    examples = [OPSDExample(e.question, e.think, e.answer) for e in EXAMPLES[:3]]
    obj = OPSDObjective(teacher, tiny_tokenizer, family_format(tiny_tokenizer), examples, 0.5, 20, 1.0, 1.0, 12,
                        seed=3, max_len=128)
    whole, _ = obj.loss_sum(student, [0, 1, 2], step=4)
    parts = sum(obj.loss_sum(student, [i], step=4)[0] for i in range(3))
    assert float(whole) == pytest.approx(float(parts), rel=1e-5)
    assert float(whole) > 0
    other, _ = obj.loss_sum(student, [0, 1, 2], step=5)   # a new step samples new responses
    assert float(other) != float(whole)
    whole.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert any(p.grad is not None and float(p.grad.abs().sum()) > 0 for p in student.parameters())


def test_opsd_bounds_the_student_by_max_len_and_the_teacher_by_its_own_limit(tiny_model_dir, tiny_tokenizer):
    """The student's sequences are trained on (finetune.max_len); the teacher's prompt also holds the demonstration
    and runs without gradients, so it has its own bound (generation.max_model_len). Each error names its key."""
    teacher = load_model(tiny_model_dir)
    fmt = family_format(tiny_tokenizer)
    examples = [OPSDExample(e.question, e.think, e.answer) for e in EXAMPLES[:2]]
    student_len = max(len(fmt.prompt_ids(e.question)) for e in examples)
    teacher_len = max(len(fmt.prompt_ids(demonstration_question(e.question, e.think, e.answer))) for e in examples)
    assert teacher_len > student_len
    args = (teacher, tiny_tokenizer, fmt, examples, 0.5, 20, 1.0, 1.0, 4)
    # the teacher's prompt is past max_len: accepted, within its own bound
    ok = OPSDObjective(*args, seed=0, max_len=student_len + 4, teacher_max_len=teacher_len + 4)
    assert max(len(t) for t in ok.teacher_prompts) == teacher_len
    with pytest.raises(ValueError, match=r"teacher prompt .* exceeds generation.max_model_len"):
        OPSDObjective(*args, seed=0, max_len=student_len + 4, teacher_max_len=teacher_len + 3)
    with pytest.raises(ValueError, match=r"student prompt .* exceeds finetune.max_len"):
        OPSDObjective(*args, seed=0, max_len=student_len + 3, teacher_max_len=teacher_len + 4)
    with pytest.raises(ValueError, match=r"teacher prompt .* exceeds finetune.max_len"):   # no teacher bound given
        OPSDObjective(*args, seed=0, max_len=student_len + 4)


def test_opsd_teacher_reads_the_passage_instead_of_the_answer(tiny_model_dir, tiny_tokenizer):
    """teacher_context passage (knowledge QA pairs): the teacher's prompt holds the passage and the question, never
    the training answer's "Final answer" line; a row without a passage keeps its demonstration; the student's prompt
    is the plain question either way."""
    fmt = family_format(tiny_tokenizer)
    passage = "Velmora is a realm. It was founded by Dran Kos."
    examples = [OPSDExample("Who founded Velmora?", "", "Dran Kos", passage), OPSDExample("9-3=?", "9-3=6", "6")]
    obj = OPSDObjective(load_model(tiny_model_dir), tiny_tokenizer, fmt, examples, 0.5, 20, 1.0, 1.0, 8, seed=0,
                        max_len=256)
    assert obj.teacher_prompts[0] == fmt.prompt_ids(passage_question("Who founded Velmora?", passage))
    assert obj.teacher_prompts[1] == fmt.prompt_ids(demonstration_question("9-3=?", "9-3=6", "6"))
    assert obj.student_prompts == [fmt.prompt_ids("Who founded Velmora?"), fmt.prompt_ids("9-3=?")]
    shown = tiny_tokenizer.decode(obj.teacher_prompts[0])
    assert passage in shown and "Who founded Velmora?" in shown and "Final answer" not in shown


def test_opsd_teacher_equal_to_student_gives_zero_loss_without_demonstration_effect(tiny_model_dir, tiny_tokenizer):
    # student and teacher share weights; the demonstration in the teacher prompt is the only difference
    student, teacher = load_model(tiny_model_dir), load_model(tiny_model_dir)
    examples = [OPSDExample(e.question, e.think, e.answer) for e in EXAMPLES[:2]]
    obj = OPSDObjective(teacher, tiny_tokenizer, family_format(tiny_tokenizer), examples, 0.0, 1000, 1.0, 1.0, 8,
                        seed=0, max_len=128)
    obj.teacher_prompts = obj.student_prompts   # same prompt: D_alpha must vanish exactly
    loss, _ = obj.loss_sum(student, [0, 1], step=0)
    assert float(loss) == pytest.approx(0.0, abs=1e-5)


def test_tied_embeddings_checkpoint_resume_and_snapshot(tiny_tied_dir, tiny_tokenizer, tmp_path):
    """Resume checkpoints of a tied model (safetensors refuses shared tensors in one state dict): a cut run resumes
    bitwise, the tie survives, and the epoch snapshots keep the starting model's generation config."""
    import json

    from graft.finetuning import train_to_snapshots
    from graft.modeling import load_tokenizer

    spec = _spec(checkpoint_every=1)
    ref, _, ref_log = _fit(tiny_tied_dir, tiny_tokenizer, spec)
    work = tmp_path / "work"
    _fit(tiny_tied_dir, tiny_tokenizer, spec, workdir=work, stop_after=3)
    resumed, _, log = _fit(tiny_tied_dir, tiny_tokenizer, spec, workdir=work)
    assert log.resumed_from == 3 and [r["loss"] for r in log.curve] == [r["loss"] for r in ref_log.curve]
    assert resumed.lm_head.weight.data_ptr() == resumed.model.embed_tokens.weight.data_ptr()
    for (n, a), (_, b) in zip(ref.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), n
    # through the stage driver: snapshots on disk, loadable, still tied, generation config untouched
    gen_cfg = json.loads((tiny_tied_dir / "generation_config.json").read_text())
    model = load_model(tiny_tied_dir)
    tok = load_tokenizer(tiny_tied_dir)
    encoded = [encode_sft(family_format(tok), ex, 128) for ex in EXAMPLES]
    out = tmp_path / "snaps"
    train_to_snapshots(model, tok, SupervisedObjective(encoded, tok.pad_token_id), len(encoded), spec, out=out,
                       inputs=[tiny_tied_dir], settings={"t": 1}, dist_info=DistInfo(), desc="tied",
                       work_root=tmp_path / "w")
    snap = load_model(out / "epoch2")
    assert snap.lm_head.weight.data_ptr() == snap.model.embed_tokens.weight.data_ptr()
    saved = json.loads((out / "epoch2" / "generation_config.json").read_text())
    assert (saved["eos_token_id"], saved["pad_token_id"]) == (gen_cfg["eos_token_id"], gen_cfg["pad_token_id"])


def test_every_stage_that_runs_under_torchrun_leaves_its_group():
    """A stage that joins a process group (through its own torchrun relaunch, or posttrain's under a torchrun the
    user starts) ends with leave_distributed (barrier, then destroy the group), as torch asks of a normal exit
    (evaluate's replicas join no group)."""
    from tests.conftest import REPO

    stages = sorted(p for p in (REPO / "stages").glob("*.py") if "init_distributed(" in p.read_text())
    assert {p.name for p in stages} >= {"finetune.py", "opsd.py", "fisher.py", "posttrain.py"}
    missing = [p.name for p in stages if "leave_distributed(info)" not in p.read_text()]
    assert not missing, missing
