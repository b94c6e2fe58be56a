"""Autocast: PyTorch's CUDA policy per op (table-driven), the cast cache, user ops, the state."""
import ml_dtypes
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt.functional.autocast import CATEGORIES
from mpt.testing import as_bits as bits

BF16 = ml_dtypes.bfloat16

# PyTorch's CUDA autocast lists (docs/amp.md §2), for the ops mpt has
EXPECTED = {
    "lower": {"matmul", "linear", "conv2d", "scaled_dot_product_attention"},
    "fp32": {"exp", "log", "pow", "layer_norm", "rms_norm", "cross_entropy", "nll_loss",
             "mse_loss"},
    "fp32_output": {"softmax", "log_softmax", "sum"},
    "promote": {"cat", "stack"},
}
HELPERS = {"causal_mask", "dropout_mask", "manual_seed", "get_rng_state", "set_rng_state", "view"}


def test_every_op_is_classified_as_pytorch_does():
    table = mpt.autocast_categories()
    ops = set(F.__all__) - HELPERS
    assert ops <= set(table), ops - set(table)
    for op in ops:
        want = next((p for p, names in EXPECTED.items() if op in names), "passthrough")
        assert table[op] == want, op
        assert getattr(F, op).autocast_category == want


# one call per op: a function of (tensor factory) returning the output; the factory makes
# tensors of the format under test with the right shapes
IDX = np.array([0, 2, 1])


def _calls():
    def mk(shape, lo=0.5, hi=1.5):
        return lambda fmt: mpt.tensor(np.random.default_rng(0).uniform(lo, hi, shape), fmt)
    m34, m44, v4, img, k = mk((3, 4)), mk((4, 4)), mk((4,)), mk((1, 2, 4, 4)), mk((3, 2, 2, 2))
    return {
        "add": lambda f: F.add(m34(f), v4(f)), "sub": lambda f: F.sub(m34(f), 1.0),
        "mul": lambda f: F.mul(m34(f), v4(f)), "div": lambda f: F.div(m34(f), v4(f)),
        "neg": lambda f: F.neg(m34(f)), "abs": lambda f: F.abs(m34(f)),
        "exp": lambda f: F.exp(m34(f)), "log": lambda f: F.log(m34(f)),
        "sqrt": lambda f: F.sqrt(m34(f)), "pow": lambda f: F.pow(m34(f), 2.0),
        "relu": lambda f: F.relu(m34(f)), "gelu": lambda f: F.gelu(m34(f)),
        "silu": lambda f: F.silu(m34(f)), "tanh": lambda f: F.tanh(m34(f)),
        "sigmoid": lambda f: F.sigmoid(m34(f)), "clone": lambda f: F.clone(m34(f)),
        "sum": lambda f: F.sum(m34(f)), "mean": lambda f: F.mean(m34(f)),
        "var": lambda f: F.var(m34(f)), "max": lambda f: F.max(m34(f)),
        "reshape": lambda f: F.reshape(m34(f), 12),
        "transpose": lambda f: F.transpose(m34(f), 0, 1),
        "permute": lambda f: F.permute(m34(f), 1, 0), "flatten": lambda f: F.flatten(m34(f)),
        "unsqueeze": lambda f: F.unsqueeze(m34(f), 0), "squeeze": lambda f: F.squeeze(m34(f)),
        "expand": lambda f: F.expand(v4(f), 3, 4), "getitem": lambda f: F.getitem(m34(f), 1),
        "cat": lambda f: F.cat([m34(f), m34(f)]), "stack": lambda f: F.stack([m34(f), m34(f)]),
        "matmul": lambda f: F.matmul(m34(f), m44(f)), "linear": lambda f: F.linear(m34(f), m44(f)),
        "softmax": lambda f: F.softmax(m34(f)), "log_softmax": lambda f: F.log_softmax(m34(f)),
        "layer_norm": lambda f: F.layer_norm(m34(f), 4, v4(f), v4(f)),
        "rms_norm": lambda f: F.rms_norm(m34(f), 4, v4(f)),
        "embedding": lambda f: F.embedding(IDX, m34(f)),
        "dropout": lambda f: F.dropout(m34(f), 0.5),
        "cross_entropy": lambda f: F.cross_entropy(m34(f), IDX),
        "nll_loss": lambda f: F.nll_loss(m34(f), IDX),
        "mse_loss": lambda f: F.mse_loss(m34(f), m34(f)),
        "conv2d": lambda f: F.conv2d(img(f), k(f)), "max_pool2d": lambda f: F.max_pool2d(img(f), 2),
        "avg_pool2d": lambda f: F.avg_pool2d(img(f), 2),
        "scaled_dot_product_attention": lambda f: F.scaled_dot_product_attention(
            m34(f), m44(f), m44(f)),
    }


