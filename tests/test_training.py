import torch

from graft.modeling import load_model
from graft.training import IGNORE, OptimConfig, SFTExample, encode_sft, finetune_sft

EXAMPLES = [SFTExample(f"{a}-{b}=?", f"{a}-{b}={a - b}", str(a - b)) for a, b in [(9, 3), (17, 5), (40, 12), (8, 8)]]


def test_assistant_only_loss_masks_every_prompt_token(tiny_fmt):
    ids, labels = encode_sft(tiny_fmt, EXAMPLES[0], 256)
    n_prompt = len(tiny_fmt.prompt_ids(EXAMPLES[0].question))
    assert labels[:n_prompt] == [IGNORE] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:] and len(ids) > n_prompt


def _train(model_dir, tok):
    from tests.conftest import family_format

    model = load_model(model_dir)
    losses = finetune_sft(model, family_format(tok), EXAMPLES, 128, 2, 2, OptimConfig(lr=1e-3), seed=3)
    return model, losses


def test_finetune_is_bitwise_reproducible_and_learns(tiny_model_dir, tiny_tokenizer):
    torch.use_deterministic_algorithms(True)
    m1, l1 = _train(tiny_model_dir, tiny_tokenizer)
    m2, l2 = _train(tiny_model_dir, tiny_tokenizer)
    assert l1 == l2
    for (n, a), (_, b) in zip(m1.state_dict().items(), m2.state_dict().items()):
        assert torch.equal(a, b), n
    base = load_model(tiny_model_dir)
    moved = sum(float((a - b).abs().sum()) for a, b in zip(m1.parameters(), base.parameters()))
    assert moved > 0
