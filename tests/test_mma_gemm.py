"""mpt.gemm: the software around the Tensor Core (split-K, FP8 promotion, scales, epilogue).

Checked bit for bit against ``mpt.reference.mma.gemm_reference`` (one element at a time, exact
rationals), plus the invariants that tie gemm to mma.
"""
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpt
from mpt.formats import get_format
from mpt.reference.mma import encode_bits, gemm_reference
from mpt.testing import as_bits as _bits


def _model_dict(model, fmt, accumulate="fp32"):
    m = mpt.get_mma_model(model)
    cfg = m.config(fmt, fmt)
    rounding, e_zero = cfg.output(accumulate)
    return {"kind": m.kind, "block": cfg.block, "fraction_bits": cfg.fraction_bits,
            "e_zero": e_zero, "rounding": rounding}, cfg.block or 1


def _values(rng, fmt, shape, spread):
    """Finite values of fmt: random significands over 2^±spread (both signs, some zeros)."""
    x = rng.standard_normal(shape) * 2.0 ** rng.integers(-spread, spread + 1, shape)
    x[rng.random(shape) < 0.05] = 0.0
    dtype = get_format(fmt).dtype
    with np.errstate(over="ignore"):
        y = x.astype(np.float32).astype(dtype)
    return np.where(np.isfinite(y.astype(np.float32)), y, np.zeros((), dtype)).astype(dtype)


def _plain(x):
    """None, a float (0-d) or nested lists: the oracle's inputs."""
    return None if x is None else float(x) if np.ndim(x) == 0 else x.tolist()


CASES = [("hopper", "fp8_e4m3fn"), ("ada", "fp8_e5m2"), ("ampere", "fp16"), ("volta", "fp16"),
         ("blackwell", "bf16"), ("ieee_fma", "fp32"), ("ieee_mul_add", "fp32"), ("exact", "bf16")]


