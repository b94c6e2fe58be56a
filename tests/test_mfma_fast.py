"""The register-blocked kernel of CDNA3/CDNA4's fused rules gives the general kernel's bits.

``mpt.kernels.mfma_packed.fused_chain_packed`` takes the fused rules without block scales on
operands whose products are finite and, where not zero, within [2^-60, 2^60] (``packed_tops``);
everything else takes ``mpt.kernels.mfma.fused_chain``. Here each path is taken on purpose (the
operand object's ``rows`` is asserted: non-zero = packed) and the packed bits are compared with
the general kernel's (an extra batch element holding an Inf, or for FNUZ a NaN, sends the whole
call there) and, on small products, with the exact-rational oracle ``mpt.reference.mfma``.
Inputs are adversarial: every finite fp16 pattern (subnormals, ±0), bf16 over a wide exponent
spread, accumulators that are subnormal, ±0, huge, Inf or NaN, exact cancellations, K that is no
multiple of the group, odd shapes, batches, chunks over k, both thread counts.
"""
import math
from fractions import Fraction

import ml_dtypes
import numba
import numpy as np
import pytest

import mpt
from mpt.engines.amd import MFMAOperands
from mpt.formats import get_format
from mpt.kernels.mfma_packed import finish_fast
from mpt.reference.mfma import exponent, mfma_reference
from mpt.reference.rounding import round_exact

FNUZ = ml_dtypes.float8_e4m3fnuz

# (model, input format, variant or None): groups of 8 (the unrolled kernel), of 4 (the kernel of
# any group size), the FP8 rule (even/odd halves), CDNA4's wide f16 and its OCP fp8 as CDNA3's
CASES = [("cdna3", "fp16", None), ("cdna3", "bf16", None),
         ("cdna3", "fp16", "v_mfma_f32_16x16x16_f16"),
         ("cdna3", "bf16", "v_mfma_f32_32x32x4_2b_bf16"), ("cdna3", "tf32", None),
         ("cdna3", "fp8_e4m3fnuz", None), ("cdna3", "fp8_e5m2fnuz", None),
         ("cdna4", "fp16", "v_mfma_f32_16x16x32_f16"), ("cdna4", "fp8_e4m3fn", None)]


def _dtype(fmt):
    return np.float32 if fmt == "tf32" else get_format(fmt).dtype


def _operands(model, fmt, a, b, variant=None):
    m = mpt.get_mma_model(model)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return MFMAOperands(m, m.config(fmt, fmt, variant), a, b, (fmt, fmt), "fp32", batch)


def _run(model, fmt, a, b, c, variant=None, pieces=(0,)):
    """(D bits, whether the packed kernel ran) of a·b + c (a, b: (B, ·, ·)), the chain run over
    k in the pieces [p_i, p_i+1) (multiples of the instruction's K)."""
    ops = _operands(model, fmt, a, b, variant)
    acc = ops.new_acc(c)
    bounds = list(pieces) + [a.shape[-1]]
    for k0, k1 in zip(bounds, bounds[1:]):
        ops.chain(acc, k0, k1)
    return ops.values(acc).view(np.uint32), bool(ops.rows)


def _packed_and_general(model, fmt, a, b, c, variant=None, pieces=(0,)):
    """D bits of the packed kernel (asserted to run) and of the general one (an extra batch
    element with an Inf — FNUZ: NaN — sends the call there; asserted too)."""
    got, packed = _run(model, fmt, a, b, c, variant, pieces)
    assert packed, "the register-blocked kernel should take these operands"
    nb = max(len(a), len(b))
    a, b = (np.broadcast_to(x, (nb,) + x.shape[1:]) for x in (a, b))
    spoil = np.full((1,) + a.shape[1:], np.nan if "fnuz" in fmt else np.inf,
                    np.float32).astype(a.dtype)
    want, packed = _run(model, fmt, np.concatenate([a, spoil]), np.concatenate([b, b[:1]]),
                        np.concatenate([c, c[:1]]), variant, pieces)
    assert not packed
    return got, want[:-1]


