"""Models through ``transformers``: loading and saving any causal LM directory, and the embedded tiny family (a
locally trained tokenizer and Qwen3-architecture models).

Everything written here is a plain Hugging Face directory (config, generation config, tokenizer with chat template,
safetensors weights) that ``transformers`` and ``vllm`` load as it is.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Mapping

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedTokenizerFast, Qwen3Config

from graft.family_chat import CHAT_TEMPLATE_JINJA, EOS, IM_END, PAD, SPECIAL_TOKENS
from graft.params import DEVICES
from graft.tensors import CheckpointError, read_json

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}




def resolve_device(name: str) -> torch.device:
    """params.yaml ``compute.device``: auto is the first CUDA device when there is one, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("compute.device is cuda, but torch sees no CUDA device (set it to auto or cpu)")
    if name not in DEVICES:
        raise ValueError(f"compute.device must be one of {DEVICES}, got {name!r}")
    return torch.device(name)


def resolve_dtype(name: str) -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; expected one of {sorted(DTYPES)}") from None


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (as Qwen's), digits split one per token so arithmetic is learnable at toy scale."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=IM_END, pad_token=PAD, bos_token=None,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (IM_END, PAD)])
    fast.chat_template = CHAT_TEMPLATE_JINJA
    fast.model_max_length = 1 << 20
    return fast


def qwen3_config(tokenizer: PreTrainedTokenizerFast, shape: Mapping[str, int], max_positions: int) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=shape["hidden_size"],
        intermediate_size=shape["intermediate_size"],
        num_hidden_layers=shape["num_hidden_layers"],
        num_attention_heads=shape["num_attention_heads"],
        num_key_value_heads=shape["num_key_value_heads"],
        head_dim=shape["head_dim"],
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        torch_dtype="float32",
    )


def new_model(config: Qwen3Config, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def save_model_dir(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    """Write a model of the embedded family as a complete HF directory into ``out`` (caller makes it atomic), with
    the family's generation config (its end-of-turn and pad tokens)."""
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        do_sample=True, temperature=1.0, top_p=1.0)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def save_snapshot(model: torch.nn.Module, tokenizer, out: Path, weights: dict | None = None) -> None:
    """Write a trained model as a complete HF directory into ``out`` (caller makes it atomic). Config, generation
    config (stop and pad ids) and tokenizer are the starting model's own, never rewritten. ``weights``: the full
    state of a sharded (FSDP) model, gathered by the caller."""
    if weights is None:
        model.save_pretrained(out, safe_serialization=True)
    else:
        model.save_pretrained(out, safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(out)


def load_model(path: str | Path, dtype: str = "float32", trust_remote_code: bool = False,
               device: str | torch.device = "cpu") -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=resolve_dtype(dtype), trust_remote_code=trust_remote_code, use_safetensors=True)
    model.eval()
    return model.to(device)


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    import json

    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except json.JSONDecodeError as e:   # transformers does not say which file it was reading
        bad = [f.name for f in sorted(Path(path).glob("*.json")) if not _parses(f)]
        raise ValueError(f"{path}: {', '.join(bad) or 'a tokenizer file'} is not valid JSON ({e})") from None


def _parses(path: Path) -> bool:
    try:
        read_json(path)
        return True
    except CheckpointError:
        return False
