from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from graft.family_chat import render_prompt, render_response
from graft.modeling import new_model, qwen3_config, save_model_dir, train_tokenizer
from graft.tasks import make_problem, raw_text

REPO = Path(__file__).resolve().parents[1]

TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
              "num_key_value_heads": 1, "head_dim": 32}


@pytest.fixture(scope="session")
def tiny_tokenizer():
    rng = random.Random(0)
    texts = [raw_text(make_problem(s, rng)) for s in ("add", "sub", "reverse") for _ in range(100)]
    texts += [render_prompt("1+2=?", True) + render_response("1+2=3", "3", True)]
    return train_tokenizer(texts, 320)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A random tiny Qwen3 model as a complete HF directory (random init scaled up so logits are decisive)."""
    out = tmp_path_factory.mktemp("tiny") / "model"
    out.mkdir()
    model = new_model(qwen3_config(tiny_tokenizer, TINY_SHAPE, 128), seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    save_model_dir(model, tiny_tokenizer, out)
    return out


def family_format(tokenizer, thinking: bool = True, fmt: str = "answer_tag"):
    """The embedded family's ChatFormat (its tokenizer's own template, answer tags)."""
    from graft.chat import AnswerFormat, ChatFormat, ChatSpec

    return ChatFormat(tokenizer, ChatSpec(thinking), AnswerFormat(fmt))


def family_grader(kind: str = "math", thinking: bool = True):
    from graft.chat import AnswerFormat, ChatSpec
    from graft.grading import Grader

    return Grader(ChatSpec(thinking), AnswerFormat("answer_tag"), kind)


@pytest.fixture(scope="session")
def tiny_fmt(tiny_tokenizer):
    return family_format(tiny_tokenizer)


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny model with tied embeddings (lm_head = embed_tokens, as SmolLM2, Gemma, Llama-3.2-1B) as an HF dir."""
    out = tmp_path_factory.mktemp("tied") / "model"
    out.mkdir()
    cfg = qwen3_config(tiny_tokenizer, TINY_SHAPE, 128)
    cfg.tie_word_embeddings = True
    model = new_model(cfg, seed=0)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    save_model_dir(model, tiny_tokenizer, out)
    return out


def run_worker(script: str, args: list[str], processes: int = 1) -> None:
    """Run a tests/ worker script alone, or under torchrun with ``processes`` gloo processes (one thread each, so
    two processes share the two cores without oversubscribing them)."""
    import os
    import subprocess
    import sys

    # faulthandler: a worker killed by a signal prints every thread's Python stack, which the assertion shows (one
    # FSDP worker aborted once under load, "terminate called without an active exception", with no stack)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    launch = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                                      f"--nproc_per_node={processes}"]
    r = subprocess.run(launch + [str(REPO / "tests" / script), *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        fatal = r.stderr.find("Fatal Python error")
        shown = r.stderr[fatal:fatal + 6000] + "\n...\n" if fatal >= 0 else ""
        raise AssertionError(f"{script} exited {r.returncode}:\n{shown}{r.stderr[-3000:]}")