def _finite_patterns(rng, fmt, shape, spread):
    """Random finite values of fmt: every pattern (fp16: subnormals and ±0 included; 8-bit:
    every finite), or for wide formats exponents within ±spread of 2^0, with random signs,
    fractions, and 10% zeros of both signs."""
    f = get_format("fp32" if fmt == "tf32" else fmt)
    if f.bits <= 16 and f.exponent_bits <= 5:
        bits = rng.integers(0, 1 << f.bits, shape).astype(np.uint16 if f.bits == 16 else np.uint8)
        x = bits.view(f.dtype).astype(np.float32)
        x[~np.isfinite(x)] = 0.0
    else:
        x = np.ldexp(rng.uniform(1, 2, shape), rng.integers(-spread, spread + 1, shape))
        x = (x * rng.choice([-1, 1], shape)).astype(np.float32).astype(_dtype(fmt))
        x = x.astype(np.float32)
    x[rng.random(shape) < 0.1] = 0.0
    x[rng.random(shape) < 0.05] = -0.0
    return x.astype(_dtype(fmt))


def _accumulator(rng, shape, scale):
    """C: normal values around ``scale``, with subnormals, ±0, the largest finite, Inf, NaN."""
    c = (rng.standard_normal(shape) * scale).astype(np.float32)
    special = np.array([0.0, -0.0, 1e-45, -3e-39, 3.4028235e38, -np.inf, np.inf, np.nan,
                        2.0**-126, 2.0**100], np.float32)
    pick = rng.random(shape) < 0.15
    c[pick] = rng.choice(special, pick.sum())
    return c


@pytest.mark.parametrize("model, fmt, variant", CASES)
@pytest.mark.parametrize("shape", [(1, 1, 1), (1, 3, 5, 7), (2, 37, 70, 45), (1, 9, 200, 33),
                                   (2, 70, 24, 5)])
def test_packed_equals_general_on_adversarial_inputs(model, fmt, variant, shape):
    """Random finite operands over the whole packed range, awkward accumulators; K that is no
    multiple of the group (zero padding), odd M and N (tile edges), batches, and a tall, narrow
    product the kernel computes transposed (B's values in A's role: its anchor codes too)."""
    rng = np.random.default_rng(hash((model, fmt, variant, shape)) % 2**32)
    nb, m, k, n = (1,) * (4 - len(shape)) + shape if len(shape) < 4 else shape
    spread = 29 if fmt in ("bf16", "tf32") else 0   # |products| within [2^-60, 2^60]
    a = _finite_patterns(rng, fmt, (nb, m, k), spread)
    b = _finite_patterns(rng, fmt, (nb, k, n), spread)
    assert _operands(model, fmt, a, b, variant).swap == (n < 8 and m > 32)
    for scale in (1.0, 2.0**-20, 2.0**40):
        c = _accumulator(rng, (nb, m, n), scale)
        got, want = _packed_and_general(model, fmt, a, b, c, variant)
        assert np.array_equal(got, want)


@pytest.mark.parametrize("model, fmt, variant", CASES)
def test_packed_equals_oracle_on_small_products(model, fmt, variant):
    """The exact-rational oracle on small products of the same adversarial inputs."""
    rng = np.random.default_rng(7)
    m_ = mpt.get_mma_model(model)
    cfg = m_.config(fmt, fmt, variant)
    spec = {"rule": cfg.param("rule"), "k": cfg.block, "group": cfg.param("group"),
            "flush": cfg.param("flush"), "out": "fp32", "nan": m_.choice("several_nans")}
    for m, k, n in [(2, 5, 3), (3, 2 * cfg.block + 3, 2), (1, 40, 4)]:
        spread = 29 if fmt in ("bf16", "tf32") else 0
        a = _finite_patterns(rng, fmt, (1, m, k), spread)
        b = _finite_patterns(rng, fmt, (1, k, n), spread)
        c = _accumulator(rng, (1, m, n), 2.0 ** int(rng.integers(-30, 30)))
        got, packed = _run(model, fmt, a, b, c, variant)
        assert packed
        width = np.uint32 if fmt == "tf32" else (np.uint8 if get_format(fmt).bits <= 8
                                                 else np.uint16)
        want = mfma_reference(a[0].view(width).tolist(), b[0].view(width).tolist(),
                              c[0].view(np.uint32).tolist(), spec, fmt, fmt)
        assert got[0].tolist() == want


