"""A GGUF checkpoint (as some pip packages ship real models) converted into a plain Hugging Face directory.

transformers reads GGUF and dequantizes every weight to fp32 on load; the result is *dequantized* weights (e.g. Q4),
not the original bf16 ones. ``save_pretrained`` refuses a model that still carries its GGUF quantizer although every
weight is already plain, so the quantizer is detached first. The written directory loads in transformers and vLLM as
it is, with the model's own tokenizer, chat template and generation config.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path


def packaged_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing the package (some import missing deps)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package} is not installed (see README: Using real models)")
    for root in spec.submodule_search_locations:
        cand = Path(root) / relative
        if cand.is_file():
            return cand
    raise FileNotFoundError(f"package {package} has no file {relative}")


def convert_gguf(gguf: Path, out: Path, dtype: str = "float32") -> dict:
    """Write ``gguf`` as an HF safetensors directory into ``out`` (the caller makes it atomic). Returns facts about
    the model (architecture, parameters, tied embeddings) for the caller to report."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graft.modeling import resolve_dtype

    folder, name = str(gguf.parent), gguf.name
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
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
            "vocab_size": len(tok), "chat_template": tok.chat_template is not None}
