"""L1: the operands of the block model's tile kernels (:mod:`mpt.kernels.block_gemm`): exponent
ranges, anchor codes and packed panels.

The tile kernels take float32 values and, per value, a uint8 anchor code of its nominal
exponent (the exponent field, at least the format's emin: a subnormal takes emin). A's codes
are u = ea + s_a, B's v = s_b − eb (``tile_params`` chooses the shifts s_a, s_b); a zero is
coded 0 in A and 255 in B. This module packs the operands and finds, as it packs, what
``tile_params`` needs — whether the operands are finite and the range of the nominal exponents
ea + eb of their non-zero products (:func:`product_range`) —, then adds the codes: 8-row panels
of A and 64-column panels of B (:func:`pack_block_values`, then :func:`block_codes`), one dot
product per lane (:func:`lane_values`, then :func:`lane_codes`), or a tile call's panels
(:func:`tile_pack`, :func:`tile_codes`). The GEMM packers read the operands as stored —
float32, or bf16 and fp16 widened to float32 as they are read (``mpt.kernels.gemm.source``) —,
in any layout: no decoded or contiguous copy comes first. Exact: values are copied bit for bit
(bf16 and fp16 widen exactly); exponents are integer fields. Unsigned, select-free arithmetic
throughout, so that the loops vectorize.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from mpt.kernels.block_gemm import BLOCK_COLS, BLOCK_ROWS
from mpt.kernels.gemm import as_f32_pattern, next_output, pack_panels, source
from mpt.kernels.half import widen16
from mpt.kernels.mma import f32_bits, f32_from_bits

__all__ = ["product_range", "finite_range", "finite_range_2d",
           "pack_block_values", "block_codes", "lane_values", "lane_codes", "tile_pack",
           "tile_codes"]

_NO_EXP = 1 << 20   # "no non-zero value" in the exponent ranges
_NONE_LO = 0xFFFF   # "no non-zero value" in the ranges of biased exponent fields


@njit(inline="always")
def _field(x, field_min):
    """The nominal exponent of a float32 pattern x (uint32) as a biased field, at least
    ``field_min`` = emin + 127 (a float32 subnormal takes the format's emin), and whether x is
    non-zero (the sign shifted out)."""
    return max((x >> np.uint32(23)) & np.uint32(0xFF), field_min), \
        np.uint32(x << np.uint32(1)) != np.uint32(0)


@njit(inline="always")
def _widen(low, high, x, field_min):
    """(low, high) widened by the nominal exponent field of x if x is non-zero (select-free, so
    that reductions vectorize)."""
    f, nonzero = _field(x, field_min)
    mask = np.uint32(0) - np.uint32(nonzero)                  # all ones for a non-zero x
    return min(low, f | (np.uint32(_NONE_LO) & ~mask)), max(high, f & mask)


@njit(inline="always")
def _code_a(x, field_min, shift):
    """A's anchor code of the float32 pattern x: max(field + shift, 0), 0 for a zero; the byte
    four times in a uint32."""
    f, nonzero = _field(x, field_min)
    code = max(np.int32(f) + shift, np.int32(0))
    return (np.uint32(code) if nonzero else np.uint32(0)) * np.uint32(0x01010101)


@njit(inline="always")
def _code_b(x, field_min, shift):
    """B's anchor code of the float32 pattern x: min(shift − field, 255), 255 for a zero."""
    f, nonzero = _field(x, field_min)
    code = min(shift - np.int32(f), np.int32(255))
    return np.uint8(code) if nonzero else np.uint8(255)


@njit(cache=True, parallel=True)
def _codes_a(values, field_min, shift, eout):
    """eout = A's anchor code (:func:`_code_a`) of each packed value (uint32 patterns)."""
    flat, codes = values.reshape(-1), eout.reshape(-1)
    for i in prange(flat.size):
        codes[i] = _code_a(flat[i], field_min, shift)


@njit(cache=True, parallel=True)
def _codes_b(values, field_min, shift, eout):
    """eout = B's anchor code (:func:`_code_b`) of each packed value (uint32 patterns)."""
    flat, codes = values.reshape(-1), eout.reshape(-1)
    for i in prange(flat.size):
        codes[i] = _code_b(flat[i], field_min, shift)


@njit(cache=True, parallel=True)
def _panel_magnitudes(bits, mags):
    """mags[t] (2, K·W): the (top, low) of :func:`_widen_magnitudes` per element i = k·W + w
    over the packed panels bits (Q, K·W) (uint32 patterns) whose index q ≡ t (mod T =
    mags.shape[0]). Element by element along contiguous rows: the loops vectorize."""
    nq, tasks = bits.shape[0], mags.shape[0]
    for t in prange(tasks):
        mags[t, 0], mags[t, 1] = 0, 0xFFFFFFFF
        for q in range(t, nq, tasks):
            _fold_magnitudes(mags[t], bits[q])


def _ranges_of_panels(values, emin):
    """(lo, hi)[k]: the lowest/highest non-zero nominal exponent field of column k of packed
    panels values (B, P, K, W) float32 (:func:`_fields`). One partial range per thread (min and
    max: the result does not depend on their number)."""
    nb, npanel, k, width = values.shape
    bits = values.view(np.uint32).reshape(nb * npanel, k * width)
    tasks = max(1, min(bits.shape[0], numba.get_num_threads()))
    mags = np.empty((tasks, 2, k, width), np.uint32)
    _panel_magnitudes(bits, mags.reshape(tasks, 2, k * width))
    return _fields(mags, np.uint32(emin + 127))


def _panels(x, width):
    """Panels of x (B, R, K) (float32, bfloat16 or float16, any strides) of ``width`` along R,
    as float32 (``mpt.kernels.gemm.pack_panels``)."""
    nb, nr, k = x.shape
    return pack_panels(x, np.empty((nb, -(-nr // width), k, width), np.float32))


def _ranges(lo_a, hi_a, lo_b, hi_b):
    """:func:`product_range` as (finite?, (lowest, highest, top A, top B) or None)."""
    finite, *ranges = product_range(lo_a, hi_a, lo_b, hi_b)
    return (True, tuple(int(x) for x in ranges)) if finite else (False, None)


def pack_block_values(a: np.ndarray, b: np.ndarray, emin_a: int, emin_b: int):
    """The tile kernels' value panels of A (B, M, K) and B (B, K, N) (float32, bfloat16 or
    float16, any strides): ((A's (B, Mt, K, BLOCK_ROWS), B's (B, Nt, K, BLOCK_COLS)) float32,
    (finite?, (lowest, highest nominal exponent ea + eb of a non-zero product, highest non-zero
    exponent of A, of B)) read off the panels (:func:`product_range`; their padding zeros count
    for nothing): exact for one batch element, conservative over a batch."""
    va, vb = _panels(a, BLOCK_ROWS), _panels(b.transpose(0, 2, 1), BLOCK_COLS)
    return (va, vb), _ranges(*_ranges_of_panels(va, emin_a), *_ranges_of_panels(vb, emin_b))


def block_codes(va: np.ndarray, vb: np.ndarray, emin_a: int, emin_b: int, shifts):
    """The anchor codes of :func:`pack_block_values`'s panels: A's (B, Mt, K, BLOCK_ROWS)
    uint32 (max(ea + s_a, 0), 0 for zeros, each byte four times), B's (B, Nt, K, BLOCK_COLS)
    uint8 (min(s_b − eb, 255), 255 for zeros); ``shifts``: (s_a, s_b) of :func:`tile_params`
    (s_b >= every eb)."""
    ca, cb = np.empty(va.shape, np.uint32), np.empty(vb.shape, np.uint8)
    _codes_a(va.view(np.uint32), np.uint32(emin_a + 127), np.int32(shifts[0] - 127), ca)
    _codes_b(vb.view(np.uint32), np.uint32(emin_b + 127), np.int32(shifts[1] + 127), cb)
    return ca, cb


def finite_range(x):
    """(every value finite?, largest magnitude, smallest non-zero magnitude (inf if none)) of a
    C-contiguous float32 array."""
    bits = x.reshape(-1).view(np.uint32)
    top, low = np.uint32(0), np.uint32(0xFFFFFFFF)
    return _as_range(*_flat_magnitudes(bits, top, low))


@njit(inline="always")
def _widen_magnitudes(top, low, bits):
    """(top, low) widened by the float32 pattern bits: the largest magnitude pattern and the
    smallest non-zero one minus 1, each doubled (the sign shifted out). Unsigned arithmetic, so
    that loops vectorize: magnitude bits order like magnitudes (NaNs above Inf), and a zero's
    0 − 1 wraps above every other."""
    m = np.uint32(bits << np.uint32(1))
    return max(top, m), min(low, np.uint32(m - np.uint32(1)))


@njit(inline="always")
def _fold_magnitudes(mags, x):
    """mags (2, n): the (top, low) of :func:`_widen_magnitudes` widened element by element by
    the (n,) uint32 patterns x."""
    for j in range(x.size):
        mags[0, j], mags[1, j] = _widen_magnitudes(mags[0, j], mags[1, j], x[j])


@njit(cache=True)
def _fields(mags, field_min):
    """(lo, hi)[k] (uint32) from partial (top, low) magnitudes mags (T, 2, K, W) of
    :func:`_widen_magnitudes` per (k, w): the nominal exponent fields of column k's smallest
    and largest non-zero magnitude (monotone in the magnitude; at least ``field_min``; Inf and
    NaN give 255; _NONE_LO / 0 if column k holds no non-zero value)."""
    tasks, _, k, width = mags.shape
    lo, hi = np.empty(k, np.uint32), np.empty(k, np.uint32)
    for kk in range(k):
        top, low = np.uint32(0), np.uint32(0xFFFFFFFF)
        for t in range(tasks):
            for w in range(width):
                top = max(top, mags[t, 0, kk, w])
                low = min(low, mags[t, 1, kk, w])
        smallest = np.uint32(np.uint32(low + np.uint32(1)) >> np.uint32(1))
        lo[kk] = max(smallest >> np.uint32(23), field_min) if smallest else np.uint32(_NONE_LO)
        hi[kk] = max(top >> np.uint32(24), field_min) if top else 0
    return lo, hi


@njit(cache=True)
def _flat_magnitudes(bits, top, low):
    """:func:`_widen_magnitudes` over the (n,) uint32 patterns bits."""
    for i in range(bits.size):
        top, low = _widen_magnitudes(top, low, bits[i])
    return top, low


@njit(cache=True)
def _as_range(top, low):
    """(finite?, largest, smallest non-zero magnitude (inf if none)) from the (top, low) of
    :func:`_widen_magnitudes`."""
    top = np.uint32(top >> np.uint32(1))
    low = np.uint32(np.uint32(low + np.uint32(1)) >> np.uint32(1))
    finite = top < np.uint32(0x7F800000)
    smallest = np.float64(f32_from_bits(low)) if low != 0 else np.inf
    return finite, np.float64(f32_from_bits(top)) if finite else np.inf, smallest


# ---- one tile GEMM at a time (mpt.kernels.attention) ------------------------------------------

@njit(cache=True)
def product_range(lo_a, hi_a, lo_b, hi_b):
    """(all finite?, lowest, highest nominal exponent ea + eb of a non-zero product, highest
    non-zero exponent of A, of B) from per-k ranges of biased exponent fields."""
    lowest, highest, top_a, top_b = _NO_EXP, -_NO_EXP, 0, 0
    for kk in range(lo_a.size):
        top_a, top_b = max(top_a, np.int64(hi_a[kk])), max(top_b, np.int64(hi_b[kk]))
        if hi_a[kk] > 0 and hi_b[kk] > 0:
            lowest = min(lowest, np.int64(lo_a[kk]) + np.int64(lo_b[kk]) - 254)
            highest = max(highest, np.int64(hi_a[kk]) + np.int64(hi_b[kk]) - 254)
    return max(top_a, top_b) < 0xFF, lowest, highest, top_a - 127, top_b - 127


# ---- many small products: one dot product per lane --------------------------------------------

@njit(inline="always")
def _lane_offsets(p, width, ia, ib, m, n, k, row, col):
    """row/col[w] = the offsets of A[ia[z], i, 0] and B[ib[z], 0, j] in the flat operands for
    output d = (z, i, j) = p·width + w of (B, M, N) (counted up from panel p's first output:
    no division per lane); returns the number of outputs in panel p."""
    d0 = p * width
    w_n = min(width, ia.size * m * n - d0)
    z, i, j = d0 // (m * n), d0 // n % m, d0 % n
    for w in range(w_n):
        row[w] = (ia[z] * m + i) * k
        col[w] = ib[z] * k * n + j
        z, i, j = next_output(z, i, j, m, n)
    return w_n


@njit(cache=True, parallel=True)
def _lane_values(a, kind_a, b, kind_b, ia, ib, m, n, va, vb, mags):
    """va/vb[p, k, w] = A[ia[z], i, k] / B[ib[z], k, j] for output d = (z, i, j) = p·W + w of
    (B, M, N) (W = va.shape[2]; padding: zeros), copied bit for bit; a, b: the C-contiguous
    (Ba, M, K) and (Bb, K, N) patterns of their kinds (``mpt.kernels.gemm.source``), flattened.
    mags[x, t] (2, K·W): the (top, low) of :func:`_widen_magnitudes` of A's values (x = 0),
    of B's (x = 1), per (k, w) over the panels of task t (T = mags.shape[1] tasks of
    consecutive panels): each panel is folded in while it is in cache."""
    npanel, k, width = va.shape
    tasks, span = mags.shape[1], k * width
    for t in prange(tasks):
        for x in range(2):
            mags[x, t, 0], mags[x, t, 1] = 0, 0xFFFFFFFF
        row, col = np.empty(width, np.int64), np.empty(width, np.int64)
        for p in range(t * npanel // tasks, (t + 1) * npanel // tasks):
            w_n = _lane_offsets(p, width, ia, ib, m, n, k, row, col)
            for kk in range(k):
                for w in range(w_n):
                    va[p, kk, w] = as_f32_pattern(a[row[w] + kk], kind_a)
                    vb[p, kk, w] = as_f32_pattern(b[col[w] + kk * n], kind_b)
                for w in range(w_n, width):
                    va[p, kk, w], vb[p, kk, w] = 0, 0
            _fold_magnitudes(mags[0, t], va[p].reshape(span))
            _fold_magnitudes(mags[1, t], vb[p].reshape(span))


@njit(cache=True, parallel=True)
def _lane_codes(va, vb, field_min_a, shift_a, field_min_b, shift_b, ea, eb):
    """ea/eb = the anchor codes (:func:`_code_a`, :func:`_code_b`; one byte each) of the lane
    panels va/vb (uint32 patterns, (P, K, W)); one task per panel."""
    span = va.shape[1] * va.shape[2]
    for p in prange(va.shape[0]):
        xa, xb = va[p].reshape(span), vb[p].reshape(span)
        ca, cb = ea[p].reshape(span), eb[p].reshape(span)
        for j in range(span):
            ca[j] = np.uint8(_code_a(xa[j], field_min_a, shift_a) & np.uint32(0xFF))
            cb[j] = _code_b(xb[j], field_min_b, shift_b)


def lane_values(a, b, ia, ib, emin_a, emin_b):
    """A (Ba, M, K) and B (Bb, K, N) float32, bfloat16 or float16 (any strides) of a broadcast
    batch (ia, ib) as lane panels for :func:`block_chain_lanes`, one output per lane: ((values
    of A, values of B), each (ceil(B·M·N / BLOCK_COLS), K, BLOCK_COLS) float32, and (finite?,
    (lowest, highest, top_a, top_b)) as :func:`pack_block_values` gives them, found in the
    packing pass: the panels hold every value of A and of B (where the product has an output),
    under its k, and zeros). :func:`lane_codes` adds the anchor codes. float16 is widened
    first (vectorized; the lane gather does not vectorize fp16's arithmetic widening)."""
    a, b = (widen16(x) if x.dtype == np.float16 else x for x in (a, b))
    k = a.shape[2]
    npanel = -(-ia.size * a.shape[1] * b.shape[2] // BLOCK_COLS)
    va, vb = (np.empty((npanel, k, BLOCK_COLS), np.float32) for _ in range(2))
    tasks = max(min(npanel, numba.get_num_threads()), 1)   # (min and max: any split is exact)
    mags = np.empty((2, tasks, 2, k, BLOCK_COLS), np.uint32)
    (bits_a, kind_a), (bits_b, kind_b) = (source(np.ascontiguousarray(x)) for x in (a, b))
    _lane_values(bits_a.reshape(-1), kind_a, bits_b.reshape(-1), kind_b, ia, ib, a.shape[1],
                 b.shape[2], va.view(np.uint32), vb.view(np.uint32),
                 mags.reshape(2, tasks, 2, k * BLOCK_COLS))
    return (va, vb), _ranges(*_fields(mags[0], np.uint32(emin_a + 127)),
                             *_fields(mags[1], np.uint32(emin_b + 127)))


def lane_codes(va, vb, emin_a, emin_b, shifts):
    """The lane panels of :func:`lane_values` with their anchor codes, for
    :func:`block_chain_lanes`: (values A, codes A, values B, codes B) (uint8 codes);
    ``shifts``: (s_a, s_b) of :func:`tile_params`."""
    ea, eb = np.empty(va.shape, np.uint8), np.empty(vb.shape, np.uint8)
    _lane_codes(va.view(np.uint32), vb.view(np.uint32), np.uint32(emin_a + 127),
                np.int32(shifts[0] - 127), np.uint32(emin_b + 127), np.int32(shifts[1] + 127),
                ea, eb)
    return va, ea, vb, eb


@njit(cache=True)
def tile_pack(x, field_min, vout, lo, hi):
    """Panels of x (R, K) float32 (any strides) for a tile call: vout[p, k, w] = x[p·W + w, k]
    (0 past R) for panels of width W = vout.shape[2] (a multiple of 8) along its rows, and
    lo/hi[k] widened by the nominal exponent fields of the non-zero values of column k (see
    :func:`_widen`). The copy follows x's memory order (runs along a column, or 8 x 8
    blocks of rows), the ranges run over the packed panels, so that the loops vectorize.
    Returns the number of panels."""
    nr, k = x.shape
    width = vout.shape[2]
    npanel = (nr + width - 1) // width
    vout[:npanel] = 0.0
    if x.strides[1] <= x.strides[0]:            # rows contiguous: 8 x 8 blocks, transposed
        for r0 in range(0, nr, 8):
            p, w0 = r0 // width, r0 % width     # (a width is a multiple of 8)
            for k0 in range(0, k, 8):
                if r0 + 8 <= nr and k0 + 8 <= k:
                    for i in range(8):
                        for j in range(8):
                            vout[p, k0 + j, w0 + i] = x[r0 + i, k0 + j]
                else:
                    for i in range(min(8, nr - r0)):
                        for j in range(min(8, k - k0)):
                            vout[p, k0 + j, w0 + i] = x[r0 + i, k0 + j]
    else:                                       # columns contiguous: runs of W along a column
        for p in range(npanel):
            w_n = min(width, nr - p * width)
            for kk in range(k):
                for w in range(w_n):
                    vout[p, kk, w] = x[p * width + w, kk]
    for p in range(npanel):
        for kk in range(k):
            low, high = lo[kk], hi[kk]
            for w in range(width):
                low, high = _widen(low, high, f32_bits(vout[p, kk, w]), field_min)
            lo[kk], hi[kk] = low, high
    return npanel


@njit(cache=True)
def tile_codes(values, npanel, k, field_min, shift, eout):
    """Anchor codes of the panels of :func:`tile_pack`: A's (uint32 eout, ``shift`` = s_a − 127,
    :func:`_code_a`) or B's (uint8 eout, ``shift`` = s_b + 127, :func:`_code_b`)."""
    for p in range(npanel):
        for kk in range(k):
            for w in range(values.shape[2]):
                x = f32_bits(values[p, kk, w])
                if eout.itemsize == 4:
                    eout[p, kk, w] = _code_a(x, field_min, shift)
                else:
                    eout[p, kk, w] = _code_b(x, field_min, shift)


@njit(cache=True)
def finite_range_2d(c, m, n):
    """:func:`finite_range` of c[:m, :n] for a C-contiguous 2-D float32 array c (from njit code;
    row by row, so that the loops vectorize), and whether every bit of c[:m, :n] is 0."""
    top, low, bits = np.uint32(0), np.uint32(0xFFFFFFFF), np.uint32(0)
    for r in range(m):
        row = c[r]
        for j in range(n):
            x = f32_bits(np.float32(row[j]))          # (a float64 c only in fp64 mode,
                                                      # where this path never runs)
            top, low = _widen_magnitudes(top, low, x)
            bits |= x
    return _as_range(top, low) + (bits == 0,)