def test_cancellation_signed_zeros_and_extreme_spreads():
    """Exact cancellation (x·y and −x·y in one group, down to an exact +0 from −0 operands and
    C), one huge and one tiny product per group (truncation to 24 bits below the anchor), an
    accumulator 25 or more binades above or below the products."""
    rng = np.random.default_rng(11)
    for fmt in ("fp16", "bf16"):
        dtype = _dtype(fmt)
        top = 14 if fmt == "fp16" else 29
        x = np.ldexp(rng.uniform(1, 2, (3, 16, 64)), rng.integers(-top, top + 1, (3, 16, 64)))
        a = x.astype(np.float32).astype(dtype)
        a[:, :, 1::2] = -a[:, :, 0::2]                     # pairs that cancel exactly
        a[2, :, 0::8] = np.float32(2.0**top)               # one huge product per group
        a[2, :, 1::8] = np.float32(2.0**-top)              # and a tiny one
        b = np.repeat(rng.uniform(-2, 2, (3, 32, 20)), 2, axis=1).astype(np.float32).astype(dtype)
        b[1] = -0.0
        c = np.stack([np.full((16, 20), -0.0, np.float32),
                      np.ldexp(1.0, rng.integers(-40, 40, (16, 20))).astype(np.float32),
                      (rng.standard_normal((16, 20)) * 2.0**-24).astype(np.float32)])
        for model, variant in [("cdna3", None), ("cdna3", "v_mfma_f32_32x32x4_2b_" + fmt[:4]
                                                  .replace("fp16", "f16"))]:
            got, want = _packed_and_general(model, fmt, a, b, c, variant)
            assert np.array_equal(got, want)
        got, _ = _run("cdna3", fmt, a[1:2], b[1:2], c[:1])
        assert np.all(got == 0)                            # x·(−0) + −0: +0 (the fused rule)


def test_chunks_over_k_and_thread_counts():
    """The chain over k in pieces (as mpt.gemm's promotion runs it; more than one tile call of
    128 k), mpt.gemm, and one or two threads give one set of bits."""
    rng = np.random.default_rng(13)
    a = _finite_patterns(rng, "fp16", (2, 21, 400), 0)
    b = _finite_patterns(rng, "fp16", (1, 400, 70), 0)
    c = _accumulator(rng, (2, 21, 70), 4.0)
    whole, want = _packed_and_general("cdna3", "fp16", a, b, c)
    assert np.array_equal(whole, want)
    for pieces in [(0, 8, 136), (0, 128, 256, 264)]:
        got, _ = _packed_and_general("cdna3", "fp16", a, b, c, pieces=pieces)
        assert np.array_equal(got, whole)
    for threads in (1, 2):
        numba.set_num_threads(threads)
        try:
            got, packed = _run("cdna3", "fp16", a, b, c)
        finally:
            numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        assert packed and np.array_equal(got, whole)
    d = mpt.gemm(a[0], b[0], c[0], model="cdna3")
    assert np.array_equal(d.view(np.uint32), whole[0])


