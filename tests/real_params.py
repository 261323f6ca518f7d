"""params.yaml for a real pretrained model (the converted SmolLM2-135M-Instruct) at tiny settings: every stage runs
on it in minutes. docs/reference.md "Using real models" shows the same keys."""
from __future__ import annotations

import yaml

from research.real_model import overlay   # name -> item maps (suites, aligners) replaced whole

MODEL = "models/real/smollm2"

REAL_OVERRIDES = {
    # SmolLM2's ChatML template has no thinking switch and it writes no think block: reasoning is plain text and
    # the answer is read from the last line of the turn
    "chat": {"thinking": True, "thinking_switch": "none", "think_markers": [], "system_prompt": ""},
    "answer": {"format": "final_line", "instruction": ""},
    "models": {"pretrain_checkpoints": [], "base": MODEL, "post": MODEL, "aligner": MODEL},
    "data": {"old_suites": {"arith": {"path": "data/real/arith.parquet", "grader": "math"},
                            "facts": {"path": "data/real/facts.parquet", "grader": "contains"},
                            # held-out English prose, scored by likelihood
                            "english": {"path": "data/real/english.parquet", "grader": "perplexity"}},
             "hard_pool": {"path": "data/real/hard_pool.parquet"},
             "retention": {"path": "data/real/retention.parquet"}, "offpolicy": {}},
    "generation": {"backend": "hf", "batch_size": 16, "max_model_len": 512},
    "mine": {"k": 2, "max_successes": 0, "heldout": 4, "max_new_tokens": 40},
    "star": {"attempts": 2, "max_new_tokens": 40},
    "synthself": {"aligners": {"base": MODEL}, "max_new_tokens": 40},
    "knowledge": {"invent": {"entities": 4}, "eval_facts": 4},
    "finetune": {"donor": MODEL, "source": "teacher", "lrs": [1.0e-5], "epochs": 1, "global_batch_size": 8,
                 "micro_batch_size": 4, "max_len": 256, "checkpoint_every": 1},
    "donors": {"candidates": {}},
    "opsd": {"alphas": [0.5], "max_new_tokens": 16},
    "fisher": {"n_rollouts": 4, "max_new_tokens": 16, "chunk": 1},
    "sweep": {"lams": [1.0], "rhos": [0.01], "masks": ["diagonal", "kfac", "random"], "fisher_merge_lams": [0.5],
              "epochs": [1]},
    "diagnostics": {"interpolation": [0.5]},
    "evaluate": {"n_samples": 2, "pass_k": [1, 2], "max_new_tokens": 40},
}
REAL_EXPORT = {"graft_kfac_lam1.0_rho0.01_lr1e-05_ep1": {"delta": "tensors/masked/kfac_rho0.01_lr1e-05_ep1",
                                                         "lam": 1.0}}


def real_params(default_params_text: str, overrides: dict | None = None) -> str:
    out = overlay(yaml.safe_load(default_params_text), REAL_OVERRIDES)
    if overrides:
        out = overlay(out, overrides)
    out["export"]["points"] = REAL_EXPORT
    return yaml.safe_dump(out, sort_keys=False)
