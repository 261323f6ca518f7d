"""What a second model family costs here against the first, side by side in one process (this machine is shared and
noisy, so only the ratio means anything): a training step (forward and backward of 8 rows x 128 tokens, fp32, the
scenarios' micro-batch and max_len) and greedy generation (32 prompts x 48 new tokens, the HF loop the real
scenarios use), each model in turn, medians of ``--reps``.

    python research/family_cost.py models/family/smollm2 models/family/gemma3

Prints seconds per model and each model's ratio to the first; a scenario's wall time scales roughly with these.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.common import timed  # noqa: E402
from graft.generation import HFGenerator, SamplingSpec  # noqa: E402
from graft.modeling import load_model, load_tokenizer  # noqa: E402

TEXT = ("Ravi has 11 stamps and gives away 3. He starts with 11 stamps and gives away 3: 11 - 3 = 8. So 8 stamps are "
        "left. ") * 12
GREEDY = SamplingSpec(1, 0.0, 1.0, 48, 0)


def train_step(model: torch.nn.Module, ids: torch.Tensor) -> None:
    model(input_ids=ids, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", type=Path, nargs="+")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    kits = []
    for path in args.models:
        tok = load_tokenizer(path)
        model = load_model(path)
        ids = torch.tensor([tok(TEXT, add_special_tokens=False)["input_ids"][:128]] * 8)
        prompts = [tok(f"What is {i} + {i + 3}?", add_special_tokens=False)["input_ids"] for i in range(32)]
        # no stop: every row generates all 48 tokens, so both models do the same amount of work
        gen = HFGenerator.from_model(model, tok, [-1], tok.pad_token_id or 0, batch_size=32)
        kits.append((path, model, ids, prompts, gen))
    times = {path: {"train step": [], "generate": []} for path, *_ in kits}
    for _ in range(args.reps):
        for path, model, ids, prompts, gen in kits:   # alternate, so drift in the machine's load hits both
            model.train()
            times[path]["train step"].append(timed(lambda: train_step(model, ids))[0])
            model.eval()
            times[path]["generate"].append(timed(lambda: gen.generate(prompts, GREEDY))[0])
    first = times[args.models[0]]
    for path, model, *_ in kits:
        cells = []
        for what, ts in times[path].items():
            med = statistics.median(ts)
            ratio = med / statistics.median(first[what])
            cells.append(f"{what} {med:.2f} s ({ratio:.2f}x; {', '.join(f'{t:.2f}' for t in ts)})")
        n = sum(p.numel() for p in model.parameters())
        print(f"{path} ({n / 1e6:.0f}M parameters): {'; '.join(cells)}", flush=True)


if __name__ == "__main__":
    main()
