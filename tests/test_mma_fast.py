"""The fast kernels of mpt.mma / mpt.gemm give the bits of the general kernels and of the oracle.

The block model runs on three kernels (``BlockOperands.mode``): register-blocked 8x64 tiles,
one dot product per lane (many small products), or the general float64 kernel. The fast ones
keep the general one's bits for every input they take, and hand the call back to it where
their window ends (non-finite operands, products or accumulators out of range, an int32
overflow of a block sum, a tiny accumulator, an FP16 overflow). Here: each kernel is taken on
purpose (the mode is asserted), and compared with the general kernel (an Inf in an extra batch
element sends the whole call there) or with the exact-rational oracle.
"""
import ml_dtypes
import numpy as np
import pytest
from numba import njit

import mpt
from mpt.engines.nvidia import BlockOperands
from mpt.engines.operands import batched, operands_class
from mpt.formats import get_format
from mpt.kernels import block_gemm as K
from mpt.kernels import block_pack as BP
from mpt.kernels import gemm as G
from mpt.kernels.half import (canonical_nan, narrow16, narrow_bf16, narrow_fp16, widen16,
                              widen_bf16, widen_fp16)
from mpt.reference.mma import ieee_fma_reference, mma_reference

BF16 = ml_dtypes.bfloat16


def _bits(x):
    return x.view(np.uint32 if x.dtype == np.float32 else np.uint16)


def _operands(model, a, b, out="fp32", variant=None, in_format=None):
    model = mpt.get_mma_model(model)
    fa, fb = in_format or (get_format(x.dtype).name for x in (a, b))
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return BlockOperands(model, model.config(fa, fb, variant), a, b, (fa, fb), out, batch)


def _mode(model, a, b, out="fp32"):
    """The kernel BlockOperands picks for a·b (a, b with leading batch dimensions)."""
    return _operands(model, a, b, out).mode


def _raises_flag(model, a, b, c, out="fp32"):
    """Whether the fast kernel, run alone on a·b + c, raises its flag."""
    ops = _operands(model, a, b, out)
    return bool(ops._fast(ops.new_acc(c), 0, ops.k))


def _general(a, b, c, model, out="fp32"):
    """mpt.mma on the general kernel: an Inf in an extra batch element sends the call there."""
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])

    def flat(x):
        return np.broadcast_to(x, batch + x.shape[-2:]).reshape((-1,) + x.shape[-2:])
    spoiled = np.concatenate([flat(a), np.full((1,) + a.shape[-2:], np.inf,
                                               np.float32).astype(a.dtype)])
    bb = np.concatenate([flat(b), flat(b)[:1]])
    cc = None if c is None else np.concatenate([flat(c), flat(c)[:1]])
    d = mpt.mma(spoiled, bb, cc, model=model, out_format=out)[:-1]
    return d.reshape(batch + d.shape[-2:])


def _oracle(a, b, c, model, out="fp32"):
    """The exact-rational oracle on one 2-D product."""
    fa, fb = (get_format(x.dtype).name for x in (a, b))
    cfg = mpt.get_mma_model(model).config(fa, fb)
    rounding, e_zero = cfg.output(out)
    spec = {"kind": "block", "block": cfg.block, "fraction_bits": cfg.fraction_bits,
            "e_zero": e_zero, "rounding": rounding}
    if c is None:
        c = np.zeros((a.shape[0], b.shape[1]), np.float32 if out == "fp32" else np.float16)
    want = mma_reference(_bits(a).tolist(), _bits(b).tolist(), _bits(c).tolist(), spec, fa, fb)
    return np.array(want, np.uint32 if out == "fp32" else np.uint16)


CASES = [("hopper", np.float16, "fp32"), ("hopper", BF16, "fp32"), ("blackwell", BF16, "fp32"),
         ("ampere", np.float16, "fp32"), ("ada", ml_dtypes.float8_e4m3fn, "fp32"),
         ("hopper", ml_dtypes.float8_e5m2, "fp32"), ("volta", np.float16, "fp32"),
         ("hopper", np.float16, "fp16"), ("ampere", BF16, "fp32")]


