import pytest
import torch

from graft.fisher import estimate_diag_fisher, naive_diag_fisher
from graft.modeling import load_model


@pytest.mark.parametrize("chunk", [1, 2, 5])   # plain backwards; vmapped pairs and a single tail; one vmap of all
def test_diag_fisher_equals_naive_per_sample_loop(tiny_model_dir, tiny_tokenizer, chunk):
    model = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(0)
    V = len(tiny_tokenizer)
    rollouts = []
    for plen, rlen in [(5, 3), (7, 1), (4, 6), (6, 2), (3, 5)]:  # ragged: exercises padding
        rollouts.append((torch.randint(0, V, (plen,), generator=g).tolist(),
                         torch.randint(0, V, (rlen,), generator=g).tolist()))
    fast = estimate_diag_fisher(model, rollouts, tiny_tokenizer.pad_token_id, chunk=chunk)
    slow = naive_diag_fisher(model, rollouts, tiny_tokenizer.pad_token_id)
    assert set(fast) == set(slow)
    for name in fast:
        assert fast[name].dtype == torch.float32
        scale = float(slow[name].abs().max())
        torch.testing.assert_close(fast[name], slow[name], rtol=1e-4, atol=1e-5 * scale)
    assert sum(float(v.sum()) for v in fast.values()) > 0