def test_fallback_where_the_proof_ends():
    """Inf or NaN operands, products beyond 2^60 or non-zero products below 2^-60, block-scaled
    variants and the other rules take the general kernel, and still agree with the oracle."""
    rng = np.random.default_rng(17)
    ok = _finite_patterns(rng, "bf16", (1, 4, 16), 5)
    b = _finite_patterns(rng, "bf16", (1, 16, 3), 5)
    c = np.zeros((1, 4, 3), np.float32)
    assert _run("cdna3", "bf16", ok, b, c)[1]
    for value in (np.inf, np.nan, 2.0**61, 2.0**-61):
        a = ok.copy()
        a[0, 1, 2] = value
        b2 = b.copy()
        b2[0, 2, :] = 1.0
        got, packed = _run("cdna3", "bf16", a, b2, c)
        assert not packed
        spec = {"rule": "fused", "k": 8, "group": 8, "flush": False, "out": "fp32",
                "nan": "first"}
        want = mfma_reference(a[0].view(np.uint16).tolist(), b2[0].view(np.uint16).tolist(),
                              c[0].view(np.uint32).tolist(), spec, "bf16", "bf16")
        assert got[0].tolist() == want
    x = _finite_patterns(rng, "fp16", (1, 4, 16), 0)
    assert not _run("cdna2", "fp16", x, x.transpose(0, 2, 1)[:, :16, :3], c)[1]   # pairwise
    fp8 = rng.standard_normal((1, 4, 64)).astype(ml_dtypes.float8_e4m3fn)
    ops = _operands("cdna4", "fp8_e4m3fn", fp8, fp8.transpose(0, 2, 1),
                    "v_mfma_scale_f32_32x32x64_f8f6f4")
    assert not ops.rows                                    # block scales: general kernel
    fnuz = rng.standard_normal((1, 4, 16)).astype(FNUZ)
    fnuz[0, 0, 0] = np.nan
    assert not _run("cdna3", "fp8_e4m3fnuz", fnuz, fnuz.transpose(0, 2, 1), c[:, :, :3].repeat(
        2, axis=2)[:, :, :4])[1]


def test_float32_finish_edges():
    """The float32 finish (every E of a tile at least 2^-90): a tiny negative C far below the
    products (c·2^(24−E) underflows to −0, yet its floor is −1 unit of 2^(E−24)), a positive one
    (floor 0), ±0, Inf and NaN C, against the oracle."""
    spec = {"rule": "fused", "k": 8, "group": 8, "flush": False, "out": "fp32", "nan": "first"}
    a = np.zeros((1, 1, 8), np.float32)
    a[0, 0, 0] = 2.0**30
    a = a.astype(ml_dtypes.bfloat16)
    b = a.transpose(0, 2, 1).copy()
    for c in (-(2.0**-149), 2.0**-149, -0.0, 0.0, -np.inf, np.nan, -(2.0**-126)):
        cc = np.full((1, 1, 1), c, np.float32)
        got, packed = _run("cdna3", "bf16", a, b, cc)
        assert packed
        want = mfma_reference(a[0].view(np.uint16).tolist(), b[0].view(np.uint16).tolist(),
                              cc[0].view(np.uint32).tolist(), spec, "bf16", "bf16")
        assert got[0].tolist() == want
    got, _ = _run("cdna3", "bf16", a, b, np.full((1, 1, 1), -(2.0**-149), np.float32))
    assert got[0, 0, 0] == np.float32(2.0**60 - 2.0**36).view(np.uint32)


def test_anchor_codes_refuse_exponents_out_of_range():
    """pack_codes holds anchors only while max ea + max eb <= 129 (packed_tops's operands)."""
    from mpt.kernels.mfma_packed import pack_codes
    va = np.full((1, 1, 8, 4), 2.0**70, np.float32)
    ca, cb = pack_codes(va, np.full((1, 1, 8, 32), 2.0**59, np.float32), (70, 59), (-14, -14))
    assert ca.shape == (1, 1, 8, 4) and cb.shape == (1, 1, 8, 64)
    # s = 255 - 70: u = 255 in every byte; v = s - 126 - 59 = 0
    assert (ca == 0xFFFFFFFF).all() and (cb == 0).all()
    with pytest.raises(ValueError, match="anchor codes"):
        pack_codes(va, np.full((1, 1, 8, 32), 2.0**60, np.float32), (70, 60), (-14, -14))


