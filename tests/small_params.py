"""A small params profile: the whole DAG in a couple of minutes, for end-to-end tests."""
from __future__ import annotations

import copy

import yaml

SMALL_OVERRIDES = {
    "generation": {"backend": "hf", "batch_size": 64},
    "world": {
        "corpus_problems": 300,
        "tokenizer_vocab_size": 320,
        "student": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                    "num_key_value_heads": 1, "head_dim": 32},
        "aligner": {"hidden_size": 96, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 3,
                    "num_key_value_heads": 1, "head_dim": 32},
        "pretrain": {"steps": 12, "aligner_steps": 8, "batch_size": 8, "seq_len": 64},
        "posttrain": {"steps": 8, "batch_size": 8, "n_examples": 40},
        "eval_per_suite": 6,
        "hard_pool_size": 24,
        "retention_size": 8,
    },
    "mine": {"k": 2, "heldout": 6, "max_new_tokens": 24, "max_successes": 2},
    "synthself": {"max_new_tokens": 24},
    "star": {"attempts": 2, "max_new_tokens": 16},
    "knowledge": {"invent": {"entities": 8}, "eval_facts": 4},
    # the tiny aligner accepts no rewrite: teacher traces; micro < global exercises gradient accumulation
    "finetune": {"lrs": [0.001], "epochs": 2, "global_batch_size": 8, "micro_batch_size": 4, "source": "teacher",
                 "checkpoint_every": 1},
    "donors": {"lr": 0.001},   # the default's candidate (pretrain_0) at the profile's rate
    "opsd": {"alphas": [0.5], "max_new_tokens": 16},
    "fisher": {"n_rollouts": 6, "max_new_tokens": 16, "chunk": 3},
    "sweep": {"lams": [0.5, 1.0], "rhos": [0.1], "masks": ["diagonal", "kfac", "random"], "fisher_merge_lams": [0.5],
              "epochs": [2]},
    "diagnostics": {"interpolation": [0.5]},
    "evaluate": {"n_samples": 2, "pass_k": [1, 2], "max_new_tokens": 24},
}


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# replaces the default's export points (a mapping would otherwise be merged key by key)
SMALL_EXPORT = {"graft_kfac_lam0.5_rho0.1_lr0.001_ep2": {"delta": "tensors/masked/kfac_rho0.1_lr0.001_ep2", "lam": 0.5}}


def small_params(default_params_text: str) -> str:
    out = _merge(yaml.safe_load(default_params_text), SMALL_OVERRIDES)
    out["export"]["points"] = SMALL_EXPORT
    return yaml.safe_dump(out, sort_keys=False)
