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


@pytest.mark.parametrize("chunk", [1, 2])
def test_diag_fisher_squares_in_place_with_the_same_bits_as_the_temporary(tiny_model_dir, tiny_tokenizer, chunk):
    """The gradients are squared in place (no temporary of each tensor's size, which a CPU pays in page faults); the
    Fisher, and so every mask and the default run's dvc.lock, keeps the bits of the previous ``g.pow(2)`` formula."""
    from torch.func import grad, vmap

    from graft.fisher import _mean_loglik, rollout_batch

    model = load_model(tiny_model_dir)
    g = torch.Generator().manual_seed(1)
    V = len(tiny_tokenizer)
    rollouts = [(torch.randint(0, V, (p,), generator=g).tolist(), torch.randint(0, V, (r,), generator=g).tolist())
                for p, r in [(5, 3), (7, 4), (4, 6)]]
    pad = tiny_tokenizer.pad_token_id
    fast = estimate_diag_fisher(model, rollouts, pad, chunk=chunk)
    params = {k: v.detach() for k, v in model.named_parameters()}
    one = grad(lambda p, x, w: _mean_loglik(model, p, x, w))
    before = {k: torch.zeros(v.shape) for k, v in params.items()}
    for start in range(0, len(rollouts), chunk):   # the formula before the change, temporaries and all
        ids, w = rollout_batch(rollouts[start: start + chunk], pad)
        if len(ids) == 1:
            for k, gr in one(params, ids[0], w[0]).items():
                before[k] += gr.float().pow(2)
        else:
            for k, gr in vmap(one, in_dims=(None, 0, 0))(params, ids, w).items():
                before[k] += gr.float().pow(2).sum(0)
    assert set(fast) == set(before)
    for k in fast:
        assert torch.equal(fast[k], before[k] / len(rollouts)), k
