"""Trains the tiny model on fixed examples with the shared driver; run alone or under torchrun (tests only).

python tests/ddp_worker.py MODEL_DIR OUT.safetensors MICRO_BATCH [ddp|fsdp [WORKDIR STOP_AFTER]]
writes the final weights to OUT.safetensors and each epoch's snapshot weights to OUT.epoch<e>.safetensors (the
snapshot callback's view: the gathered full state under FSDP).
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from graft.distributed import init_distributed, leave_distributed
from graft.finetuning import SupervisedObjective, TrainSpec, full_state, train
from graft.modeling import load_model, load_tokenizer
from graft.training import SFTExample, encode_sft
from tests.conftest import family_format

EXAMPLES = [SFTExample(f"{a}-{b}=?", f"{a}-{b}={a - b}", str(a - b))
            for a, b in [(9, 3), (17, 5), (40, 12), (8, 8), (73, 21), (55, 9), (31, 30)]]


def main() -> None:
    model_dir, out, micro = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sharding = sys.argv[4] if len(sys.argv) > 4 else "ddp"
    workdir = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    stop_after = int(sys.argv[6]) if len(sys.argv) > 6 else None
    torch.use_deterministic_algorithms(True)
    info = init_distributed()
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir)
    encoded = [encode_sft(family_format(tok), ex, 128) for ex in EXAMPLES]
    spec = TrainSpec(lr=1e-3, epochs=2, global_batch=4, micro_batch=micro, warmup_ratio=0.1, weight_decay=0.01,
                     betas=(0.9, 0.95), grad_clip=1.0, seed=5, sharding=sharding, checkpoint_every=1)

    def snapshot(epoch: int, m: torch.nn.Module, weights: dict | None) -> None:
        state = weights if weights is not None else m.state_dict()
        save_file({k: v.detach().clone() for k, v in state.items()}, f"{out}.epoch{epoch}.safetensors")

    train(model, SupervisedObjective(encoded, tok.pad_token_id), len(encoded), spec, on_epoch_end=snapshot,
          dist_info=info, workdir=workdir, stop_after=stop_after)
    final = full_state(model)[0] if sharding == "fsdp" and info.world > 1 else model.state_dict()
    if info.main:
        save_file({k: v.detach().clone() for k, v in final.items()}, out)   # clones: tied tensors saved apart
    leave_distributed(info)


if __name__ == "__main__":
    main()