@pytest.mark.parametrize("model, fmt", CASES)
@given(data=st.data())
@settings(max_examples=80)
def test_matches_oracle(model, fmt, data):
    """Every combination of split_k, promote_every, per-tensor/per-block scales, c and the
    output cast equals the oracle's bits."""
    md, block = _model_dict(model, fmt)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32)))
    promote = data.draw(st.sampled_from([None, block, 2 * block, 3 * block]))
    m, n = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 2 * (promote or 1) + 1))
    k = data.draw(st.integers(1, 5 * block + 2))
    split_k = data.draw(st.integers(1, 4))
    a = _values(rng, fmt, (m, k), 6)
    b = _values(rng, fmt, (k, n), 6)
    c = data.draw(st.sampled_from([None, _values(rng, "fp32", (m, n), 12)]))
    scales = data.draw(st.sampled_from(["none", "tensor"] + (["a", "block"] if promote else [])))
    kg, ng = -(-k // (promote or 1)), -(-n // (promote or 1))
    sa = sb = None
    if scales == "tensor":
        sa, sb = (np.float32(2.0 ** rng.integers(-3, 4) * rng.uniform(1, 2)) for _ in range(2))
    elif scales in ("a", "block"):
        sa = (2.0 ** rng.integers(-3, 4, (m, kg)) * rng.uniform(1, 2, (m, kg))).astype(np.float32)
        sb = np.float32(0.75) if scales == "a" else \
            (2.0 ** rng.integers(-3, 4, (kg, ng)) * rng.uniform(1, 2, (kg, ng))).astype(np.float32)
    out = data.draw(st.sampled_from(["fp32", "fp16", "bf16"]))
    d = mpt.gemm(a, b, c, model=model, split_k=split_k, promote_every=promote, scale_a=sa,
                 scale_b=sb, out_format=out)
    want = gemm_reference(_plain(a.astype(np.float32)), _plain(b.astype(np.float32)), _plain(c),
                          md, a_format=fmt, b_format=fmt, split_k=split_k, unit=block,
                          promote_every=promote, scale_a=_plain(sa), scale_b=_plain(sb),
                          out_format=out)
    assert _bits(d).tolist() == [[encode_bits(x, out) for x in row] for row in want]


@pytest.mark.parametrize("model, fmt", CASES)
def test_defaults_equal_mma(model, fmt):
    """gemm with no split-K, promotion or scales is the hardware chain of mma, batches included."""
    rng = np.random.default_rng(1)
    a = _values(rng, fmt, (2, 1, 19, 70), 4)
    b = _values(rng, fmt, (3, 70, 21), 4)
    c = _values(rng, "fp32", (19, 21), 4)
    for cc in (None, c):
        assert np.array_equal(_bits(mpt.gemm(a, b, cc, model=model)),
                              _bits(mpt.mma(a, b, cc, model=model)))


def test_promotion_every_k_or_more_is_no_promotion():
    """A promotion register that starts empty (−0) takes the first partial unchanged."""
    rng = np.random.default_rng(2)
    a = _values(rng, "fp8_e4m3fn", (5, 96), 3)
    b = _values(rng, "fp8_e4m3fn", (96, 7), 3)
    fast = mpt.gemm(a, b, model="hopper")
    assert np.array_equal(_bits(mpt.gemm(a, b, model="hopper", promote_every=96)), _bits(fast))
    assert np.array_equal(_bits(mpt.gemm(a, b, model="hopper", promote_every=128)), _bits(fast))


def test_fp8_promotion_recovers_accuracy():
    """DeepSeek-V3 §3.3.2: Hopper's e8m13 FP8 accumulator chained over K = 4096 loses ~2^-10 of
    relative accuracy on positive data; promoting every 128 products into FP32 removes most of it.
    (A fixed seed: the assertion is on bits that never change, the factor is illustrative.)"""
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 1.5, (16, 4096)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    b = rng.uniform(0.5, 1.5, (4096, 16)).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
    exact = mpt.gemm(a, b, model="exact").astype(np.float64)
    fast = mpt.gemm(a, b, model="hopper").astype(np.float64)
    promoted = mpt.gemm(a, b, model="hopper", promote_every=128).astype(np.float64)
    err_fast = np.abs(fast / exact - 1).max()
    err_promoted = np.abs(promoted / exact - 1).max()
    assert err_fast > 2.0**-11 and err_promoted < err_fast / 8


def test_accumulate_fp16_is_the_tensor_core_fp16_mode():
    """FP16 accumulation (RNE-FP16 after every block) differs from FP32 accumulation with one
    FP16 rounding at the end; the first equals mma with FP16 output."""
    rng = np.random.default_rng(4)
    a = _values(rng, "fp16", (8, 512), 2)
    b = _values(rng, "fp16", (512, 8), 2)
    c16 = np.zeros((8, 8), np.float16)
    acc16 = mpt.gemm(a, b, c16, model="ampere", accumulate="fp16", out_format="fp16")
    assert np.array_equal(_bits(acc16), _bits(mpt.mma(a, b, c16, model="ampere")))
    epilogue = mpt.gemm(a, b, model="ampere", out_format="fp16")
    assert np.array_equal(_bits(epilogue), _bits(mpt.mma(a, b, model="ampere").astype(np.float16)))
    assert not np.array_equal(_bits(acc16), _bits(epilogue))


@pytest.mark.parametrize("m, k, n", [(9, 37, 35), (40, 3, 3), (3, 600, 5), (1, 1, 1), (2, 0, 3)])
def test_ieee_fma_tiles_against_oracle(m, k, n):
    """The register-blocked FMA kernel at tile edges (8 x 32 tiles), in both orientations
    (C^T = B^T·A^T when that pads less), and across k-slices of 512."""
    rng = np.random.default_rng(m * k * n)
    a = _values(rng, "fp32", (m, k), 20)
    b = _values(rng, "fp32", (k, n), 20)
    c = _values(rng, "fp32", (m, n), 20)
    md, _ = _model_dict("ieee_fma", "fp32")
    d = mpt.gemm(a, b, c, model="ieee_fma")
    want = gemm_reference(a.tolist(), b.tolist(), c.tolist(), md)
    assert _bits(d).tolist() == [[encode_bits(x, "fp32") for x in row] for row in want]


def test_bad_arguments():
    a = np.ones((4, 64), ml_dtypes.float8_e4m3fn)
    b = np.ones((64, 4), ml_dtypes.float8_e4m3fn)
    with pytest.raises(ValueError, match="split_k must be a positive int"):
        mpt.gemm(a, b, model="hopper", split_k=0)
    with pytest.raises(ValueError, match="promote_every must be a multiple of the model's block"):
        mpt.gemm(a, b, model="hopper", promote_every=48)
    with pytest.raises(ValueError, match="promote_every must be None or a positive int"):
        mpt.gemm(a, b, model="hopper", promote_every=-32)
    with pytest.raises(ValueError, match="per-block scales need promote_every"):
        mpt.gemm(a, b, model="hopper", scale_a=np.ones((4, 1), np.float32))
    with pytest.raises(ValueError, match=r"scale_b must be .*shape \(2, 1\)"):
        mpt.gemm(a, b, model="hopper", promote_every=32, scale_b=np.ones((1, 1, 2), np.float32))
    with pytest.raises(TypeError, match="scale_a must be a Python number or float32"):
        mpt.gemm(a, b, model="hopper", scale_a=np.ones(1))
    with pytest.raises(ValueError, match="out_format must be 'fp32', 'fp16' or 'bf16'"):
        mpt.gemm(a, b, model="hopper", out_format="e4m3")
    with pytest.raises(ValueError, match="accumulate must be"):
        mpt.gemm(a, b, model="hopper", accumulate="fp8")
    h = np.ones((4, 64), np.float16)
    with pytest.raises(ValueError, match="accumulate='fp16' models the Tensor Core's FP16"):
        mpt.gemm(h, h.T, model="ampere", accumulate="fp16", split_k=2)
    with pytest.raises(ValueError, match="out_format must be one of 'fp32'"):
        mpt.gemm(h.astype(np.float32), h.T.astype(np.float32), model="hopper", in_format="tf32",
                 accumulate="fp16")
