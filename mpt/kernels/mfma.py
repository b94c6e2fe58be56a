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
The register-blocked kernel of the fused rules (operands within a proven range) is
:mod:`mpt.kernels.mfma_packed`'s ``fused_chain_packed``.

Why the fused rule is exact in float64 (inputs of at most 11 significant bits — fp16, bf16,
TF32, fp8/6/4 — so every product a·b is exact in float64): nominal exponents are powers of two
(2^-506 <= E <= 2^510 with scales), so scaling by them is exact; each truncated term is an
integer below 2^26 (|p| < 4·2^e <= 4E), a group sum S below 2^30; s = floor(S·2^(E-M+7)) < 2^37
and t = floor(c·2^(24-M)) < 2^25 are exact floors, and (s + 2^7·t)·2^(M-31) < 2^38·2^(M-31) is
exact, so ``np.float32`` of it is the one RNE rounding.

NaN bits are the oracle's: a NaN result takes the first (``last``: the last) NaN among the
group's operands in the order c, a_0, b_0, a_1, b_1, … (copied, never computed, so the payload
survives), else the made NaN (``DEFAULT_NAN32``/``DEFAULT_NAN64``, or ``BIG_NAN32`` for the
2^128 rule). Which of several NaNs is an assumption (``several_nans`` of the AMD models).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.core.extending import overload

from mpt.formats import get_format
from mpt.kernels.fma import fma32, fma64
from mpt.kernels.half import widen16
from mpt.kernels.mma import pow2_floor, recip_pow2

__all__ = ["DEFAULT_NAN32", "DEFAULT_NAN64", "BIG_NAN32", "decode", "decode_scales",
           "fma_chain", "pairwise_chain", "fused_chain", "MX_BLOCK"]

#: The NaN the arithmetic makes (Inf·0, Inf − Inf): x86's default NaN, as MMA-Sim gives it.
DEFAULT_NAN32 = np.array([0xFFC00000], np.uint32).view(np.float32)
DEFAULT_NAN64 = np.array([0xFFF8000000000000], np.uint64).view(np.float64)
#: The NaN of the 2^128 rule when both signs overflow (MMA-Sim's ``float("nan")``).
BIG_NAN32 = np.array([0x7FC00000], np.uint32).view(np.float32)

MX_BLOCK = 32                 # k per E8M0 block scale (OCP MX)
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
    if f.name in ("fp16", "bf16") and x.dtype == f.dtype:  # exact, faster than casts
        v = widen16(x)
        nan = np.isnan(v)
        if nan.any():                      # the payload is in place: quiet it
            v.view(np.uint32)[nan] |= np.uint32(0x00400000)
        return _flushed(v, f) if flush else v
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
    return _flushed(v, f) if flush else v


def _flushed(v, f):
    """v with values below the format's smallest normal (−0 included) set to +0, in place."""
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
