"""Prepared GPU check: the heavy stages' code on one GPU at Qwen3-1.7B shapes, timed, with one table printed.

Runs on a bare GPU machine with only torch, transformers, safetensors and accelerate installed (no vLLM, DVC, pandas
or network): the model is a randomly initialised Qwen3-1.7B-shaped checkpoint built from a config, the data random
token ids. What it measures, each with the code the pipeline runs:
  finetune   10 optimiser steps of graft.finetuning.train (fp32 weights, bf16 autocast: the GPU recipe), tokens/s
             and peak GPU memory
  fisher     graft.fisher.estimate_diag_fisher (chunk 1) and graft.kfac.estimate_kfac_factors over 32 rollouts of
             256 tokens, seconds per rollout against one plain forward + backward of the same rollouts
  eigh       the KFAC factor eigendecompositions (graft.kfac.eigh_factor, fp64) of one block on the GPU, times the
             number of blocks
  mask/merge graft.merging.write_masked_delta (exact diagonal top-rho) and merge_into_dir over every entry of the
             model, from safetensors files on local disk, against a plain read + write of the same bytes
  generate   HF generate throughput (bf16, batch 16, 128 new tokens)
  check      the GPU diagonal Fisher and KFAC factors of a tiny model against the CPU ones (fp32; must agree to 1e-4)

python scripts/gpu_check.py              # on a GPU machine (about 5-8 minutes on one H200)
python scripts/gpu_check.py --dry-run    # the same code at tiny sizes on the CPU (the test suite runs this)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graft.distributed import DistInfo  # noqa: E402
from graft.fisher import estimate_diag_fisher  # noqa: E402
from graft.finetuning import SupervisedObjective, TrainSpec, train  # noqa: E402
from graft.kfac import eigh_factor, estimate_kfac_factors, kfac_linear_names  # noqa: E402
from graft.merging import MaskPlan, merge_into_dir, write_masked_delta  # noqa: E402
from graft.tensors import TensorReader, save_tensors  # noqa: E402

QWEN3_1_7B = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28, "num_attention_heads": 16,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
              "max_position_embeddings": 4096}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512, "tie_word_embeddings": True,
        "max_position_embeddings": 512}
FULL = {"shape": QWEN3_1_7B, "rollouts": 32, "tokens": 256, "steps": 10, "batch": 8, "micro": 4, "gen_batch": 16,
        "gen_tokens": 128}
DRY = {"shape": TINY, "rollouts": 4, "tokens": 32, "steps": 2, "batch": 4, "micro": 2, "gen_batch": 2,
       "gen_tokens": 8}


def build(shape: dict, device: torch.device, seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen3ForCausalLM(Qwen3Config(**shape, torch_dtype="float32"))
    return model.float().eval()


def rollouts(vocab: int, n: int, tokens: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    prompt = tokens // 4
    return [([rng.randrange(1, vocab) for _ in range(prompt)], [rng.randrange(1, vocab) for _ in range(tokens - prompt)])
            for _ in range(n)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def peak_gb(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def plain_backward(model: torch.nn.Module, rolls, device: torch.device) -> None:
    """One ordinary forward + backward of each rollout's mean response log-likelihood: the reference cost."""
    for p, r in rolls:
        ids = torch.tensor([p + r], device=device)
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1)[torch.arange(len(p) - 1, len(p) + len(r) - 1, device=device),
                                             torch.tensor(r, device=device)]
        model.zero_grad(set_to_none=True)
        (-logp.mean()).backward()
    model.zero_grad(set_to_none=True)


def finetune(model, cfg: dict, device: torch.device) -> tuple[float, int]:
    n = cfg["batch"] * cfg["steps"]
    rolls = rollouts(model.config.vocab_size, n, cfg["tokens"], seed=1)
    encoded = [(p + r, [-100] * len(p) + r) for p, r in rolls]
    spec = TrainSpec(lr=1e-5, epochs=1, global_batch=cfg["batch"], micro_batch=cfg["micro"], warmup_ratio=0.1,
                     weight_decay=0.0, betas=(0.9, 0.95), grad_clip=1.0, seed=0,
                     autocast=torch.bfloat16 if device.type == "cuda" else None, checkpoint_every=0)
    seconds, _ = timed(device, lambda: train(model, SupervisedObjective(encoded, 0), n, spec,
                                             on_epoch_end=lambda e, m, w: None, dist_info=DistInfo(0, 1, device)))
    model.eval()
    return seconds, n * cfg["tokens"]


