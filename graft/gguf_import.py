"""A GGUF checkpoint (as some pip packages ship real models) converted into a plain Hugging Face directory.

transformers reads GGUF and dequantizes every weight to fp32 on load; the result is *dequantized* weights (e.g. Q4),
not the original bf16 ones. ``save_pretrained`` refuses a model that still carries its GGUF quantizer although every
weight is already plain, so the quantizer is detached first. The written directory loads in transformers and vLLM as
it is, with the model's own tokenizer, chat template and generation config.

One thing the GGUF says that transformers' conversion can drop is put back: whether the tokenizer adds BOS to plain
text (``tokenizer.ggml.add_bos_token``; Gemma 3's converted tokenizer adds none, although Gemma is trained with it).
A model without a chat template (a pretrained-only base) gets one only where the caller passes it.
"""
from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from typing import Iterable


def packaged_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing the package (some import missing deps)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed (docs/reference.md, Using real models)")
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        raise FileNotFoundError(f"{relative} must be a path inside package {package} (relative, no ..): only the "
                                "pinned package's own file is what params name")
    for root in spec.submodule_search_locations:
        cand = Path(root) / relative
        if cand.is_file():
            if not cand.resolve().is_relative_to(Path(root).resolve()):   # a link out of the package
                raise FileNotFoundError(f"package {package}: {relative} is a link to {cand.resolve()}, outside the "
                                        "package")
            return cand
    raise FileNotFoundError(f"package {package} has no file {relative}")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def assemble(parts: Iterable[Path], out: Path) -> str:
    """Concatenate ``parts`` in order into ``out`` (a GGUF shipped in pieces, each in its own package); returns the
    result's SHA-256."""
    h = hashlib.sha256()
    with out.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while chunk := src.read(1 << 24):
                    h.update(chunk)
                    dst.write(chunk)
    return h.hexdigest()


def gguf_adds_bos(gguf: Path) -> bool | None:
    """The GGUF's ``tokenizer.ggml.add_bos_token`` (None where the file does not say)."""
    from gguf import GGUFReader

    field = GGUFReader(gguf).fields.get("tokenizer.ggml.add_bos_token")
    return None if field is None else bool(field.contents())


def _adds_bos(tok) -> bool:
    return tok.bos_token_id is not None and tok("a")["input_ids"][:1] == [tok.bos_token_id]


def convert_gguf(gguf: Path, out: Path, dtype: str = "float32", chat_template: str = "") -> dict:
    """Write ``gguf`` as an HF safetensors directory into ``out`` (the caller makes it atomic). ``chat_template``: a
    Jinja chat template for a tokenizer that has none (a model that has its own keeps it: ValueError). Returns facts
    about the model (architecture, parameters, tied embeddings, BOS) for the caller to report."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft.modeling import resolve_dtype

    folder, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if chat_template:
        if tok.chat_template:
            raise ValueError(f"{gguf.name} has its own chat template; graft uses the model's own, so give none")
        tok.chat_template = chat_template
    bos = gguf_adds_bos(gguf)
    if bos is not None and tok.bos_token_id is not None and _adds_bos(tok) != bos:
        tok.add_bos_token = bos
        if _adds_bos(tok) != bos:
            raise ValueError(f"{gguf.name}: the GGUF says add_bos_token {bos}, and the converted tokenizer cannot "
                             "be made to follow it")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=resolve_dtype(dtype))
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for p in model.parameters():
        if not torch.isfinite(p).all():
            raise FloatingPointError(f"{gguf}: dequantized weights hold NaN or Inf")
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return {"architecture": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()),
            "tied_embeddings": bool(getattr(model.config, "tie_word_embeddings", False)),
            "vocab_size": len(tok), "chat_template": tok.chat_template is not None, "adds_bos": _adds_bos(tok)}
