"""mpt.Tensor, mpt.Function and the backward engine: formats of values and gradients, gradient
accumulation (fp32 opmath, one rounding), graph traversal, versions and error messages."""
import ml_dtypes
import numpy as np
import pytest

import mpt
from mpt.autograd.function import Function
from mpt.autograd.tensor import opmath, round_to
from mpt.reference import rounding as ref
from mpt.testing import as_bits as bits

# ---- construction --------------------------------------------------------------------------------


def test_tensor_rounds_once_to_nearest_even():
    # 1 + 2^-11 is the tie between fp16 1.0 and 1 + 2^-10: RNE picks the even 1.0;
    # 1 + 3·2^-11 ties between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
    t = mpt.tensor([1 + 2.0**-11, 1 + 3 * 2.0**-11, 65520.0, -2.0**-25], "fp16")
    assert t.format.name == "fp16" and t.dtype == np.float16
    np.testing.assert_array_equal(bits(t), np.array([0x3C00, 0x3C02, 0x7C00, 0x8000], np.uint16))
    x = np.random.default_rng(0).standard_normal(1000)
    np.testing.assert_array_equal(bits(mpt.tensor(x, "bf16")), ref.round_array(x, "bf16"))
    for fmt, dtype in (("fp32", np.float32), ("fp64", np.float64)):
        np.testing.assert_array_equal(bits(mpt.tensor(x, fmt)), bits(x.astype(dtype)))


def test_tensor_decodes_low_precision_arrays_exactly_and_never_aliases():
    a = np.arange(-8, 8, dtype=np.float32).astype(ml_dtypes.bfloat16)
    t = mpt.tensor(a, "fp32")
    np.testing.assert_array_equal(t.numpy(), np.arange(-8, 8, dtype=np.float32))
    b = np.ones(3, np.float32)
    u = mpt.tensor(b)
    b[0] = 5
    assert u.numpy()[0] == 1.0
    assert mpt.tensor(u, "fp16").format.name == "fp16"