def write_inputs(model, work: Path) -> tuple[Path, Path, Path]:
    """The model as a bf16 'post' directory, a random fp32 delta and a diagonal Fisher of the same shapes."""
    post, delta, fisher = work / "post", work / "delta", work / "fisher"
    for d in (post, delta, fisher):
        d.mkdir()
    state = {k: v.detach() for k, v in model.state_dict().items() if k != "lm_head.weight" or
             not model.config.tie_word_embeddings}
    g = torch.Generator().manual_seed(0)
    save_tensors(post / "model.safetensors", {k: v.to("cpu", torch.bfloat16) for k, v in state.items()})
    model.config.to_json_file(str(post / "config.json"))
    save_tensors(delta / "model.safetensors", {k: torch.randn(v.shape, generator=g) * 1e-4 for k, v in state.items()})
    save_tensors(fisher / "diagonal.safetensors", {k: torch.rand(v.shape, generator=g) for k, v in state.items()})
    return post, delta, fisher


def io_floor(post: Path, delta: Path, out: Path) -> float:
    """Read post and delta tensor by tensor, write post's bytes: the same I/O as a merge, no math."""
    t0 = time.perf_counter()
    out.mkdir()
    with TensorReader(post) as p, TensorReader(delta) as d:
        tensors = {}
        for name in p.names():
            d.get(name)
            tensors[name] = p.get(name)
        save_tensors(out / "model.safetensors", tensors)
    return time.perf_counter() - t0