@pytest.mark.parametrize("model, dtype, out", CASES)
def test_tiles_equal_the_general_kernel(model, dtype, out):
    """Tiles: edges, both orientations, batches, transposed (strided) operands, a c."""
    rng = np.random.default_rng(11)
    for m, k, n in [(37, 70, 45), (9, 33, 300), (130, 40, 70), (64, 96, 64)]:
        a = (rng.standard_normal((2, m, k)) * 4).astype(np.float32).astype(dtype)
        b = rng.standard_normal((k, n)).astype(np.float32).astype(dtype)
        c = rng.standard_normal((2, m, n)).astype(np.float32)
        if out == "fp16":
            c = c.astype(np.float16)
        for bb in (b, np.asfortranarray(b)):
            assert _mode(model, a, bb, out) == "tiles"
            fast = mpt.mma(a, bb, c, model=model, out_format=out)
            assert np.array_equal(_bits(fast), _bits(_general(a, bb, c, model, out)))


@pytest.mark.parametrize("model, dtype, out", CASES)
def test_lanes_equal_the_general_kernel(model, dtype, out):
    """Lanes: many small products (broadcast batches included) in one call."""
    rng = np.random.default_rng(12)
    for batch, m, k, n in [((300,), 1, 16, 1), ((7, 5), 2, 40, 3), ((65,), 3, 5, 2)]:
        a = rng.standard_normal(batch + (m, k)).astype(np.float32).astype(dtype)
        b = rng.standard_normal((batch[-1], k, n)).astype(np.float32).astype(dtype)
        c = rng.standard_normal(batch + (m, n)).astype(np.float32)
        if out == "fp16":
            c = c.astype(np.float16)
        assert _mode(model, a, b, out) == "lanes"
        fast = mpt.mma(a, b, c, model=model, out_format=out)
        assert np.array_equal(_bits(fast), _bits(_general(a, b, c, model, out)))


def test_block_sum_overflow_falls_back_exactly():
    """Hopper fp16 (L = 16, F = 25): 16 products of 2047/1024 squared (anchor 2^0, terms just
    below 2^27) and a c of the same sign below 2 (its term near 2^26) sum past 2^31 in int32;
    the kernel flags it and the call ends on the general kernel."""
    top = np.float16(2047 / 1024)
    a = np.full((1, 16), top, np.float16)
    b = np.full((16, 1), top, np.float16)
    c = np.array([[float(top)]], np.float32)
    assert _mode("hopper", a, b) == "lanes" and _raises_flag("hopper", a, b, c)
    assert _bits(mpt.mma(a, b, c, model="hopper")).tolist() == _oracle(a, b, c, "hopper").tolist()
    big_a, big_b = np.tile(a, (8, 1)), np.tile(b, (1, 64))
    assert _mode("hopper", big_a, big_b) == "tiles"
    big_c = np.full((8, 64), c[0, 0], np.float32)
    assert _raises_flag("hopper", big_a, big_b, big_c)
    d = mpt.mma(big_a, big_b, big_c, model="hopper")
    assert np.all(_bits(d) == _oracle(a, b, c, "hopper")[0, 0])


def test_tiny_accumulator_falls_back_exactly():
    """bf16 products near 2^-100 that cancel to a c below 2^(F−125), then a block without
    products: the kernel flags the tiny c (F = 25, window from 2^-100) and the general kernel
    gives the oracle's bits."""
    x = np.float32(2.0**-50)
    a = np.zeros((1, 32), BF16)
    b = np.zeros((32, 1), BF16)
    a[0, :2] = [x, -x * (1 + 2.0**-7)]
    b[:2, 0] = [x, x]
    assert _mode("hopper", a, b) == "lanes" and _raises_flag("hopper", a, b, None)
    want = _oracle(a, b, None, "hopper")
    assert _bits(mpt.mma(a, b, model="hopper")).tolist() == want.tolist()


def test_fp16_accumulation_overflow_falls_back_exactly():
    """RNE-FP16 output past 65504 is Inf, which the next block cannot take: flag, fallback."""
    a = np.full((1, 32), 200.0, np.float16)
    b = np.full((32, 1), 200.0, np.float16)
    c = np.zeros((1, 1), np.float16)
    assert _raises_flag("hopper", a, b, c, "fp16")
    want = _oracle(a, b, c, "hopper", "fp16")
    assert _bits(mpt.mma(a, b, c, model="hopper")).tolist() == want.tolist()


