"""The Fisher across processes and in layer groups: two gloo processes (rollouts split by rank, sums all-reduced)
give the one-process Fisher and KFAC factors within float tolerance; KFAC estimated one layer per pass writes the
same bytes as all layers at once; the KFAC file holds each factor as its eigendecomposition only."""
from __future__ import annotations


import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import run_worker


def _rebuilt(kfac: dict[str, torch.Tensor], factor: str) -> torch.Tensor:
    """U diag(sigma) U^T of one stored factor (eigenvectors of repeated eigenvalues may rotate; this may not)."""
    vals, vecs = kfac[f"{factor}_eigvals"].double(), kfac[f"{factor}_eigvecs"].double()
    return vecs @ torch.diag(vals) @ vecs.T


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
    for k in (k for k in ka if k.endswith("_eigvals")):
        assert torch.allclose(ka[k], kb[k], rtol=1e-5, atol=1e-5 * float(ka[k].abs().max())), k
        # eigenvectors of (near-)repeated eigenvalues may rotate: compare the factors they rebuild
        factor = k[: -len("_eigvals")]
        a, b = _rebuilt(ka, factor), _rebuilt(kb, factor)
        assert torch.allclose(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max())), factor


def test_the_kfac_file_holds_eigendecompositions_that_rebuild_the_factors(tiny_model_dir, one_process):
    from graft.kfac import estimate_kfac_factors, kfac_linear_names
    from graft.modeling import load_model
    from tests.fisher_worker import rollouts

    model = load_model(tiny_model_dir)
    layers = kfac_linear_names(model)
    factors = estimate_kfac_factors(model, rollouts(model.config.vocab_size), 0, 2, None, layers)
    kfac = load_file(str(one_process / "kfac.safetensors"))
    # four tensors a layer, no factor itself: P and Q would double the file (33 GB -> 16 GB at 1.7B)
    assert set(kfac) == {f"{layer}.weight.{part}" for layer in layers
                         for part in ("P_eigvals", "P_eigvecs", "Q_eigvals", "Q_eigvecs")}
    for layer, (Q, P) in factors.items():
        for name, factor in (("P", P), ("Q", Q)):
            rebuilt = _rebuilt(kfac, f"{layer}.weight.{name}")
            assert torch.allclose(rebuilt, factor.double(), rtol=1e-4, atol=1e-5 * float(factor.abs().max())), \
                (layer, name)
