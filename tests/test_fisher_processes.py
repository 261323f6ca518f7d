"""The Fisher across processes and in layer groups: two gloo processes (rollouts split by rank, sums all-reduced)
give the one-process Fisher and KFAC factors within float tolerance; KFAC estimated one layer per pass writes the
same bytes as all layers at once."""
from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import run_worker

def _run(args: list[str], processes: int = 1) -> None:
    run_worker("fisher_worker.py", args, processes)


@pytest.fixture(scope="module")
def one_process(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("fisher_one")
    _run([str(tiny_model_dir), str(out), "0"])
    return out


def test_one_layer_per_pass_writes_the_same_kfac_bytes(tiny_model_dir, one_process, tmp_path):
    _run([str(tiny_model_dir), str(tmp_path), "1"])
    assert (tmp_path / "kfac.safetensors").read_bytes() == (one_process / "kfac.safetensors").read_bytes()
    assert (tmp_path / "diagonal.safetensors").read_bytes() == (one_process / "diagonal.safetensors").read_bytes()


@pytest.mark.slow
def test_two_gloo_processes_match_one_process(tiny_model_dir, one_process, tmp_path):
    _run([str(tiny_model_dir), str(tmp_path), "2"], processes=2)
    one, two = load_file(str(one_process / "diagonal.safetensors")), load_file(str(tmp_path / "diagonal.safetensors"))
    assert one.keys() == two.keys()
    for k in one:
        # stated tolerance: relative 1e-5 of the tensor's largest entry (fp32 sums in another order)
        assert torch.allclose(one[k], two[k], rtol=1e-5, atol=1e-5 * float(one[k].abs().max())), k
    assert any(float(v.abs().sum()) > 0 for v in one.values())
    ka, kb = load_file(str(one_process / "kfac.safetensors")), load_file(str(tmp_path / "kfac.safetensors"))
    assert ka.keys() == kb.keys()
    for k in ka:
        if k.endswith(("P", "Q", "_eigvals")):
            assert torch.allclose(ka[k], kb[k], rtol=1e-5, atol=1e-5 * float(ka[k].abs().max())), k
    for k in (k for k in kb if k.endswith(".P") or k.endswith(".Q")):
        # eigenvectors of (near-)repeated eigenvalues may rotate: compare what they reconstruct
        vals, vecs = kb[f"{k}_eigvals"], kb[f"{k}_eigvecs"]
        rebuilt = vecs @ torch.diag(vals) @ vecs.T
        assert torch.allclose(rebuilt, ka[k], rtol=1e-4, atol=1e-4 * float(ka[k].abs().max())), k
