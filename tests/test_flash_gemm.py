"""The tile GEMMs of the flash-attention kernels (``mpt.kernels.flash_gemm.tile_mm``) under the
block models, bit for bit against the numpy oracle ``mpt.reference.attention.mma``: shapes that
take the transposed product (a narrow c) or not, operands read in place or transposed (both
packing orders of ``mpt.kernels.block_pack.tile_pack``, partial 8 x 8 blocks), zero and non-zero
c, and exponents from where the fast path applies to where it falls back to the general kernel.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from numba import njit

import mpt
from mpt.functional.attention import flash_mma_model
from mpt.kernels.attention import engine_params
from mpt.kernels.flash_gemm import ZERO, acc_tile, tile_mm, tile_scratch
from mpt.reference import attention as RA
from mpt.testing import as_bits as bits

MODELS = [("bf16", "hopper"), ("fp16", "hopper"), ("bf16", "ampere"), ("fp8_e4m3fn", "hopper")]


@njit
def _tile_mm(c, a, a_t, b, b_t, m, n, kk, eng):
    tile_mm(c, a, ZERO, ZERO, a_t, b, ZERO, ZERO, b_t, m, n, kk, eng, tile_scratch(eng, m, kk, n))


def _operand(rng, shape, fmt, scale_exp, zeros):
    x = rng.standard_normal(shape) * 2.0 ** (scale_exp + rng.integers(-3, 4, shape))
    x[rng.random(shape) < zeros] = 0.0
    return mpt.round(x, fmt).astype(np.float32)


@settings(max_examples=60)
@given(model=st.sampled_from(MODELS), m=st.integers(1, 80), n=st.integers(1, 80),
       kk=st.integers(1, 70), a_t=st.booleans(), b_t=st.booleans(),
       exps=st.tuples(st.integers(-70, 4), st.integers(-70, 4), st.integers(-110, 20)),
       zero_c=st.booleans(), zeros=st.sampled_from([0.0, 0.3]), seed=st.integers(0, 2**32 - 1))
def test_tile_mm_bits_equal_the_oracle(model, m, n, kk, a_t, b_t, exps, zero_c, zeros, seed):
    fmt, name = model
    spec = flash_mma_model(fmt, name)
    emin = mpt.get_format(fmt).emin
    rng = np.random.default_rng(seed)
    a = _operand(rng, (m, kk), fmt, exps[0], zeros)                         # (m, kk)
    b = _operand(rng, (kk, n), fmt, exps[1], zeros)                         # (kk, n)
    c0 = np.zeros((m, n), np.float32) if zero_c else \
        (rng.standard_normal((m, n)) * 2.0 ** exps[2]).astype(np.float32)   # (m, n)
    c = acc_tile(m, n, np.float32)
    c[:m, :n] = c0
    a3 = np.ascontiguousarray(a.T if a_t else a)[None]   # (1, kk, m) read transposed, or (1, m, kk)
    b3 = np.ascontiguousarray(b.T if b_t else b)[None]   # (1, n, kk) read transposed, or (1, kk, n)
    _tile_mm(c, a3, np.bool_(a_t), b3, np.bool_(b_t), m, n, kk,
             engine_params(spec, False, emin))
    want = RA.mma(c0, a, b, spec, emin)
    np.testing.assert_array_equal(bits(c[:m, :n]), bits(want))
