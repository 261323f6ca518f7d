"""Diagonal Fisher and KFAC of the tiny model on fixed rollouts; run alone or under torchrun (tests only).

python tests/fisher_worker.py MODEL_DIR OUT_DIR LAYERS_PER_PASS
writes OUT_DIR/diagonal.safetensors and OUT_DIR/kfac.safetensors from the first process.
"""
from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

from graft.distributed import broadcast_token_lists, init_distributed, leave_distributed
from graft.fisher import estimate_diag_fisher, rank_share
from graft.kfac import kfac_linear_names, write_kfac
from graft.modeling import load_model
from graft.tensors import save_tensors


def rollouts(vocab: int, n: int = 7, seed: int = 3) -> list[tuple[list[int], list[int]]]:
    """Prompts of 3-6 tokens and responses of 1-5 tokens (uneven lengths exercise the padding)."""
    rng = random.Random(seed)
    return [([rng.randrange(4, vocab) for _ in range(rng.randint(3, 6))],
             [rng.randrange(4, vocab) for _ in range(rng.randint(1, 5))]) for _ in range(n)]


def main() -> None:
    model_dir, out, per_pass = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    torch.use_deterministic_algorithms(True)
    info = init_distributed("cpu")
    model = load_model(model_dir)
    mine_all = rollouts(model.config.vocab_size) if info.main else None
    # the first process's rollouts reach the others as tensors, as in the stage
    prompts = broadcast_token_lists([p for p, _ in mine_all] if info.main else None, info)
    responses = broadcast_token_lists([r for _, r in mine_all] if info.main else None, info)
    share = rank_share(list(zip(prompts, responses)), info.rank, info.world)
    reduce = torch.distributed.all_reduce if info.world > 1 else None
    diag = estimate_diag_fisher(model, share, 0, 2, reduce)
    out.mkdir(parents=True, exist_ok=True)
    write_kfac(model, kfac_linear_names(model), share, 0, 2, reduce, per_pass,
               out / "kfac.safetensors" if info.main else None)
    if info.main:
        save_tensors(out / "diagonal.safetensors", diag)
    leave_distributed(info)


if __name__ == "__main__":
    main()