CALLS = _calls()


def test_the_table_driven_calls_cover_every_op():
    assert set(CALLS) == set(F.__all__) - HELPERS


@pytest.mark.parametrize("region", ["fp16", "bf16"])
@pytest.mark.parametrize("op", sorted(CALLS))
def test_op_behaves_as_its_category_says(op, region):
    policy = mpt.autocast_categories()[op]
    for fmt in ("fp32", "fp16", "bf16"):
        with mpt.autocast(region):
            out = CALLS[op](fmt)
        want = {"lower": region, "fp32": "fp32", "fp32_output": "fp32"}.get(policy, fmt)
        assert out.format.name == want, (op, fmt)
        if policy in ("lower", "fp32", "fp32_output"):
            # the op ran on inputs cast to `want`: the same bits as calling it on cast inputs
            # outside autocast (the region's model for GEMMs)
            with mpt.matmul_model("hopper"):
                direct = CALLS[op](fmt) if fmt == want else _on_cast_inputs(op, fmt, want)
            np.testing.assert_array_equal(bits(out), bits(direct))
    # fp64 tensors are never cast
    with mpt.autocast(region):
        assert CALLS[op]("fp64").format.name == "fp64"


def _on_cast_inputs(op, fmt, target):
    """The op on inputs made in ``fmt`` and explicitly rounded to ``target`` (outside autocast)."""
    original = mpt.tensor

    def cast_factory(x, f="fp32", requires_grad=False):
        return original(original(x, f), target, requires_grad)
    mpt.tensor = cast_factory
    try:
        return CALLS[op](fmt)
    finally:
        mpt.tensor = original


def test_promote_follows_the_widest():
    h, b, s = mpt.tensor([1.0], "fp16"), mpt.tensor([2.0], "bf16"), mpt.tensor([3.0], "fp32")
    with mpt.autocast("fp16"):
        assert F.cat([h, s]).format.name == "fp32"
        assert F.cat([h, b]).format.name == "fp32"  # fp16 with bf16: PyTorch promotes to fp32
        assert F.stack([b, b]).format.name == "bf16"
        assert (h + s).format.name == "fp32"  # pass-through ops use type promotion
        assert (h * 2.0).format.name == "fp16"
        d = mpt.tensor([1.0], "fp64")
        with pytest.raises(TypeError, match="fp32, other is fp64"):
            s + d  # fp64 is never cast, so the mismatch stays an error
    with pytest.raises(TypeError, match="input is fp16, other is fp32"):
        h + s


def test_softmax_under_autocast_computes_and_returns_fp32():
    x = np.random.default_rng(1).uniform(-6, 6, (4, 50)).astype(np.float16)
    with mpt.autocast("fp16"):
        y = F.softmax(mpt.Tensor(x), -1)
    assert y.format.name == "fp32"
    direct = F.softmax(mpt.Tensor(x.astype(np.float32)), -1)  # the exact upcast
    np.testing.assert_array_equal(bits(y), bits(direct))
    low = F.softmax(mpt.Tensor(x), -1)  # outside: fp16 output, one rounding of the fp32 result
    np.testing.assert_array_equal(bits(low), bits(direct.numpy().astype(np.float16)))


def test_fp32_op_casts_fp16_inputs_up():
    x = mpt.tensor(np.linspace(-3, 3, 20), "fp16", requires_grad=True)
    with mpt.autocast("fp16"):
        y = F.exp(x)
    assert y.format.name == "fp32"
    np.testing.assert_array_equal(bits(y), bits(F.exp(x.float())))
    y.backward(np.ones(20))
    assert x.grad.format.name == "fp16"  # the cast's backward rounds the gradient back


# ---- cast cache ----------------------------------------------------------------------------------


def test_cast_cache_reuses_one_cast_per_parameter_and_version():
    w = mpt.tensor(np.full((4, 4), 1 + 2.0**-9), "fp32", requires_grad=True)
    x = mpt.tensor(np.ones((2, 4)), "fp32")
    with mpt.autocast("fp16"):
        y1, y2 = F.linear(x, w), F.linear(x, w)
        assert y1._node.inputs[1] is y2._node.inputs[1]  # one cached fp16 copy
        w.copy_(np.full((4, 4), 3.0))  # an optimizer step: the version changes
        y3 = F.linear(x, w)
        assert y3._node.inputs[1] is not y1._node.inputs[1]
        assert y3.numpy()[0, 0] == 12.0  # the new values, not the stale cache
        h = mpt.tensor(np.ones((2, 4)), "fp32", requires_grad=True) * 1.0  # no leaf: never cached
        assert F.linear(h, w)._node.inputs[0] is not F.linear(h, w)._node.inputs[0]
    with mpt.autocast("fp16"):
        assert F.linear(x, w)._node.inputs[1] is not y3._node.inputs[1]  # a new region