FORMAT_DTYPES = [("fp64", np.float64), ("fp32", np.float32), ("fp16", np.float16),
                 ("bf16", ml_dtypes.bfloat16), ("fp8_e4m3fn", ml_dtypes.float8_e4m3fn),
                 ("fp8_e5m2", ml_dtypes.float8_e5m2), ("fp8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
                 ("fp8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz), ("e8m0", ml_dtypes.float8_e8m0fnu),
                 ("fp6_e2m3fn", ml_dtypes.float6_e2m3fn), ("fp4_e2m1fn", ml_dtypes.float4_e2m1fn),
                 ("int8", np.int8), ("uint8", np.uint8)]


@pytest.mark.parametrize("name, dtype", FORMAT_DTYPES, ids=[n for n, _ in FORMAT_DTYPES])
def test_tensor_takes_the_format_of_an_arrays_dtype(name, dtype):
    """As torch.tensor keeps a NumPy array's dtype: every value already is one of the format's,
    so the tensor holds the same bits (and never the caller's array)."""
    a = np.array([0.5, 1.0, 2.0, 4.0, 0.0, 1.5, 3.0]).astype(dtype)
    t = mpt.tensor(a)
    assert t.format.name == name and t.dtype == a.dtype
    assert np.array_equal(bits(t), a.view(f"u{a.itemsize}")) and t.data is not a
    assert mpt.tensor(a[3]).format.name == name                        # a NumPy scalar too
    assert mpt.tensor(t).format.name == name and mpt.tensor(t) is not t  # a Tensor: a new leaf
    assert np.array_equal(mpt.tensor(a, "fp64").numpy(), a.astype(np.float64), equal_nan=True)


def test_tensor_without_a_dtype_is_fp32():
    """Python numbers and lists, and integer or bool arrays of widths without a format, get fp32
    (torch's default dtype); the 0.1 behaviour for every input is ``format="fp32"``."""
    for x in (0.1, [0.1, 2], [[1, 2]], 3, True, np.arange(3), np.array([True, False])):
        t = mpt.tensor(x)
        assert t.format.name == "fp32", x
        assert np.array_equal(t.numpy(), np.asarray(x, np.float64).astype(np.float32))
    x = np.random.default_rng(1).standard_normal(5)                   # float64
    assert mpt.tensor(x).format.name == "fp64" and np.array_equal(mpt.tensor(x).numpy(), x)
    assert np.array_equal(bits(mpt.tensor(x, "fp32")), bits(x.astype(np.float32)))
    assert mpt.tensor(np.float16(0.1), "bf16").format.name == "bf16"   # a named format wins


def test_tensor_constructor_checks_dtype_and_values():
    with pytest.raises(TypeError, match="float16"):
        mpt.Tensor(np.zeros(2, np.float32), "fp16")
    with pytest.raises(TypeError, match="ndarray"):
        mpt.Tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="real numbers"):
        mpt.tensor(np.array(["a"]))
    with pytest.raises(ValueError, match="unknown format"):
        mpt.tensor([1.0], "fp17")


def test_properties_item_numpy_and_repr():
    t = mpt.tensor([[1.5, 2.0, 3.0]], "bf16")
    assert t.shape == (1, 3) and t.ndim == 2 and t.size == 3 and len(t) == 1
    assert t.dtype == np.dtype(ml_dtypes.bfloat16)
    n = t.numpy()
    n[0, 0] = 7
    assert t.numpy()[0, 0] == 1.5  # numpy() is a copy
    assert mpt.tensor(0.1, "fp64").item() == 0.1
    with pytest.raises(ValueError, match="one element"):
        t.item()
    assert "bf16" in repr(t)


# ---- gradients: formats and accumulation ---------------------------------------------------------


def test_gradient_has_the_tensor_format():
    x = mpt.tensor([0.5, 1.5, -2.0], "fp16", requires_grad=True)
    y = (x * x).sum()
    y.backward()
    assert x.grad.format.name == "fp16" and x.grad.dtype == np.float16
    np.testing.assert_array_equal(x.grad.numpy(), np.array([1.0, 3.0, -4.0], np.float16))


def test_fan_in_gradients_are_rounded_after_every_addition():
    # x feeds three products; the engine runs them latest-created first (PyTorch's order), so
    # the contributions arrive as 1, 2^-11, 2^-11 (fp16 numbers). Each is added in fp32 and the
    # partial sum rounded to fp16 (as PyTorch's engine accumulates an fp16 gradient):
    # 1 + 2^-11 is a tie -> 1.0, twice, so the result is 1.0, not the exact 1 + 2^-10 that one
    # rounding of the whole sum (or the order 2^-11, 2^-11, 1) would give.
    x = mpt.tensor([2.0], "fp16", requires_grad=True)
    c1, c2 = mpt.tensor([1.0], "fp16"), mpt.tensor([2.0**-11], "fp16")
    (x * c2 + x * c2 + x * c1).sum().backward()
    g = np.float16(1.0)
    for term in (np.float16(2.0**-11), np.float16(2.0**-11)):
        g = np.float16(np.float32(g) + np.float32(term))  # one fp32 addition, one rounding
    assert g == 1.0
    np.testing.assert_array_equal(bits(x.grad), bits(np.array([g], np.float16)))


def test_second_backward_adds_into_existing_grad_in_fp32():
    x = mpt.tensor([1.0], "bf16", requires_grad=True)
    (x * mpt.tensor([1.0], "bf16")).sum().backward()
    (x * mpt.tensor([2.0**-9], "bf16")).sum().backward()  # 1 + 2^-9: half an ulp of bf16 at 1
    expected = np.array([np.float32(1.0) + np.float32(2.0**-9)]).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(bits(x.grad), bits(expected))
    assert x.grad.item() == 1.0  # the tie rounds to even


def test_diamond_graph_runs_each_node_once():
    calls = []

    class Count(Function):
        @staticmethod
        def forward(ctx, x):
            return x.copy()

        @staticmethod
        def backward(ctx, g):
            calls.append(1)
            return g

    a = mpt.tensor([3.0], "fp64", requires_grad=True)
    b = Count.apply(a)
    d = b * b + b * 2.0  # b has two consumers
    d.backward()
    assert len(calls) == 1
    assert a.grad.item() == 2 * 3.0 + 2.0


def test_deep_chain_does_not_recurse():
    x = mpt.tensor([1.0], "fp32", requires_grad=True)
    y = x
    for _ in range(3000):
        y = y + 0.0
    y.sum().backward()
    assert x.grad.item() == 1.0


def test_grad_setter_checks_shape_and_format():
    x = mpt.tensor([1.0, 2.0], "fp32", requires_grad=True)
    x.grad = mpt.tensor([0.5, 0.5], "fp32")
    with pytest.raises(ValueError, match="fp32 tensor of shape"):
        x.grad = mpt.tensor([0.5, 0.5], "fp16")
    with pytest.raises(ValueError, match="shape"):
        x.grad = mpt.tensor([0.5], "fp32")
    with pytest.raises(TypeError, match="Tensor or None"):
        x.grad = np.zeros(2, np.float32)
    x.grad = None


def test_retain_grad_and_leaf_flags():
    x = mpt.tensor([1.0, 2.0], "fp32", requires_grad=True)
    h = x * 3.0
    h.retain_grad()
    (h * h).sum().backward()
    assert x.is_leaf and not h.is_leaf
    np.testing.assert_array_equal(h.grad.numpy(), [6.0, 12.0])
    np.testing.assert_array_equal(x.grad.numpy(), [18.0, 36.0])


def test_no_grad_and_detach():
    x = mpt.tensor([1.0], requires_grad=True)
    with mpt.no_grad():
        assert not mpt.is_grad_enabled()
        y = x * 2.0
        with mpt.enable_grad():
            assert (x * 2.0).requires_grad
    assert mpt.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf
    d = x.detach()
    assert not d.requires_grad and d.data is x.data


# ---- errors --------------------------------------------------------------------------------------


def test_backward_on_non_scalar_needs_grad():
    x = mpt.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2.0
    with pytest.raises(ValueError, match=r"non-scalar tensor of shape \(2,\) needs grad="):
        y.backward()
    with pytest.raises(ValueError, match="shape"):
        y.backward(np.ones(3))
    with pytest.raises(TypeError, match="format fp32"):
        y.backward(mpt.tensor([1.0, 1.0], "fp16"))
    y.backward(np.array([1.0, 0.5]))
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 1.0])