def test_out_of_window_operands_take_the_general_kernel():
    """Products beyond 2^E_MAX or below the RZ window, and non-finite operands, are not taken
    by the fast kernels (and still give the oracle's bits)."""
    for scale in (2.0**60, 2.0**-70):
        a = np.full((1, 8, 16), scale, np.float32).astype(BF16)
        b = np.full((1, 16, 64), scale, np.float32).astype(BF16)
        assert _mode("hopper", a, b) == "general"
        d = mpt.mma(a, b, model="hopper")
        assert np.all(_bits(d) == _oracle(a[0, :1], b[0, :, :1], None, "hopper")[0, 0])
    a = np.ones((1, 8, 16), np.float16)
    a[0, 3, 5] = np.inf
    assert _mode("hopper", a, np.ones((1, 16, 64), np.float16)) == "general"


def _block_configurations():
    """(model, variant, format of a, format of b, output) once for every configuration of kind
    "block" in the registry — every preset, instruction variant, input format and output — and
    a mixed pair where the configuration mixes formats."""
    out = []
    for name, model in mpt.mma_models().items():
        for cfg in model.configs:
            if model.kind_of(cfg) != "block":
                continue
            pairs = [(f, f) for f in cfg.inputs] + [cfg.inputs[:2]] * (len(cfg.inputs) > 1)
            for fa, fb in pairs:
                if model.config(fa, fb, cfg.variant) is not cfg:
                    continue                    # an earlier configuration takes these inputs
                for o, _, _ in cfg.outputs:
                    out.append(pytest.param(name, cfg.variant, fa, fb, o,
                                            id=f"{name}-{cfg.variant}-{fa}-{fb}-{o}"))
    return out


def _expected_mode(cfg, formats, out, shape_mode):
    """The kernel the configuration should get for tame operands: the tile kernels where their
    conditions on the configuration hold (BlockOperands._tiles_take), else the chunked one."""
    rounding = cfg.output(out)[0]
    bits = sum(get_format(f).mantissa_bits + 1 for f in formats)
    tiles = K.block_fits(cfg.block, cfg.fraction_bits) and bits <= 24 and \
        rounding in ("rz_fp32", "rz_e8m13", "rne_fp16")
    return shape_mode if tiles else "chunks"


@pytest.mark.parametrize("model, variant, fa, fb, out", _block_configurations())
def test_every_block_configuration_equals_the_general_kernel(model, variant, fa, fb, out):
    """Every registered block configuration (mma.sync shapes, FP8 -> FP16 outputs, fp6/fp4
    inputs, Blackwell's 32-product f8f6f4 blocks included): tame operands take the kernel the
    configuration allows (tiles or lanes by shape, chunks where a block's sum can overflow
    int32) and give the bits of the general kernel (``BlockOperands._general`` on the same
    operands) — tile-shaped calls in both orientations and many small products, with a c and
    a partial last block."""
    rng = np.random.default_rng(18)
    cfg = mpt.get_mma_model(model).config(fa, fb, variant)
    k = 3 * cfg.block + 5
    in_format = (fa, fb) if "tf32" in (fa, fb) else None
    for shape_mode, batch, m, n in (("tiles", (2,), 37, 45), ("tiles", (1,), 200, 20),
                                    ("lanes", (300,), 1, 1)):
        a = mpt.round(rng.standard_normal(batch + (m, k)).astype(np.float32) * 2, fa)
        b = mpt.round(rng.standard_normal(batch + (k, n)).astype(np.float32) * 2, fb)
        c = mpt.round(rng.standard_normal(batch + (m, n)).astype(np.float32), out)
        ops = _operands(model, a, b, out, variant, in_format)
        assert ops.mode == _expected_mode(cfg, (fa, fb), out, shape_mode)
        assert ops.swap == (m > n)                   # Cᵀ = Bᵀ·Aᵀ for the tall product
        d = mpt.mma(a, b, c, model=model, variant=variant, in_format=in_format, out_format=out)
        general = np.array(c, np.float64).reshape((-1, m, n))
        ops._general(general, 0, k)
        assert np.array_equal(_bits(np.asarray(d, np.float32)),
                              _bits(general.reshape(d.shape).astype(np.float32)))