def fisher_agreement(device: torch.device) -> dict[str, float]:
    """Largest difference, relative to each tensor's largest entry, between the Fisher on ``device`` and on the CPU."""
    rolls = rollouts(TINY["vocab_size"], 6, 24, seed=2)
    cpu = build(TINY, torch.device("cpu"), seed=3)
    dev = build(TINY, device, seed=3)
    dev.load_state_dict(cpu.state_dict())

    def worst(a: dict, b: dict) -> float:
        return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-30)) for k in a)

    diag = worst(estimate_diag_fisher(cpu, rolls, 0, 2), estimate_diag_fisher(dev, rolls, 0, 2))
    fa, fb = estimate_kfac_factors(cpu, rolls, 0, 2), estimate_kfac_factors(dev, rolls, 0, 2)
    kfac = max(worst({"q": fa[n][0], "p": fa[n][1]}, {"q": fb[n][0], "p": fb[n][1]}) for n in fa)
    return {"diagonal": diag, "kfac": kfac}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU")
    ap.add_argument("--work", default=None, help="folder for the mask/merge files (default: a system temp folder)")
    ap.add_argument("--json", default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    cfg = DRY if args.dry_run else FULL
    if args.dry_run:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", 0)
    else:
        raise SystemExit("gpu_check: no CUDA device (use --dry-run for the CPU version)")
    torch.backends.cuda.matmul.allow_tf32 = False   # fp32 means fp32 (the Fisher and the check)
    rows: list[dict] = []

    def row(what: str, value: float, unit: str, reference: float | None = None, goal: str = "", note: str = ""):
        ratio = value / reference if reference else None
        rows.append({"what": what, "value": value, "unit": unit, "reference": reference, "ratio": ratio,
                     "goal": goal, "note": note})
        print(json.dumps(rows[-1]), flush=True)

    started = time.perf_counter()
    model = build(cfg["shape"], device)
    n_params = sum(p.numel() for p in model.parameters())
    row("parameters", n_params / 1e9, "billion", note=f"Qwen3-1.7B shapes{' (tiny: dry run)' if args.dry_run else ''}")

    reset_peak(device)
    seconds, tokens = finetune(model, cfg, device)
    row("finetune: tokens/s", tokens / seconds, "tokens/s", note=f"{cfg['steps']} steps x {cfg['batch']} x "
        f"{cfg['tokens']} tokens, fp32 weights + AdamW, bf16 autocast on GPU")
    if peak_gb(device) is not None:
        row("finetune: peak GPU memory", peak_gb(device), "GiB")

    rolls = rollouts(model.config.vocab_size, cfg["rollouts"], cfg["tokens"])
    plain, _ = timed(device, lambda: plain_backward(model, rolls, device))
    n = len(rolls)
    row("plain forward + backward", plain / n, "s/rollout", note=f"{n} rollouts x {cfg['tokens']} tokens, fp32")
    reset_peak(device)
    diag_s, fisher = timed(device, lambda: estimate_diag_fisher(model, rolls, 0, 1))
    del fisher
    row("diagonal Fisher", diag_s / n, "s/rollout", plain / n, "<= 1.3x")
    reset_peak(device)
    kfac_s, factors = timed(device, lambda: estimate_kfac_factors(model, rolls, 0, 4))
    row("KFAC factors", kfac_s / n, "s/rollout", plain / n, "<= 1.5x")
    if peak_gb(device) is not None:
        row("KFAC factors: peak GPU memory", peak_gb(device), "GiB", note="every layer's factors at once")
    names = kfac_linear_names(model)
    block = [nm for nm in names if ".layers.0." in nm]
    eig_s, _ = timed(device, lambda: [eigh_factor(m.to(device)) for nm in block for m in factors[nm]])
    blocks = model.config.num_hidden_layers
    row("KFAC eigendecompositions", eig_s * blocks, "s", kfac_s, "<= 1x",
        note=f"one block's {2 * len(block)} factors on the device x {blocks} blocks (the stage runs them on the CPU)")
    del factors

    work = Path(tempfile.mkdtemp(prefix="gpu-check-", dir=args.work))
    try:
        post, delta, fisher_dir = write_inputs(model, work)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        floor = io_floor(post, delta, work / "floor")
        with TensorReader(delta) as d, TensorReader(fisher_dir / "diagonal.safetensors") as f:
            entries = sum(int(torch.tensor(d.shape(k)).prod()) for k in d.names())
            mask_s, counts = timed(torch.device("cpu"),
                                   lambda: write_masked_delta(MaskPlan("diagonal", d, f), 0.01, work / "masked"))
        row("exact top-rho mask (diagonal, rho 0.01)", mask_s, "s", floor, "<= 3x",
            note=f"{entries / 1e9:.2f}B entries from disk; reference: read post + delta, write post")
        (work / "merged").mkdir()   # the merge stage's atomic_dir makes it
        merge_s, _ = timed(torch.device("cpu"), lambda: merge_into_dir(post, work / "masked", 1.0, work / "merged"))
        row("merge post + lam * M(delta)", merge_s, "s", floor, "<= 1.43x (>= 0.7x the floor's speed)",
            note="bf16 out, fp32 math")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    model = build(cfg["shape"], device).to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    prompts = torch.randint(1, model.config.vocab_size, (cfg["gen_batch"], 64), device=device)
    gen_s, out = timed(device, lambda: model.generate(prompts, attention_mask=torch.ones_like(prompts),
                                                      max_new_tokens=cfg["gen_tokens"],
                                                      min_new_tokens=cfg["gen_tokens"], do_sample=True,
                                                      pad_token_id=0))
    row("HF generate", (out.shape[1] - prompts.shape[1]) * cfg["gen_batch"] / gen_s, "tokens/s",
        note=f"batch {cfg['gen_batch']}, {cfg['gen_tokens']} new tokens, sampling, "
             f"{'bf16' if device.type == 'cuda' else 'fp32'}")
    del model

    agree = fisher_agreement(device)
    for kind, worst in agree.items():
        row(f"{kind} Fisher: {device.type} vs CPU (tiny model)", worst, "max rel diff", goal="<= 1e-4",
            note="ok" if worst <= 1e-4 else "FAILED")
    row("total wall time", time.perf_counter() - started, "s", goal="< 480 s")

    print(f"\ngpu_check on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu (dry run)'}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs")
    print("| what | measured | unit | reference | ratio | goal | note |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ref = f"{r['reference']:.4g}" if r["reference"] is not None else ""
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else ""
        print(f"| {r['what']} | {r['value']:.4g} | {r['unit']} | {ref} | {ratio} | {r['goal']} | {r['note']} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if any(r["note"] == "FAILED" for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