def test_backward_without_grad_requirement_raises():
    with pytest.raises(RuntimeError, match="does not require grad"):
        mpt.tensor([1.0]).backward()


def test_second_backward_through_freed_graph_raises_unless_retained():
    x = mpt.tensor([1.5], requires_grad=True)
    y = (x * x).sum()
    y.backward(retain_graph=True)
    y.backward()
    assert x.grad.item() == 6.0
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward()


@pytest.mark.parametrize("change", ["copy_", "setitem", "zero_", "data", "bump_version"])
def test_inplace_change_of_saved_tensor_raises(change):
    x = mpt.tensor([1.0, 2.0], requires_grad=True)
    w = mpt.tensor([3.0, 4.0])
    y = (x * w).sum()  # mul saves both operands
    {"copy_": lambda: w.copy_([5.0, 6.0]), "setitem": lambda: w.__setitem__(0, 9.0),
     "zero_": w.zero_, "data": lambda: setattr(w, "data", np.zeros(2, np.float32)),
     "bump_version": w.bump_version}[change]()
    assert w._version == 1
    with pytest.raises(RuntimeError, match=r"fp32 tensor of shape \(2,\) saved for backward was "
                                           r"modified in place \(version 1, saved at version 0\)"):
        y.backward()


def test_ops_that_save_nothing_ignore_later_changes():
    x = mpt.tensor([1.0, 2.0], requires_grad=True)
    w = mpt.tensor([3.0, 4.0])
    y = (x + w).sum()  # add saves nothing
    w.zero_()
    y.backward()
    np.testing.assert_array_equal(x.grad.numpy(), [1.0, 1.0])


def test_views_are_read_only():
    x = mpt.tensor(np.arange(6.0).reshape(2, 3), "fp32")
    v = x.reshape(3, 2)
    with pytest.raises(ValueError, match="read-only"):
        v[0, 0] = 1.0


def test_setitem_and_data_checks():
    x = mpt.tensor([1.0, 2.0], "fp16")
    with pytest.raises(TypeError, match="cast it with .to"):
        x[0] = mpt.tensor(1.0, "fp32")
    with pytest.raises(TypeError, match="float16 ndarray"):
        x.data = np.zeros(2, np.float32)
    x[1] = 1 + 2.0**-11  # rounded (RNE) to fp16
    assert x.numpy()[1] == 1.0
    with pytest.raises(ValueError, match="copy_ needs shape"):
        x.copy_([1.0])


# ---- user Functions ------------------------------------------------------------------------------