def test_portable_round_toward_zero_equals_the_x86_one():
    """The RZ output without AVX-512's embedded rounding (the lzcnt mask) gives the same bits:
    a lanes kernel built with X86_ROUNDING off, on random sums of every magnitude."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((4096, 1, 16)).astype(np.float32).astype(np.float16)
    b = (rng.standard_normal((4096, 16, 1)) * 2.0 ** rng.integers(-8, 8, (4096, 1, 1))
         ).astype(np.float32).astype(np.float16)
    want = mpt.mma(a, b, model="hopper")
    saved = K.X86_ROUNDING
    try:
        K.X86_ROUNDING = False
        portable = K._dispatcher(lanes=True)
    finally:
        K.X86_ROUNDING = saved
    kernel = njit(_lanes_driver(portable))
    ops_model = mpt.get_mma_model("hopper")
    ops = BlockOperands(ops_model, ops_model.config("fp16", "fp16"), a, b, ("fp16", "fp16"),
                        "fp32", (4096,))
    assert ops.mode == "lanes"
    prm = ops.prm.copy()
    prm[K.P_KEEP] = (1 << (32 - 24)) - 1            # the portable meaning of P_KEEP
    acc = ops.new_acc()
    assert not kernel(*ops.a, acc, 0, 16, prm, ops.variant)
    assert np.array_equal(_bits(ops.values(acc)).reshape(want.shape), _bits(want))


def _lanes_driver(run):
    """block_chain_lanes on another variant dispatcher (serial, uncached)."""
    def driver(vap, eap, vbp, ebp, acc, k0, k1, prm, variant):
        flags = np.zeros(vap.shape[0], np.int32)
        for p in range(vap.shape[0]):
            scratch = np.empty(K.SCRATCH_WORDS, np.int32)
            run(variant, (acc[p * K.BLOCK_COLS:].ctypes.data, 0, vap[p, k0:].ctypes.data,
                          eap[p, k0:].ctypes.data, vbp[p, k0:].ctypes.data,
                          ebp[p, k0:].ctypes.data, k1 - k0, prm.ctypes.data,
                          scratch.ctypes.data, flags[p:].ctypes.data))
        return flags.any()
    return driver


@pytest.mark.parametrize("shape", [(37, 70, 45), (1024, 64, 40), (2048, 8, 2)])
def test_fma_operand_layouts_agree(shape):
    """ieee_fma: A read in place (row- or column-major) or packed (a 4 KiB row stride), B packed
    from either layout — the same bits (the oracle check of the chain is test_mma_gemm's)."""
    m, k, n = shape
    rng = np.random.default_rng(14)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    want = mpt.mma(a, b, model="ieee_fma")
    wide = np.zeros((m, 1024), np.float32)
    wide[:, :k] = a                                    # row stride 4 KiB: A is packed
    for x in (np.asfortranarray(a), wide[:, :k]):
        for y in (b, np.asfortranarray(b)):
            assert np.array_equal(_bits(mpt.mma(x, y, model="ieee_fma")), _bits(want))


def test_fma_lanes_equal_tiles():
    """Batches of small ieee_fma products (one output per chain) equal the tile kernel."""
    rng = np.random.default_rng(15)
    a = rng.standard_normal((500, 2, 24)).astype(np.float32)
    b = rng.standard_normal((500, 24, 3)).astype(np.float32)
    c = rng.standard_normal((500, 2, 3)).astype(np.float32)
    small = mpt.mma(a, b, c, model="ieee_fma")
    for z in (0, 17, 499):
        big = mpt.mma(np.tile(a[z], (8, 1)), np.tile(b[z], (1, 32)), np.tile(c[z], (8, 32)),
                      model="ieee_fma")
        assert np.array_equal(_bits(small[z]), _bits(big[:2, :3]))


def test_fma_lanes_equal_the_oracle():
    """ieee_fma's lanes — four chains interleaved, a remainder of two, a second task past 256
    outputs, a broadcast batch, column-major B — give, for every output, the bits of the
    exact-rational oracle (``ieee_fma_reference``)."""
    rng = np.random.default_rng(19)
    scale = 2.0 ** rng.integers(-30, 30, (7, 1, 2, 5))
    a = (rng.standard_normal((7, 1, 2, 5)) * scale).astype(np.float32)          # (7, 1, M, K)
    b = np.asfortranarray(rng.standard_normal((11, 5, 3)).astype(np.float32))   # (11, K, N)
    c = rng.standard_normal((7, 11, 2, 3)).astype(np.float32)
    model = mpt.get_mma_model("ieee_fma")
    ops = operands_class("ieee_fma")(model, model.config("fp32", "fp32"), a, b, ("fp32", "fp32"),
                                     "fp32", (7, 11))
    assert ops.rows == 0                                  # lanes: 462 outputs, no tiles
    d = mpt.mma(a, b, c, model="ieee_fma")
    want = np.array([[[[ieee_fma_reference(a[z, 0, i].tolist(), b[y, :, j].tolist(),
                                           float(c[z, y, i, j])) for j in range(3)]
                       for i in range(2)] for y in range(11)] for z in range(7)], np.float32)
    assert np.array_equal(_bits(d), _bits(want))


@pytest.mark.parametrize("dtype", [np.float32, BF16])
def test_lane_panels_hold_each_outputs_row_and_column(dtype):
    """lane_values / lane_codes on broadcast batches and strided operands holding zeros and the
    format's subnormals: lane d of the panels holds row i of A[z] and column j of B[z] for
    output d = (z, i, j), bit for bit (zeros past the last output); the ranges are
    numpy's (an Inf included), the codes the formula's (module docstring of
    block_pack: u = max(ea + s_a, 0), v = min(s_b − eb, 255); a zero 0 and 255)."""
    rng = np.random.default_rng(20)
    fmt = get_format(dtype).name
    emin = get_format(fmt).emin
    for batch_a, batch_b, m, k, n in [((3, 1), (5,), 1, 16, 1), ((70,), (70,), 2, 7, 3),
                                      ((1,), (9,), 3, 33, 2), ((4,), (1,), 1, 1, 1)]:
        a = rng.standard_normal(batch_a + (k, m)).astype(np.float32)
        b = rng.standard_normal(batch_b + (k, n)).astype(np.float32)
        a.reshape(-1)[::5] = 0.0
        b.reshape(-1)[1::7] = 2.0 ** (emin - 2)                    # subnormal in the format
        a = a.astype(dtype).swapaxes(-1, -2)                       # (..., M, K), column-major
        b = b.astype(dtype)
        batch = np.broadcast_shapes(batch_a, batch_b)
        (a3, ia), (b3, ib) = batched(a, batch), batched(b, batch)
        (va, vb), (finite, ranges) = BP.lane_values(a3, b3, ia, ib, emin, emin)
        assert finite and ranges == _ranges_oracle(a3, b3, emin, emin)[1]
        outputs = batch + (m, n, k)                                # each output's K values
        rows = np.broadcast_to(a[..., :, None, :], outputs)
        cols = np.broadcast_to(b.swapaxes(-1, -2)[..., None, :, :], outputs)
        for got, want in ((va, rows), (vb, cols)):
            lanes = np.zeros((got.shape[0] * K.BLOCK_COLS, k), np.float32)
            lanes[:want.size // k] = want.reshape(-1, k).astype(np.float32)
            panels = lanes.reshape(-1, K.BLOCK_COLS, k).transpose(0, 2, 1)
            assert np.array_equal(_bits(got), _bits(panels))
        s_a, s_b = 255 - ranges[2], ranges[3] + 7
        _, ea, _, eb = BP.lane_codes(va, vb, emin, emin, (s_a, s_b))
        for got, v, code, zero in ((ea, va, lambda e: np.maximum(e + s_a, 0), 0),
                                   (eb, vb, lambda e: np.minimum(s_b - e, 255), 255)):
            field = (_bits(v) >> 23 & 0xFF).astype(np.int64)
            e = np.maximum(field, emin + 127) - 127
            assert np.array_equal(got, np.where(v == 0, zero, code(e)).astype(np.uint8))
        spoiled = np.array(b3)
        spoiled[-1, -1, -1] = np.inf
        assert not BP.lane_values(a3, spoiled, ia, ib, emin, emin)[1][0]


# ---- exact conversions ----------------------------------------------------------------------

def test_widening_every_16_bit_pattern():
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    out = np.empty(h.size, np.uint32)
    with np.errstate(invalid="ignore"):
        widen_fp16(h, out)
        assert np.array_equal(out, h.view(np.float16).astype(np.float32).view(np.uint32))
        widen_bf16(h, out)
        assert np.array_equal(out, h.astype(np.uint32) << 16)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_widen16_and_narrow16_round_trip_every_pattern_in_any_layout(dtype):
    """widen16 gives the exact float32 of every 16-bit pattern (column-major input too) and
    narrow16 gives the pattern back (NaNs: a NaN of the same sign); other dtypes are refused."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).reshape(256, 256).T   # (256, 256)
    x = widen16(h.view(dtype))
    with np.errstate(invalid="ignore"):
        assert np.array_equal(x.view(np.uint32), h.view(dtype).astype(np.float32).view(np.uint32))
    back = narrow16(x, dtype).view(np.uint16)
    nan = np.isnan(x)
    assert np.array_equal(back[~nan], h[~nan])
    assert np.array_equal(back[nan] & 0x8000, h[nan] & 0x8000) and \
        np.isnan(back[nan].view(dtype).astype(np.float32)).all()
    for bad in (lambda: widen16(x), lambda: narrow16(x, np.float32)):
        with pytest.raises(TypeError, match="float16 or bfloat16"):
            bad()


def test_canonical_nan_every_16_bit_pattern_and_float32_classes():
    """Every NaN pattern becomes 0x7FFF / 0x7FFFFFFF; every other pattern (Inf included) keeps
    its bits."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    got = h.copy()
    canonical_nan(got)
    nan = np.isnan(h.view(np.float16))
    assert np.array_equal(got, np.where(nan, np.uint16(0x7FFF), h))
    rng = np.random.default_rng(15)
    x = np.concatenate([rng.integers(0, 1 << 32, 1 << 16, dtype=np.uint64).astype(np.uint32),
                        np.array([0x7F800000, 0xFF800000, 0x7F800001, 0xFF800001, 0x7FC00000,
                                  0xFFFFFFFF, 0x7F7FFFFF, 0, 0x80000000], np.uint32)])
    got = x.copy()
    canonical_nan(got)
    nan = np.isnan(x.view(np.float32))
    assert np.array_equal(got, np.where(nan, np.uint32(0x7FFFFFFF), x))
    assert nan.sum() > 100 and not np.array_equal(got, x)


def fp16_nan_of(x):
    """The fp16 NaN a float32 NaN pattern converts to: its sign, the top 10 payload bits (at
    least 1, to stay a NaN), as IEEE conversion without quieting gives it."""
    top = np.maximum((x >> 13) & 0x3FF, 1)
    return (((x >> 16) & 0x8000) | 0x7C00 | top).astype(np.uint16)


def test_narrow_fp16_equals_mpt_round():
    """RNE to fp16 from float32 patterns: random patterns, every fp16 value's float32 neighbours
    and midpoints (ties, subnormal and overflow boundaries), a sweep of the subnormal range;
    against mpt.round, NaNs against their payload rule."""
    rng = np.random.default_rng(17)
    x = rng.integers(0, 1 << 32, 1 << 21, dtype=np.uint64).astype(np.int64)
    grid = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    grid = grid.astype(np.float32).view(np.uint32).astype(np.int64)
    mid = grid + (1 << 12)       # the tie above a normal fp16 value (bit 12: half a unit)
    near = [grid + d for d in (-1, 0, 1)] + [mid + d for d in (-1, 0, 1)]
    tiny = np.arange(0x33000000 - 5, 0x38900000, 331)          # float32s around fp16 subnormals
    x = np.concatenate([x, *near, tiny]) % (1 << 32)
    x = x.astype(np.uint32)
    out = np.empty(x.size, np.uint16)
    narrow_fp16(x, out)
    with np.errstate(all="ignore"):
        want = np.asarray(mpt.round(x.view(np.float32), "fp16")).view(np.uint16)
    nan = np.isnan(x.view(np.float32))
    assert np.array_equal(out[~nan], want[~nan])
    assert np.array_equal(out[nan], fp16_nan_of(x[nan]))
    assert nan.sum() > 1000 and (out == 0x7C00).any() and (out == 0x0001).any()


def test_narrow_bf16_equals_mpt_round():
    """RNE to bf16 from float32 patterns: every exponent and sign with random fractions, the
    ties, the largest finite values, Inf and NaNs; against mpt.round (and ml_dtypes)."""
    rng = np.random.default_rng(16)
    x = rng.integers(0, 1 << 32, 1 << 21, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 1 << 16, 4096, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    edges = np.array([0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7F8000, 0x7F800000, 0xFF800000,
                      0x7F800001, 0xFFC00001, 0x7FFFFFFF, 0, 0x80000000, 0x8000, 0x18000],
                     np.uint32)
    x = np.concatenate([x, ties, edges])
    out = np.empty(x.size, np.uint16)
    narrow_bf16(x, out)
    want = np.asarray(mpt.round(x.view(np.float32), "bf16")).view(np.uint16)
    assert np.array_equal(out, want)
    with np.errstate(all="ignore"):
        assert np.array_equal(out, x.view(np.float32).astype(BF16).view(np.uint16))


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_block_packers_widen_16_bit_storage_as_they_read(fmt, layout):
    """Block panels, anchor codes and exponent ranges packed from bf16 / fp16 storage (every
    finite pattern, both layouts, ragged last panels) equal those packed from the exactly
    widened float32 values (ml_dtypes' / numpy's cast), and the ranges read off the panels are
    numpy's."""
    dtype = BF16 if fmt == "bf16" else np.float16
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(dtype)
    h = h[np.isfinite(h.astype(np.float32))][:61 * 997].reshape(1, 61, 997)    # (B, R, K)
    if layout == "columns":
        h = np.ascontiguousarray(h.transpose(0, 2, 1)).transpose(0, 2, 1)
    x32 = h.astype(np.float32)
    emin = get_format(fmt).emin
    (va, vb), ranges = BP.pack_block_values(h, h.transpose(0, 2, 1), emin, emin)
    (wa, wb), want_ranges = BP.pack_block_values(x32, x32.transpose(0, 2, 1), emin, emin)
    assert ranges == want_ranges == _ranges_oracle(x32, x32.transpose(0, 2, 1), emin, emin)
    top = get_format(fmt).emax                          # (every finite pattern is there)
    assert ranges[0] and ranges[1][2] == ranges[1][3] == top
    for got, want in ((va, wa), (vb, wb)):
        assert got.shape == want.shape and got.dtype == np.float32
        assert np.array_equal(_bits(got), _bits(want))
    codes, want_codes = (BP.block_codes(*v, emin, emin, (40, 60)) for v in ((va, vb), (wa, wb)))
    for got, want in zip(codes, want_codes):
        assert got.dtype == want.dtype and np.array_equal(got, want)


def _ranges_oracle(a, b, emin_a, emin_b):
    """(finite?, (lowest, highest nominal exponent ea + eb of a non-zero product, top ea, top
    eb)) of A (B, M, K) and B (B, K, N) in numpy, from their float32 values: per k, the extreme
    nominal exponents (max(floor(log2|x|), emin)) of A's column and B's row over the batch."""
    fields = []
    for x, emin, axes in ((a, emin_a, (0, 1)), (b, emin_b, (0, 2))):
        bits = np.asarray(x, np.float32).view(np.uint32)
        if ((bits >> 23) & 0xFF == 0xFF).any():
            return False, None
        e = np.maximum(((bits >> 23) & 0xFF).astype(np.int64) - 127, emin)
        nonzero = (bits << 1) != 0
        fields.append((np.where(nonzero, e, 1 << 20).min(axis=axes),
                       np.where(nonzero, e, -(1 << 20)).max(axis=axes)))
    (la, ha), (lb, hb) = fields
    both = (ha > -(1 << 20)) & (hb > -(1 << 20))
    return True, (int((la + lb)[both].min(initial=1 << 20)),
                  int((ha + hb)[both].max(initial=-(1 << 20))), int(ha.max(initial=-127)),
                  int(hb.max(initial=-127)))


def test_packers_read_any_layout():
    """pack_panels from row-major and column-major operands: the same panels."""
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 37, 23)).astype(np.float32)
    want = G.pack_rows(np.ascontiguousarray(x), 8)
    got = G.pack_rows(np.ascontiguousarray(x.transpose(0, 2, 1)).transpose(0, 2, 1), 8)
    assert np.array_equal(want, got)
    assert np.array_equal(G.pack_cols(x), G.pack_cols(x.copy(order="F")))
