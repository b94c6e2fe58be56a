"""Gradient checkpointing (``mpt.checkpoint``, ``mpt.checkpoint_sequential``, ``GPT(checkpoint=)``):
bit-identical gradients with dropout and autocast, the RNG and autocast states of the forward
replayed without disturbing the outer stream, only segment inputs kept."""
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt import nn
from mpt.nn.checkpoint import checkpoint_sequential, segment_sizes
from mpt.testing import as_bits as bits

CONFIG = dict(vocab=32, d_model=32, n_layers=4, n_heads=4, seq_len=16, dropout=0.1, seed=3)


def _train(checkpoint, region, backend="flash", steps=2):
    """Two SGD steps of a GPT with dropout; returns the loss and gradient bits of every step, the
    final parameters and the RNG state."""
    g = nn.GPT(**CONFIG, backend=backend, checkpoint=checkpoint)
    rng = np.random.default_rng(0)
    idx, tgt = rng.integers(0, 32, (4, 16)), rng.integers(0, 32, (4, 16))
    mpt.manual_seed(21)
    record = []
    for _ in range(steps):
        g.zero_grad()
        with region():
            loss = g.loss(idx, tgt)
        loss.backward()                      # outside the region, as PyTorch's recipe
        record.append([bits(loss).copy()] + [bits(p.grad).copy() for p in g.parameters()])
        for p in g.parameters():
            p.data = (p.data - np.float32(0.1) * p.grad.data).astype(p.data.dtype)
    return record, [bits(p).copy() for p in g.parameters()], mpt.get_rng_state()


@pytest.mark.parametrize("region,backend", [
    (lambda: mpt.autocast(format="bf16", model="hopper"), "flash"),
    (lambda: mpt.autocast(format="fp16", model="ampere"), "naive"),
    (lambda: mpt.matmul_model("ieee_fma"), "flash"),
], ids=["bf16-hopper-flash", "fp16-ampere-naive", "fp32-flash"])
@pytest.mark.parametrize("checkpoint", [True, 4, 1], ids=["sqrt", "per-block", "one-segment"])
def test_checkpointed_training_is_bit_identical(region, backend, checkpoint):
    plain = _train(False, region, backend)
    ckpt = _train(checkpoint, region, backend)
    for step_a, step_b in zip(plain[0], ckpt[0]):
        for a, b in zip(step_a, step_b):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(plain[1], ckpt[1]):
        np.testing.assert_array_equal(a, b)
    assert plain[2] == ckpt[2]                 # the outer RNG stream is where it would be


def test_without_the_rng_state_the_recomputed_masks_differ():
    # The check above can fail: recomputing with fresh dropout streams changes the gradients.
    g = nn.GPT(**CONFIG)
    idx = np.random.default_rng(1).integers(0, 32, (2, 16))
    grads = []
    for preserve in (True, False):
        g.zero_grad()
        mpt.manual_seed(5)
        x = F.dropout(g.wte(idx), 0.1)
        y = checkpoint_sequential(g.blocks, 2, x, preserve_rng_state=preserve)
        y.float().sum().backward()
        grads.append(bits(g.blocks[0].mlp.fc1.weight.grad).copy())
    g.zero_grad()
    mpt.manual_seed(5)
    x = F.dropout(g.wte(idx), 0.1)
    for block in g.blocks:
        x = block(x)
    x.float().sum().backward()
    np.testing.assert_array_equal(grads[0], bits(g.blocks[0].mlp.fc1.weight.grad))
    assert not np.array_equal(grads[0], grads[1])


def test_recomputation_replays_the_forward_autocast_state():
    seen = []
    lin = nn.Linear(8, 8, seed=1)

    def fn(x):
        seen.append(mpt.autocast_state())
        return lin(x)

    x = mpt.tensor(np.ones((2, 8)), "fp32", requires_grad=True)
    with mpt.autocast(format="bf16", model="hopper"):
        y = mpt.checkpoint(fn, x)
    y.float().sum().backward()
    assert len(seen) == 2 and seen[0] == seen[1] and seen[1].model == "hopper"
    assert y.format.name == "bf16" and x.grad.format.name == "fp32"


def test_only_trainable_parameters_still_get_gradients():
    # A frozen input (LoRA-style frozen embeddings): the node is recorded for the parameters.
    block = nn.TransformerBlock(16, 2, seed=2)
    x = mpt.tensor(np.random.default_rng(2).standard_normal((2, 5, 16)), "fp32")
    mpt.checkpoint(block, x).sum().backward()
    ckpt = [bits(p.grad).copy() for p in block.parameters()]
    block.zero_grad()
    block(x).sum().backward()
    for a, p in zip(ckpt, block.parameters()):
        np.testing.assert_array_equal(a, bits(p.grad))


def test_graph_rules_no_grad_and_errors():
    lin = nn.Linear(4, 4, seed=3)
    x = mpt.tensor(np.ones((3, 4)), "fp32", requires_grad=True)
    y = mpt.checkpoint(lin, x)
    assert y.requires_grad
    y.sum().backward(retain_graph=True)
    first = x.grad.data.copy()
    y.sum().backward()
    np.testing.assert_array_equal(x.grad.data, 2 * first)   # exact: doubling
    with pytest.raises(RuntimeError, match="second time"):
        y.sum().backward()
    with mpt.no_grad():
        assert not mpt.checkpoint(lin, x).requires_grad
    with pytest.raises(TypeError, match="callable"):
        mpt.checkpoint(3, x)
    with pytest.raises(TypeError, match="one Tensor"):
        mpt.checkpoint(lambda t: (t, t), x)
    with pytest.raises(ValueError, match="positive int"):
        checkpoint_sequential([lin], 0, x)
    assert segment_sizes(8, 3) == [3, 3, 2] and segment_sizes(2, 5) == [1, 1]