class Cube(Function):
    """x³ in float64, rounded to x's format; gradient 3x²·g returned in float64."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return round_to(opmath(x).astype(np.float64) ** 3, mpt.get_format(x.dtype))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved
        return 3.0 * opmath(x).astype(np.float64) ** 2 * opmath(g)


def test_user_function_grads_are_rounded_to_the_input_format():
    x = mpt.tensor([1 + 2.0**-7, 3.0], "bf16", requires_grad=True)
    y = Cube.apply(x)
    assert y.format.name == "bf16"
    y.backward(np.ones(2))
    exact = 3.0 * x.numpy().astype(np.float64) ** 2
    np.testing.assert_array_equal(bits(x.grad), bits(exact.astype(ml_dtypes.bfloat16)))
    assert Cube.apply(mpt.tensor([2.0], "fp32")).requires_grad is False


def test_function_errors():
    class Bad(Function):
        @staticmethod
        def forward(ctx, x):
            return 1.0

    with pytest.raises(TypeError, match="must return an ndarray"):
        Bad.apply(mpt.tensor([1.0]))

    class WrongShape(Function):
        @staticmethod
        def forward(ctx, x):
            return x.copy()

        @staticmethod
        def backward(ctx, g):
            return np.zeros(5, np.float32)

    with pytest.raises(RuntimeError, match=r"gradient of shape \(5,\)"):
        WrongShape.apply(mpt.tensor([1.0], requires_grad=True)).sum().backward()

    class TooMany(WrongShape):
        @staticmethod
        def backward(ctx, g):
            return g, g

    with pytest.raises(RuntimeError, match="returned 2 gradients for 1 forward arguments"):
        TooMany.apply(mpt.tensor([1.0], requires_grad=True)).sum().backward()


def test_needs_input_grad():
    seen = []

    class Probe(Function):
        @staticmethod
        def forward(ctx, a, b, k):
            seen.append(ctx.needs_input_grad)
            return a + b

        @staticmethod
        def backward(ctx, g):
            return g, None, None

    a, b = mpt.tensor([1.0], requires_grad=True), mpt.tensor([1.0])
    Probe.apply(a, b, 3).sum().backward()
    with mpt.no_grad():
        Probe.apply(a, b, 3)
    assert seen == [(True, False, False), (False, False, False)]


# ---- casts and operators -------------------------------------------------------------------------


def test_to_rounds_and_its_backward_rounds_the_gradient_back():
    x = mpt.tensor([1 + 2.0**-12, 70000.0], "fp32", requires_grad=True)
    h = x.to("fp16")
    np.testing.assert_array_equal(bits(h), np.array([0x3C00, 0x7C00], np.uint16))
    assert x.to("fp32") is x
    h.backward(np.array([3.0, 0.25]))
    assert x.grad.format.name == "fp32"
    np.testing.assert_array_equal(x.grad.numpy(), [3.0, 0.25])
    y = mpt.tensor([1 + 2.0**-8], "fp32", requires_grad=True)
    y.to("fp64").backward(np.array([1 + 2.0**-30]))  # fp64 grad rounded RNE to fp32
    assert y.grad.item() == np.float32(1 + 2.0**-30)
    assert x.to("fp32", mode="toward_zero") is x


def test_operators_dispatch_to_functional():
    a = mpt.tensor([[1.0, 2.0], [3.0, 4.0]], "fp64")
    b = mpt.tensor([[0.5, -1.0], [2.0, 0.25]], "fp64")
    A, B = a.numpy(), b.numpy()
    for got, want in ((a + b, A + B), (a - b, A - B), (a * b, A * B), (a / b, A / B),
                      (-a, -A), (a ** 2.0, A**2), (2.0 ** a, 2.0**A), (1.0 - a, 1 - A),
                      (3.0 / a, 3 / A), (a[1], A[1]), (a.T, A.T), (abs(b), np.abs(B)),
                      (a.sum(), A.sum()), (a.mean(0), A.mean(0)), (a.exp(), np.exp(A))):
        np.testing.assert_allclose(got.numpy(), want, rtol=2.0**-50)
    np.testing.assert_array_equal(a > b, A > B)
    np.testing.assert_array_equal(a == 2.0, A == 2.0)
    with pytest.raises(ValueError, match="ambiguous"):
        bool(a > 0)


@pytest.mark.parametrize("src,fmt", [(np.float32, "fp16"), (np.float32, "bf16"),
                                     (np.float64, "fp32"), (np.float64, "fp16")])
def test_round_to_fast_path_equals_mpt_round(src, fmt):
    # round_to uses astype for these pairs: it must give mpt.round's bits on every kind of input
    # (random bit patterns cover NaN payloads, Inf, subnormals, overflow; plus ties)
    from mpt.rounding import round as mpt_round
    width = np.uint32 if src == np.float32 else np.uint64
    rng = np.random.default_rng(0)
    x = rng.integers(0, np.iinfo(width).max, 200_000, dtype=width, endpoint=True).view(src)
    f = mpt.get_format(fmt)
    ties = (np.arange(-300, 300) * 2.0 + 1) * f.min_subnormal / 2  # midpoints near zero
    # values and ties in the top binade, up to the overflow threshold (beyond: Inf in src too)
    big = (2.0 ** (f.mantissa_bits + 1) - np.arange(1, 40) / 4) * 2.0 ** (f.emax - f.mantissa_bits)
    with np.errstate(over="ignore"):
        x = np.concatenate([x, ties.astype(src), big.astype(src), -big.astype(src),
                            np.array([np.inf, -np.inf, 0.0, -0.0], src)])
    got, want = round_to(x, f), mpt_round(x, f)
    nan = np.isnan(want.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(got.astype(np.float64)), nan)
    np.testing.assert_array_equal(bits(got)[~nan], bits(want)[~nan])