def test_anchor_codes_of_b_sit_at_their_lanes():
    """B's code of column j is at bytes code_lane(j) and code_lane(j) + 4 of its panel row: 32
    columns of 32 distinct exponents, over 3 rows (each row's exponents one above the last's)."""
    from mpt.kernels.mfma_codes import code_lane, pack_codes
    eb = np.arange(3)[:, None] + np.arange(32)[None, :] - 14         # -14 .. 19, fp16's range
    vb = np.ldexp(1.5, eb).astype(np.float32).reshape(1, 1, 3, 32)
    _, cb = pack_codes(np.ones((1, 1, 3, 4), np.float32), vb, (0, 19), (-14, -14))
    lanes = [code_lane(j) for j in range(32)]
    assert sorted(lanes + [x + 4 for x in lanes]) == list(range(64))
    want = 255 - 126 - eb                                   # v = s − 126 − eb, s = 255 − max ea
    rows = cb[0, 0]
    assert (rows[:, lanes] == want).all() and (rows[:, [x + 4 for x in lanes]] == want).all()


def _finish_exact(c, e, s):
    """The fused rule's steps 3-4 in exact rationals (``mpt.reference.mfma``'s module docstring):
    the FP32 pattern of D for a finite float32 c, E = 2^e, the integer S; c's own pattern for an
    Inf or NaN c."""
    if not math.isfinite(c):
        return int(np.float32(c).view(np.uint32))
    m = max(e, exponent(float(c), "fp32"))
    s31 = math.floor(Fraction(s) * Fraction(2) ** (e - m + 7))
    t24 = math.floor(Fraction(float(c)) * Fraction(2) ** (24 - m))
    total = (s31 + 2**7 * t24) * Fraction(2) ** (m - 31)
    return 0 if total == 0 else round_exact(total, "fp32")


def _finish_lanes(rng, n):
    """(c, e, S) for n lanes of the float32 finish: E = 2^e over its whole range [2^-90, 2^60],
    c from far below to far above E (24-bit significands, some with trailing zeros), ±0,
    subnormals, the largest finite, Inf, NaN; |S| < 2^29 with random trailing zeros; and one lane
    in four a tie by construction for c 6 to 20 binades above E (x = c + A exactly halfway
    between two FP32 neighbours, S's bits below A's grid 2^(M-31) random: the rule drops them)."""
    e = rng.integers(-90, 61, n)
    d = rng.integers(-40, 41, n)
    mant = rng.integers(1 << 23, 1 << 24, n) >> rng.integers(0, 24, n) << rng.integers(0, 24, n)
    mant = np.minimum(mant, (1 << 24) - 1)
    c = np.ldexp(mant.astype(np.float64), np.clip(e + d - 23, -149, 104)) \
        * rng.choice([-1.0, 1.0], n)
    s = (rng.integers(-(1 << 29) + 1, 1 << 29, n) >> rng.integers(0, 29, n)) \
        << rng.integers(0, 3, n)
    s = np.clip(s, -(1 << 29) + 1, (1 << 29) - 1)
    tie = rng.random(n) < 0.25
    dt = rng.integers(6, 21, n)
    for i in np.flatnonzero(tie):   # c in [2^M, 2^(M+1)), M = e + d: A = odd·2^(M-24)
        m = e[i] + dt[i]
        c[i] = np.ldexp(float(rng.integers(1 << 23, 1 << 24)), m - 23) * rng.choice([-1, 1])
        odd = 2 * int(rng.integers(0, 1 << max(28 - int(dt[i]) - 8, 0))) + 1
        q = odd << 7                                   # A·2^-(M-31), the rule's s31
        shift = max(int(dt[i]) - 7, 0)                 # S's bits below the grid 2^(M-31)
        s[i] = ((q >> (7 - dt[i])) if dt[i] < 7 else (q << shift)) * rng.choice([-1, 1]) \
            + int(rng.integers(0, 1 << shift))
    special = rng.random(n) < 0.05
    c[special] = rng.choice([0.0, -0.0, 1e-45, -1e-45, -3e-39, 3.4028235e38, -3.4028235e38,
                             np.inf, -np.inf, np.nan], special.sum())
    return c.astype(np.float32), e, s.astype(np.int64)


