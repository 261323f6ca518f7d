import copy

import pytest
import yaml

from graft.params import ParamsError
from graft.schema import validate
from tests.conftest import REPO

DEFAULT = yaml.safe_load((REPO / "params.yaml").read_text())


def test_default_params_validate():
    p = validate(copy.deepcopy(DEFAULT))
    assert p["sweep"].lams and p["mine"].k >= 1


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update({"mege": {}}), "unknown section mege"),
    (lambda d: d["mine"].update({"kk": 3}), "unknown key mine.kk"),
    (lambda d: d["mine"].pop("k"), "missing key mine.k"),
    (lambda d: d["mine"].update({"k": 0}), "mine.k must be > 0"),
    (lambda d: d["mine"].update({"k": "8"}), "mine.k must be an integer"),
    (lambda d: d["mine"].update({"k": True}), "mine.k must be an integer, got a boolean"),
    (lambda d: d["sweep"].update({"rhos": [0.05, 1.0]}), "sweep.rhos[1] must be in (0, 1)"),
    (lambda d: d["sweep"].update({"rhos": [0.0]}), "sweep.rhos[0] must be in (0, 1)"),
    (lambda d: d["sweep"].update({"masks": ["diagonal", "l2"]}), "sweep.masks must be a non-empty list of"),
    (lambda d: d["sweep"].update({"fisher_merge_lams": [1.5]}), "sweep.fisher_merge_lams[0] must be in (0, 1]"),
    (lambda d: d["fisher"].update({"chunk": 0}), "fisher.chunk must be > 0"),
    (lambda d: d["data"]["old_suites"]["add"].update({"grader": "perplexity", "instruction": "Answer."}),
     "data.old_suites.add.instruction is set, but the suite's grader is perplexity"),
    (lambda d: [s.update({"grader": "perplexity"}) for s in d["data"]["old_suites"].values()],
     "data.old_suites: every suite has grader perplexity"),
    (lambda d: d["data"]["old_suites"].update({"../x": {"path": "a.parquet"}}), "key '../x' must be a plain name"),
    (lambda d: d["data"]["old_suites"]["add"].update({"grader": "exact"}), "old_suites.add.grader must be one of"),
    (lambda d: d["data"]["old_suites"]["add"].update({"format": "xml"}), "old_suites.add.format must be"),
    (lambda d: d["answer"].update({"format": "json"}), "answer.format must be one of"),
    (lambda d: d["chat"].update({"think_markers": ["<think>"]}), "chat.think_markers must be"),
    (lambda d: d["compute"].update({"device": "tpu"}), "compute.device must be one of"),
    (lambda d: d["compute"].update({"threads": -1}), "compute.threads must be >= 0"),
    (lambda d: d["compute"].update({"threads": 1.5}), "compute.threads must be"),
    (lambda d: d["sweep"].update({"lams": [0.0]}), "sweep.lams[0] must be > 0"),
    (lambda d: d["sweep"].update({"lams": []}), "sweep.lams must be non-empty"),
    (lambda d: d["sweep"].update({"lams": [0.5, 0.5]}), "sweep.lams has a repeated value"),
    (lambda d: d["generation"].update({"backend": "tgi"}), "generation.backend must be one of vllm, hf"),
    (lambda d: d["generation"].update({"vllm_tensor_parallel_size": 0}), "vllm_tensor_parallel_size must be > 0"),
    (lambda d: d["generation"].update({"backend": "hf", "vllm_tensor_parallel_size": 2}),
     "tensor parallelism is vLLM's"),
    (lambda d: d["generation"].update({"data_parallel_size": 0}), "generation.data_parallel_size must be > 0"),
    (lambda d: d["propose"].update({"predictor": "hessian"}), "propose.predictor must be one of measured"),
    (lambda d: d["propose"].update({"kl_budget": 0}), "propose.kl_budget must be > 0"),
    (lambda d: d["finetune"].update({"betas": [0.9]}), "finetune.betas must be two values"),
    (lambda d: d["finetune"].update({"lrs": [float("nan")]}), "finetune.lrs"),
    (lambda d: d["finetune"].update({"dtype": "fp8"}), "finetune.dtype must be one of"),
    (lambda d: d["chat"].update({"thinking": "yes"}), "chat.thinking must be true or false"),
    (lambda d: d["world"]["student"].update({"num_key_value_heads": 3}), "world.student.num_attention_heads"),
    (lambda d: d["opsd"].update({"teacher_context": "wiki"}), "opsd.teacher_context must be one of demonstration"),
    (lambda d: d["opsd"].update({"teacher_context": "passage"}),
     "opsd.teacher_context is passage, but finetune.source is 'synthself'"),
])
def test_bad_params_name_the_key(mutate, message):
    d = copy.deepcopy(DEFAULT)
    mutate(d)
    with pytest.raises(ParamsError) as e:
        validate(d)
    assert message in str(e.value)
