"""L1: AMD Matrix Core (MFMA) models, CDNA1 to CDNA4, as Numba kernels.

The rules are ``mpt.reference.mfma``'s (its docstring states each one, with its source: the
MMA-Sim reference model, and for CDNA4 an assumption); that module is the oracle these kernels
are checked against bit for bit (tests/test_mfma.py), and MMA-Sim itself where its code runs.
The instruction variants (K per instruction, group size, rule) and the operand class that drives
these kernels are in ``mpt.engines.amd``.

Conventions, as ``mpt.kernels.mma``: operands are decoded once by :func:`decode` to float32
values (float64 for f64 instructions) with every NaN already in the quiet form it comes out as;
a: (Ba, M, K), b: (Bb, K, N), batch z uses A[ia[z]] and B[ib[z]]; the accumulator acc (B, M, N)
holds C on entry and D on exit, updated in place over k in [k0, k1), group by group and
instruction by instruction in increasing k (the D of one is the C of the next). k0 and k1 are
multiples of the instruction's K: ``mpt.engines.amd`` zero-pads K (the padding is computed
like any other zeros, as the hardware would compute the zeros software pads with). Each output
element is computed by one thread in a fixed order, so the bits never depend on the threads.

Kernels:

* :func:`fma_chain` — sequential IEEE FMA (f32, f64 instructions). Exact: ``llvm.fma``.
* :func:`pairwise_chain` — CDNA1/2 f16/bf16: products rounded to FP32 as fma(a, b, +0), a
  pairwise tree of FP32 adds, CDNA2's flushes. Exact: every step is one IEEE float32 operation
  (Numba does not contract or reassociate without fastmath).
* :func:`fused_chain` — CDNA3 (and CDNA4) groups, any operands, MX scales: the general path.
* :func:`fused_chain_packed` — the same without MX scales, on operands whose products are
  finite and within [2^-60, 2^60] (:func:`packed_ok`), register-blocked: a group's anchor pass,
  sum pass and float64 finish run in one LLVM IR call per 4x32 tile of outputs, on panels packed
  as ``mpt.kernels.gemm`` packs them (FP8: K reordered so that each half is contiguous).

Why the fused rule is exact in float64 (inputs of at most 11 significant bits — fp16, bf16,
TF32, fp8/6/4 — so every product a·b is exact in float64, and in float32 on the fast path):
nominal exponents are powers of two (2^-506 <= E <= 2^510 with scales), so scaling by them is
exact; each truncated term is an integer below 2^26 (|p| < 4·2^e <= 4E), a group sum S below
2^30; s = floor(S·2^(E-M+7)) < 2^37 and t = floor(c·2^(24-M)) < 2^25 are exact floors, and
(s + 2^7·t)·2^(M-31) < 2^38·2^(M-31) is exact, so ``np.float32`` of it is the one RNE rounding.

NaN bits are the oracle's: a NaN result takes the first (``last``: the last) NaN among the
group's operands in the order c, a_0, b_0, a_1, b_1, … (copied, never computed, so the payload
survives), else the made NaN (``DEFAULT_NAN32``/``DEFAULT_NAN64``, or ``BIG_NAN32`` for the
2^128 rule). Which of several NaNs is an assumption (``several_nans`` of the AMD models).
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic, overload

from mpt.formats import get_format
from mpt.kernels import gemm as _gemm
from mpt.kernels.fma import fma32, fma64
from mpt.kernels.mma import magnitude_range, pow2_floor, recip_pow2

__all__ = ["DEFAULT_NAN32", "DEFAULT_NAN64", "BIG_NAN32", "decode", "decode_scales",
           "fma_chain", "pairwise_chain", "fused_chain", "fused_chain_packed", "packed_ok",
           "nominals", "ROWS", "MX_BLOCK"]

#: The NaN the arithmetic makes (Inf·0, Inf − Inf): x86's default NaN, as MMA-Sim gives it.
DEFAULT_NAN32 = np.array([0xFFC00000], np.uint32).view(np.float32)
DEFAULT_NAN64 = np.array([0xFFF8000000000000], np.uint64).view(np.float64)
#: The NaN of the 2^128 rule when both signs overflow (MMA-Sim's ``float("nan")``).
BIG_NAN32 = np.array([0x7FC00000], np.uint32).view(np.float32)

MX_BLOCK = 32                 # k per E8M0 block scale (OCP MX)
_KC = 32                      # k per tile call: B's panels of one call stay in L1
_WIDE = 8                     # float64 lanes of one AVX-512 register (the packed finish)
ROWS = 4                      # tile rows of the packed kernel: 4 x 32 outputs keep E, the scale
                              # and S (24 vectors) in the 32 AVX-512 registers; measured faster
                              # than 2, 3, 6 or 8 rows
# 2^24/E for a float32 power of two E = 2^e is the pattern (151 - e + 127) << 23, i.e.
# _SCALE_BITS - bits(E); E is floored at 2^-64, so the scale is at most 2^88 (finite).
_SCALE_BITS = np.uint32(278 << 23)
_ANCHOR_FLOOR_BITS = np.uint32(63 << 23)
_TINY = 2.0**-126             # FP32's smallest normal: CDNA2's flush, and a zero's exponent


# ---- operands ---------------------------------------------------------------------------------

def decode(x, fmt, *, flush=False) -> np.ndarray:
    """The values of an operand array of format ``fmt`` as the kernels take them.

    float32 (float64 for fp64) values, exact; ``tf32`` (xf32): float32 input with the low 13 bits
    of each pattern dropped. NaNs in their output form (``mpt.reference.mfma.input_nan_bits``):
    quiet, the payload at the top of the FP32 fraction, sign kept; FNUZ's NaN -> 0x7FC00001.
    ``flush`` (CDNA2 f16/bf16): values below the format's smallest normal, −0 included, -> +0.
    """
    f = get_format(fmt)
    x = np.ascontiguousarray(x)
    if f.name == "fp64":
        v = x.astype(np.float64)
        v.view(np.uint64)[np.isnan(v)] |= np.uint64(0x0008000000000000)
        return v
    if f.name in ("fp32", "tf32"):
        bits = x.astype(np.float32).view(np.uint32)
        if f.name == "tf32":
            bits = bits & np.uint32(0xFFFFE000)
        v = bits.view(np.float32).copy()
        v.view(np.uint32)[np.isnan(v)] |= np.uint32(0x00400000)
        return v
    storage = np.uint8 if x.dtype.itemsize == 1 else np.uint16
    raw = x.view(storage).astype(np.uint32) & np.uint32((1 << f.bits) - 1)
    with np.errstate(invalid="ignore"):
        v = raw.astype(storage).view(x.dtype).astype(np.float32)
    nan = np.isnan(v)
    if nan.any():
        if f.nan == "fnuz":
            quiet = np.full(raw.shape, 0x7FC00001, np.uint32)
        else:
            m = f.mantissa_bits
            quiet = ((raw >> np.uint32(f.bits - 1)) << np.uint32(31)) | np.uint32(0x7FC00000) \
                | ((raw & np.uint32((1 << m) - 1)) << np.uint32(23 - m))
        v.view(np.uint32)[nan] = quiet[nan]
    if flush:
        v[np.abs(v) < f.min_normal] = 0.0
    return v


def decode_scales(s) -> np.ndarray:
    """E8M0 scales (uint8 patterns or ml_dtypes float8_e8m0fnu) -> float64 2^(s-127); NaN for
    0xFF (its NaN is then ``BIG_NAN32``'s pattern 0x7FC00000, see fused_chain)."""
    s = np.asarray(s)
    raw = s.view(np.uint8).astype(np.int64) if s.dtype.itemsize == 1 else s.astype(np.int64)
    return np.where(raw == 0xFF, np.nan, np.ldexp(1.0, raw - 127))


# ---- shared steps -----------------------------------------------------------------------------

def _fma(x, y, z):
    """fma of two floats of one type (float32 or float64); njit code only."""
    raise NotImplementedError("njit only")


@overload(_fma, inline="always")
def _fma_typed(x, y, z):
    if x == types.float64:
        return lambda x, y, z: fma64(x, y, z)
    return lambda x, y, z: fma32(x, y, z)


@njit(inline="always")
def _nan_of(c, a_row, b_mat, j, kb, ke, sa_row, sb_mat, default, last):
    """The NaN a group [kb, ke) gives: among its NaN operands in the order c, a_k (then its
    scale), b_k (then its scale) for k increasing, the first (``last`` False) or the last (the
    assumption ``several_nans``); ``default`` when none is NaN. sa_row (KB,), sb_mat (KB, N):
    E8M0 scales as float64 powers of two (empty: none); a NaN scale gives 0x7FC00000."""
    nan = default
    if c != c:
        if not last:
            return c
        nan = c
    scaled = sa_row.size > 0
    for k in range(kb, ke):
        x = a_row[k]
        if x != x:
            if not last:
                return x
            nan = x
        if scaled and sa_row[k // MX_BLOCK] != sa_row[k // MX_BLOCK]:
            if not last:
                return BIG_NAN32[0]
            nan = BIG_NAN32[0]
        y = b_mat[k, j]
        if y != y:
            if not last:
                return y
            nan = y
        if scaled and sb_mat[k // MX_BLOCK, j] != sb_mat[k // MX_BLOCK, j]:
            if not last:
                return BIG_NAN32[0]
            nan = BIG_NAN32[0]
    return nan


@njit(inline="always")
def _nan3(c, x, y, default, last):
    """:func:`_nan_of` for one product x·y onto c (the FMA rule)."""
    if last:
        return y if y != y else (x if x != x else (c if c != c else default))
    return c if c != c else (x if x != x else (y if y != y else default))


@njit(inline="always")
def _flush(x, flush):
    """CDNA2: |x| < 2^-126 -> a zero of x's sign (NaN untouched)."""
    return x * np.float32(0.0) if flush and abs(x) < np.float32(_TINY) else x


# ---- sequential FMA ---------------------------------------------------------------------------

@njit(cache=True, parallel=True)
def fma_chain(a, b, acc, ia, ib, k0, k1, default_nan, last):
    """acc = fma(a_k, b_k, acc) for k in [k0, k1), increasing, one IEEE RNE rounding each.

    a (Ba, M, K), b (Bb, K, N), acc (B, M, N): all float32, or all float64 (f64 instructions);
    default_nan: (1,) array of that dtype; ``last``: which NaN of several (:func:`_nan_of`).
    Oracle: ``mpt.reference.mfma`` rule "fma". One task per output row; the second j-loop copies
    the NaN the rule names over a NaN.
    """
    nb, m, n = acc.shape
    for t in prange(nb * m):
        z, i = t // m, t % m
        row, a_row, b_mat = acc[z, i], a[ia[z], i], b[ib[z]]
        new = np.empty(n, acc.dtype)
        for k in range(k0, k1):
            x, b_k = a_row[k], b_mat[k]
            for j in range(n):
                new[j] = _fma(x, b_k[j], row[j])
            for j in range(n):
                d, c, y = new[j], row[j], b_k[j]
                row[j] = d if d == d else _nan3(c, x, y, default_nan[0], last)


# ---- CDNA1/CDNA2 pairwise tree ----------------------------------------------------------------

@njit(inline="always")
def _leaf(x, y, flush):
    """A product rounded to FP32 as fma(x, y, +0): −0 -> +0, an underflow keeps its sign."""
    return _flush(fma32(x, y, np.float32(0.0)), flush)


@njit(cache=True, parallel=True)
def pairwise_chain(a, b, acc, ia, ib, k0, k1, group, k_inst, flush, default_nan, last):
    """CDNA1/2 f16/bf16: per group of ``group`` (2 or 4) products, acc = acc + tree(products).

    a (Ba, M, K), b (Bb, K, N), acc (B, M, N) float32 (``decode``d, flushed inputs on CDNA2);
    the tree is (p0+p1)+(p2+p3), every sum RNE-FP32; ``flush``: CDNA2's flush of every node and
    accumulator value, and of C to +0 at each instruction start (k a multiple of k_inst).
    Oracle: ``mpt.reference.mfma`` rule "pairwise".
    """
    nb, m, n = acc.shape
    empty_row, empty_mat = np.empty(0), np.empty((0, n))
    for t in prange(nb * m):
        z, i = t // m, t % m
        row, a_row, b_mat = acc[z, i], a[ia[z], i], b[ib[z]]
        new = np.empty(n, np.float32)
        for kb in range(k0, k1, group):
            if flush and kb % k_inst == 0:
                for j in range(n):
                    row[j] = np.float32(0.0) if abs(row[j]) < np.float32(_TINY) else row[j]
            x0, x1, b0, b1 = a_row[kb], a_row[kb + 1], b_mat[kb], b_mat[kb + 1]
            if group == 2:
                for j in range(n):
                    s = _flush(_leaf(x0, b0[j], flush) + _leaf(x1, b1[j], flush), flush)
                    new[j] = _flush(row[j] + s, flush)
            else:
                x2, x3, b2, b3 = a_row[kb + 2], a_row[kb + 3], b_mat[kb + 2], b_mat[kb + 3]
                for j in range(n):
                    s01 = _flush(_leaf(x0, b0[j], flush) + _leaf(x1, b1[j], flush), flush)
                    s23 = _flush(_leaf(x2, b2[j], flush) + _leaf(x3, b3[j], flush), flush)
                    new[j] = _flush(row[j] + _flush(s01 + s23, flush), flush)
            for j in range(n):
                d = new[j]
                row[j] = d if d == d else _nan_of(row[j], a_row, b_mat, j, kb, kb + group,
                                                  empty_row, empty_mat, default_nan[0], last)


# ---- CDNA3 / CDNA4 fused groups: the general path --------------------------------------------

@njit(inline="always")
def _nominal(x, emin_pow2):
    """2^e of a finite value: max(2^floor(log2|x|), 2^emin); 2^-126 for a zero."""
    return max(pow2_floor(x), emin_pow2) if x != 0.0 else _TINY


@njit(inline="always")
def _truncated_sum(a_row, b_mat, j, k_start, k_end, step, emin_a, emin_b, shift):
    """(S, E) over k = k_start, k_start+step, … < k_end: E = max nominal product (times the
    scale factor ``shift``), S = Σ trunc(a·b·shift·2^24/E) (an integer in a float64)."""
    e = 0.0
    for k in range(k_start, k_end, step):
        e = max(e, _nominal(np.float64(a_row[k]), emin_a) * _nominal(np.float64(b_mat[k, j]),
                                                                        emin_b))
    e *= shift
    inv = recip_pow2(e) * 2.0**24
    s = 0.0
    for k in range(k_start, k_end, step):
        s += np.trunc(np.float64(a_row[k]) * np.float64(b_mat[k, j]) * shift * inv)
    return s, e


@njit(inline="always")
def _finish(c, s, e, drop_far_c):
    """Steps 3-4: re-align S·2^(E-24) and c to M = max(E, e(c)) rounding toward −∞ (31 and 24
    fraction bits), add, RNE to FP32 (+0 for an exact zero). c is a finite float64."""
    m = max(e, max(pow2_floor(c), _TINY))
    r = recip_pow2(m)
    s31 = np.floor(s * (e * r * 2.0**7))
    t24 = np.floor(c * r * 2.0**24)
    if drop_far_c and max(pow2_floor(c), _TINY) * 2.0**25 < m:
        t24 = 0.0
    v = (s31 + 2.0**7 * t24) * (m * 2.0**-31)
    return np.float32(v) if v != 0.0 else np.float32(0.0)


@njit(inline="always")
def _fused_group(c, a_row, b_mat, j, kb, group, halves, emin_a, emin_b, sa_row, sb_mat, default,
                 last):
    """One group [kb, kb+group) of the fused rule onto c (float32): specials, then the sums."""
    shift = 1.0
    if sa_row.size > 0:
        shift = sa_row[kb // MX_BLOCK] * sb_mat[kb // MX_BLOCK, j]
    nan, pos_inf, neg_inf = c != c, c == np.inf, c == -np.inf
    big_pos = big_neg = False
    for k in range(kb, kb + group):
        p = np.float64(a_row[k]) * np.float64(b_mat[k, j]) * shift
        nan = nan or p != p
        pos_inf = pos_inf or p == np.inf
        neg_inf = neg_inf or p == -np.inf
        big_pos = big_pos or (p >= 2.0**128 and p < np.inf)
        big_neg = big_neg or (p <= -2.0**128 and p > -np.inf)
    if nan or (pos_inf and neg_inf):
        return _nan_of(c, a_row, b_mat, j, kb, kb + group, sa_row, sb_mat, default, last)
    if pos_inf or neg_inf:
        return np.float32(np.inf) if pos_inf else np.float32(-np.inf)
    if big_pos or big_neg:
        if big_pos and big_neg:
            return BIG_NAN32[0]
        return np.float32(np.inf) if big_pos else np.float32(-np.inf)
    if halves:
        s0, e0 = _truncated_sum(a_row, b_mat, j, kb, kb + group, 2, emin_a, emin_b, shift)
        s1, e1 = _truncated_sum(a_row, b_mat, j, kb + 1, kb + group, 2, emin_a, emin_b, shift)
        e = max(e0, e1)
        r = recip_pow2(e)
        s = np.floor(s0 * (e0 * r)) + np.floor(s1 * (e1 * r))
    else:
        s, e = _truncated_sum(a_row, b_mat, j, kb, kb + group, 1, emin_a, emin_b, shift)
    return _finish(np.float64(c), s, e, halves)


@njit(cache=True, parallel=True)
def fused_chain(a, b, acc, ia, ib, k0, k1, group, halves, emin_a, emin_b, sa, sb, default_nan,
                last):
    """CDNA3/CDNA4 groups of ``group`` products over k in [k0, k1) onto acc, the general path.

    a (Ba, M, K), b (Bb, K, N) float32 from :func:`decode`; acc (B, M, N) float32.
    ``halves``: the FP8 rule (even/odd halves, far C dropped); emin_a, emin_b: 2^emin of the
    input formats; sa (Ba, M, KB), sb (Bb, KB, N): :func:`decode_scales` of the E8M0 block
    scales (KB = 0: none). Oracle: ``mpt.reference.mfma`` rules "fused" and "fused_fp8".
    One task per output row; one element at a time.
    """
    nb, m, n = acc.shape
    for t in prange(nb * m):
        z, i = t // m, t % m
        a_row, b_mat, sa_row, sb_mat = a[ia[z], i], b[ib[z]], sa[ia[z], i], sb[ib[z]]
        for j in range(n):
            c = acc[z, i, j]
            for kb in range(k0, k1, group):
                c = _fused_group(c, a_row, b_mat, j, kb, group, halves, emin_a, emin_b, sa_row,
                                 sb_mat, default_nan[0], last)
            acc[z, i, j] = c


# ---- the fused rule, register-blocked ---------------------------------------------------------

def packed_ok(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether decoded operands may take :func:`fused_chain_packed`: all finite, and every
    non-zero |a_ik·b_kj| within [2^-60, 2^60]."""
    finite_a, lo_a, hi_a = magnitude_range(a)
    finite_b, lo_b, hi_b = magnitude_range(b)
    if not (finite_a and finite_b):
        return False
    return hi_a == 0 or hi_b == 0 or (lo_a * lo_b >= 2.0**-60 and hi_a * hi_b <= 2.0**60)


@njit(cache=True)
def nominals(x, emin_pow2, out):
    """out = the nominal power of two of each value of x (float32, (n,)): :func:`_nominal`."""
    for i in range(x.size):
        out[i] = _nominal(np.float64(x[i]), emin_pow2)


_F32, _I32 = ir.FloatType(), ir.IntType(32)
_F64, _I64 = ir.DoubleType(), ir.IntType(64)
_VF64, _VI64 = ir.VectorType(_F64, _WIDE), ir.VectorType(_I64, _WIDE)
_VF32, _VI32 = ir.VectorType(_F32, 2 * _WIDE), ir.VectorType(_I32, 2 * _WIDE)


def _splat(value, vtype):
    return ir.Constant(vtype, [value] * vtype.count)


def _pow2_bits(e):
    """The float64 pattern of 2^e (an int, for constants of :func:`_finish_lanes`)."""
    return (e + 1023) << 52


def _finish_lanes(builder, c_ptr, e, s, drop_far_c):
    """:func:`_finish` on 8 lanes: c (float64 at c_ptr, in: C, out: D), e (<8 x double> E, at
    least 2^-126: :func:`_emit_group` raises a smaller E, which only groups of zero products
    have, where S = 0, to 2^-126 — M = max(E, e(c)) is the same, e(c) >= 2^-126), s (<8 x
    double> S). An Inf or NaN C stays (the products are finite here).

    Powers of two are made on their float64 patterns, exactly: M = the unsigned max of the
    patterns of E and of 2^e(c) (c's exponent field, raised to 2^-126's; patterns of positive
    numbers order as their values), 2^(E−M+7) = E − M + 2^7 and 2^(24−M), 2^(M−31) by adding to
    the exponent field; all are normal for a finite c (M <= 2^127). Then s31 = floor(S·2^(E−M+7))
    and t24 = floor(c·2^(24−M)) (exact products: integers below 2^53 times powers of two),
    (s31 + 2^7·t24)·2^(M−31) by one fma and one product (exact: below 2^38 units of 2^(M−31)),
    and the one RNE rounding to FP32. An exact zero is +0: s31 is +0 (floor(+0)) or not zero,
    and s31 + 2^7·t24 is +0 when it is 0 (IEEE: x + (−x) = +0, +0 + −0 = +0)."""
    vfloor = _gemm.vector_intrinsic(builder, "llvm.floor.v8f64", _VF64, 1)
    vfma = _gemm.vector_intrinsic(builder, "llvm.fma.v8f64", _VF64, 3)
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v8i64", _VI64, 2)
    c = builder.load(c_ptr, align=8)
    field = builder.and_(builder.bitcast(c, _VI64), _splat(0x7FF0000000000000, _VI64))
    ec = builder.call(vumax, [field, _splat(_pow2_bits(-126), _VI64)])
    e = builder.bitcast(e, _VI64)
    m = builder.call(vumax, [e, ec])
    scale_s = builder.bitcast(builder.add(builder.sub(e, m), _splat(_pow2_bits(7), _VI64)),
                              _VF64)
    scale_c = builder.bitcast(builder.sub(_splat(_pow2_bits(24) + _pow2_bits(0), _VI64), m),
                              _VF64)
    grid = builder.bitcast(builder.sub(m, _splat(_pow2_bits(31) - _pow2_bits(0), _VI64)),
                           _VF64)
    s31 = builder.call(vfloor, [builder.fmul(s, scale_s)])
    t24 = builder.call(vfloor, [builder.fmul(c, scale_c)])
    if drop_far_c:   # 2^e(c)·2^25 < M
        far = builder.icmp_unsigned("<", builder.add(ec, _splat(25 << 52, _VI64)), m)
        t24 = builder.select(far, _splat(0.0, _VF64), t24)
    v = builder.fmul(builder.call(vfma, [t24, _splat(2.0**7, _VF64), s31]), grid)
    d = builder.fpext(builder.fptrunc(v, ir.VectorType(_F32, _WIDE)), _VF64)
    finite = builder.icmp_unsigned("!=", field, _splat(0x7FF0000000000000, _VI64))
    builder.store(builder.select(finite, d, c), c_ptr, align=8)


def _emit_sum(builder, va_addr, pa_addr, vb_addr, pb_addr, k0, nk):
    """(E, S) of products k0 .. k0+nk-1 for a ROWS x COLS tile, in registers (8 vectors
    of 16 lanes each): the anchor pass (E = max pa[k, r]·pb[k, j], from 0, as the unsigned max
    of float32 patterns: the products are >= +0 and never NaN, and such patterns order as their
    values — ``llvm.maxnum`` would add a NaN test per step), the scale 2^24/E on
    float32 patterns (E floored at 2^-64), the sum pass (S = Σ int32(va·vb·scale), ``fptosi``
    truncating toward zero)."""
    rows, tiles = ROWS, ROWS * _gemm.COLS // (2 * _WIDE)
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v16i32", _VI32, 2)

    def anchor_step(k, anchor):
        k = builder.add(k, k0)
        b = _gemm.panel_vectors(builder, pb_addr, k)
        a = _gemm.panel_splats(builder, pa_addr, k, rows)
        return [builder.call(vumax, [anchor[i], builder.bitcast(builder.fmul(a[i // 2],
                                                                             b[i % 2]), _VI32)])
                for i in range(tiles)]
    anchor = _k_steps(builder, nk, [_splat(0, _VI32)] * tiles, anchor_step)
    scale = [builder.bitcast(builder.sub(_splat(int(_SCALE_BITS), _VI32), builder.call(
        vumax, [x, _splat(int(_ANCHOR_FLOOR_BITS), _VI32)])), _VF32) for x in anchor]
    anchor = [builder.bitcast(x, _VF32) for x in anchor]

    def sum_step(k, total):
        k = builder.add(k, k0)
        b = _gemm.panel_vectors(builder, vb_addr, k)
        a = _gemm.panel_splats(builder, va_addr, k, rows)
        return [builder.add(total[i], builder.fptosi(
            builder.fmul(builder.fmul(a[i // 2], b[i % 2]), scale[i]), _VI32))
            for i in range(tiles)]
    return anchor, _k_steps(builder, nk, [_splat(0, _VI32)] * tiles, sum_step)


def _k_steps(builder, nk, state, body):
    """``_gemm.k_loop``, unrolled when nk is an int (a group size known when compiling)."""
    if isinstance(nk, int):
        for k in range(nk):
            state = body(_gemm.const(k), state)
        return state
    return _gemm.k_loop(builder, nk, state, body)


def _merge_halves(builder, even, odd):
    """The FP8 rule's step 2b on (E, S) of the even and the odd half: E = max(E0, E1) and
    S = floor(S0·2^(E0-E)) + floor(S1·2^(E1-E)), as arithmetic right shifts (floor) of int32 by
    the exponent difference, capped at 31 (|S_h| < 2^29, so a shift of 31 or more gives the
    same floor, 0 or -1). A half whose E is below 2^-126 (subnormal or 0 in float32, so its
    field reads 0) holds only zero products: S_h = 0 and any shift leaves it 0."""
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v16i32", _VI32, 2)
    vumin = _gemm.vector_intrinsic(builder, "llvm.umin.v16i32", _VI32, 2)
    anchor, total = [], []
    for e0, s0, e1, s1 in zip(*even, *odd):
        e = builder.bitcast(builder.call(vumax, [builder.bitcast(e0, _VI32),
                                                 builder.bitcast(e1, _VI32)]), _VF32)

        def field(x):
            return builder.lshr(builder.bitcast(x, _VI32), _splat(23, _VI32))

        def shifted(e_h, s_h):
            d = builder.call(vumin, [builder.sub(field(e), field(e_h)), _splat(31, _VI32)])
            return builder.ashr(s_h, d)
        anchor.append(e)
        total.append(builder.add(shifted(e0, s0), shifted(e1, s1)))
    return anchor, total


def _emit_group(builder, tile_addr, va_addr, pa_addr, vb_addr, pb_addr, k0, nk, halves):
    """One group of nk products (an int: unrolled, or an i64 value), k0 .. k0+nk-1, for a
    ROWS x COLS tile at tile_addr (float64, row-major), in registers: (E, S) by
    :func:`_emit_sum` (FP8, ``halves``: of the first and the second nk/2 products, the even-k
    and odd-k ones after :class:`MFMAOperands` reordered K, merged by :func:`_merge_halves`),
    then :func:`_finish_lanes` (FP8: dropping a far C)."""
    sums = (va_addr, pa_addr, vb_addr, pb_addr)
    if halves:
        half = nk // 2 if isinstance(nk, int) else builder.lshr(nk, _gemm.const(1))
        second = builder.add(k0, _gemm.const(half) if isinstance(half, int) else half)
        anchor, total = _merge_halves(builder, _emit_sum(builder, *sums, k0, half),
                                      _emit_sum(builder, *sums, second, half))
    else:
        anchor, total = _emit_sum(builder, *sums, k0, nk)
    base = builder.inttoptr(tile_addr, _F64.as_pointer())
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v16i32", _VI32, 2)
    floored = [builder.bitcast(builder.call(vumax, [builder.bitcast(x, _VI32),
                                                    _splat(0x00800000, _VI32)]), _VF32)
               for x in anchor]                                      # E raised to 2^-126
    for i in range(len(anchor)):
        for part in range(2):
            lanes = ir.Constant(ir.VectorType(_I32, _WIDE),
                                list(range(part * _WIDE, (part + 1) * _WIDE)))
            e = builder.fpext(builder.shuffle_vector(floored[i], floored[i], lanes), _VF64)
            s = builder.sitofp(builder.shuffle_vector(total[i], total[i], lanes), _VF64)
            c_ptr = builder.bitcast(builder.gep(base, [_gemm.const((2 * i + part) * _WIDE)]),
                                    _VF64.as_pointer())
            _finish_lanes(builder, c_ptr, e, s, halves)


def _emit_chunk(group, halves):
    """The body of a tile kernel ``(tile_addr, va_addr, pa_addr, vb_addr, pb_addr, nk,
    ngroups)``: ngroups groups of nk products (``group``, an int, when not 0: nk is ignored and
    each group unrolled) one after the other onto the tile (:func:`_emit_group`)."""
    def emit(builder, tile_addr, va_addr, pa_addr, vb_addr, pb_addr, nk, ngroups):
        size = group or nk

        def one_group(g, state):
            k0 = builder.mul(g, _gemm.const(size) if group else size)
            _emit_group(builder, tile_addr, va_addr, pa_addr, vb_addr, pb_addr, k0, size, halves)
            return state
        _gemm.k_loop(builder, ngroups, [], one_group)
    return emit


#: Tile kernels (:func:`_emit_chunk`): groups of 8 (f16/bf16), of any size, of the FP8 rule.
_groups_of_8 = _gemm._tile_intrinsic(_emit_chunk(8, False), 7)
_groups = _gemm._tile_intrinsic(_emit_chunk(0, False), 7)
_groups_fp8 = _gemm._tile_intrinsic(_emit_chunk(0, True), 7)


@njit(cache=True, parallel=True)
def fused_chain_packed(vap, pap, vbp, pbp, acc, ia, ib, k0, k1, group, halves):
    """The fused rules (unscaled) over k in [k0, k1) for :func:`packed_ok` operands.

    vap, pap: (Ba, Mt, K, ROWS) float32 values and :func:`nominals` of A packed by
    ``gemm.pack_rows``; vbp, pbp: (Bb, Nt, K, COLS) of B by ``gemm.pack_cols``; acc: (B, Mt, Nt,
    ROWS·COLS) float64 tiles (``gemm.pack_tiles``), in: C, out: D. Per group and tile, in
    registers (:func:`_emit_group`): the anchor pass (E = max of nominal products, from 0: C is
    not in it), the sum pass (int32 Σ trunc(a·b·2^24/E): float32 products of <= 11-bit values
    are exact, |S| < 8·2^26), then the finish in float64. E is floored at 2^-64 for the scale
    2^24/E (so it stays finite, at most 2^88): only groups of zero products, whose terms are 0
    anyway, reach the floor (a non-zero product has E >= 2^-62 here). ``halves``: the FP8 rule,
    on operands whose K was reordered within each group (even k first, then odd k).
    """
    nb = acc.shape[0]
    mt, nt = vap.shape[1], vbp.shape[1]
    groups = (mt + _gemm.ROW_TILES - 1) // _gemm.ROW_TILES
    step = max(_KC // group, 1) * group
    for t in prange(nb * nt * groups):
        z = t // (nt * groups)
        jt = t // groups % nt
        g = t % groups
        va_z, pa_z, vb_p, pb_p = vap[ia[z]], pap[ia[z]], vbp[ib[z], jt], pbp[ib[z], jt]
        for kc in range(k0, k1, step):
            ngroups = min(step, k1 - kc) // group
            for it in range(g * _gemm.ROW_TILES, min(mt, (g + 1) * _gemm.ROW_TILES)):
                args = (acc[z, it, jt].ctypes.data, va_z[it, kc:].ctypes.data,
                        pa_z[it, kc:].ctypes.data, vb_p[kc:].ctypes.data, pb_p[kc:].ctypes.data,
                        group, ngroups)
                if halves:
                    _groups_fp8(*args)
                elif group == 8:
                    _groups_of_8(*args)
                else:
                    _groups(*args)