def test_cast_cache_gradients_accumulate_through_the_shared_copy():
    w = mpt.tensor(np.eye(3), "fp32", requires_grad=True)
    x = mpt.tensor(np.ones((1, 3)), "fp32")
    with mpt.autocast("fp16"):
        loss = (F.linear(x, w) + F.linear(x * 2.0, w)).float().sum()
    loss.backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.full((3, 3), 3.0))


def test_cast_cache_is_keyed_by_grad_mode():
    w = mpt.tensor(np.eye(2), "fp32", requires_grad=True)
    x = mpt.tensor(np.ones((1, 2)), "fp32")
    with mpt.autocast("bf16"):
        with mpt.no_grad():
            F.linear(x, w)
        y = F.linear(x, w)
    assert y.requires_grad
    y.float().sum().backward()
    np.testing.assert_array_equal(w.grad.numpy(), np.ones((2, 2)))


# ---- regions, state, user ops --------------------------------------------------------------------


def test_disabled_region_and_state_snapshots():
    assert mpt.autocast_state() == mpt.AutocastState(False, None, "ieee_fma", True)
    x = mpt.tensor(np.ones((2, 2)), "fp32")
    with mpt.matmul_model("ampere"):
        with mpt.autocast("bf16", model="hopper"):
            inside = mpt.autocast_state()
            assert inside.enabled and inside.format.name == "bf16" and inside.model == "hopper"
            with mpt.autocast(enabled=False):
                assert F.matmul(x, x).format.name == "fp32"
                assert mpt.autocast_state().model == "hopper"
        assert mpt.autocast_state().model == "ampere" and not mpt.autocast_state().enabled
    with mpt.replay_autocast(inside):
        assert F.matmul(x, x).format.name == "bf16"
    assert mpt.autocast_state() == mpt.AutocastState()
    with pytest.raises(ValueError, match="'fp16' or 'bf16'"):
        mpt.autocast("fp32")
    with pytest.raises(TypeError, match="AutocastState"):
        mpt.replay_autocast("hopper")


def test_register_autocast_for_user_ops():
    def scale(x, y):
        return x * y

    wrapped = mpt.register_autocast(scale, "lower")
    assert mpt.autocast_categories()["scale"] == "lower"
    a, b = mpt.tensor([1.0]), mpt.tensor([2.0])
    with mpt.autocast("bf16"):
        assert wrapped(a, b).format.name == "bf16"
    assert wrapped(a, b).format.name == "fp32"

    class Twice(mpt.Function):
        @staticmethod
        def forward(ctx, x):
            return x + x

    twice = mpt.register_autocast(Twice, "fp32")
    with mpt.autocast("fp16"):
        assert twice(mpt.tensor([1.0], "fp16")).format.name == "fp32"
    assert mpt.autocast_categories()["Twice"] == "fp32"
    with pytest.raises(ValueError, match="category must be one of"):
        mpt.register_autocast(scale, "fp8")
    with pytest.raises(TypeError, match="Function subclass"):
        mpt.register_autocast(3, "fp32")
    assert CATEGORIES == ("lower", "fp32", "fp32_output", "promote", "passthrough")


def test_format_is_the_name_and_dtype_the_01_spelling():
    """One name for a tensor's format; ``dtype=`` (PyTorch's, mpt 0.1's) still works."""
    with mpt.autocast("bf16") as a, mpt.autocast(format="bf16") as b, \
            mpt.autocast(dtype="bf16") as c:
        assert a == b == c and c.format.name == "bf16" and c.dtype is c.format
    with mpt.autocast() as default:
        assert default.format.name == "fp16"
    state = mpt.AutocastState(True, dtype=mpt.get_format("bf16"))
    assert state == mpt.AutocastState(True, mpt.get_format("bf16")) and state.dtype.name == "bf16"
    with pytest.raises(TypeError, match="give format or dtype"):
        mpt.autocast(format="fp16", dtype="bf16")
    x = mpt.tensor(np.linspace(-3, 3, 12).reshape(3, 4), "bf16")
    for op in (F.softmax, F.log_softmax):
        y = op(x, -1, "fp32")
        assert y.format.name == "fp32"
        assert np.array_equal(bits(op(x, -1, dtype="fp32")), bits(y))
        assert np.array_equal(bits(op(x, -1, format="fp32")), bits(y))
        with pytest.raises(TypeError, match="not both"):
            op(x, -1, "fp32", dtype="fp32")