@pytest.mark.parametrize("portable", [False, True])
def test_float32_finish_against_the_exact_rule(portable):
    """The int32/float32 finish of the register-blocked kernel (``finish_fast``: both its AVX-512
    and its portable IR) on lanes the GEMMs above rarely reach — every E of the fast path, C from
    40 binades below to 40 above (the floors toward −∞ of C and of the product sum), exact ties
    whose bits below the rule's grid must not count, overflow to Inf — against the rule in exact
    rationals."""
    rng = np.random.default_rng(23 + portable)
    n = 16 * 256
    c, e, s = _finish_lanes(rng, n)
    assert np.all(np.abs(s) < 2**29) and np.all((e >= -90) & (e <= 60))
    got = c.copy()
    finish_fast(got, ((e + 127) << 23).astype(np.int32), s.astype(np.int32), portable)
    want = [_finish_exact(c[i], int(e[i]), int(s[i])) for i in range(n)]
    assert got.view(np.uint32).tolist() == want


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_full_tiles_with_and_without_special_accumulators(fmt):
    """Whole 4 x 32 tiles of non-zero products (every lane on the float32 finish) and K over
    several tile calls: finite C, ordinary or up to ±FLT_MAX (the finish without Inf/NaN tests:
    every C of the tile finite), and tiles with one Inf or NaN C (with them); against the
    general kernel."""
    rng = np.random.default_rng(29)
    dtype = _dtype(fmt)
    spread = 14 if fmt == "fp16" else 29

    def values(shape):
        x = np.ldexp(rng.uniform(1, 2, shape), rng.integers(-spread, spread + 1, shape))
        return (x * rng.choice([-1, 1], shape)).astype(np.float32).astype(dtype)
    a, b = values((2, 8, 264)), values((2, 264, 64))
    special = np.zeros((2, 8, 64), np.float32)
    special[0, 1, 5], special[1, 6, 40] = -np.inf, np.nan    # one Inf and one NaN tile
    for c in (np.zeros((2, 8, 64), np.float32),
              (rng.standard_normal((2, 8, 64)) * 2.0**20).astype(np.float32),
              np.float32(3.4028235e38) * rng.choice([-1, 1], (2, 8, 64)).astype(np.float32),
              special):
        got, want = _packed_and_general("cdna3", fmt, a, b, c)
        assert np.array_equal(got, want)


def test_packed_kernel_refuses_strided_arrays():
    """The tile calls address the packed arrays by offsets: a strided one is refused."""
    from mpt.kernels.mfma_packed import fused_chain_packed
    va, vb = np.zeros((1, 1, 8, 4), np.float32), np.zeros((1, 1, 8, 32), np.float32)
    ca, cb = np.zeros((1, 1, 8, 4), np.uint32), np.zeros((1, 1, 8, 64), np.uint8)
    index = np.zeros(1, np.int64)
    fused_chain_packed(va, ca, vb, cb, np.zeros((1, 4, 32), np.float32), index, index, 0, 8, 8,
                       False)
    with pytest.raises(ValueError, match="C-contiguous"):
        fused_chain_packed(va, ca, vb, cb, np.zeros((1, 4, 64), np.float32)[:, :, ::2], index,
                           index, 0, 8, 8, False)
