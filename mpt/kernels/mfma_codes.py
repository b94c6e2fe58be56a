"""L1: the operands of the register-blocked CDNA3/CDNA4 kernel (:mod:`mpt.kernels.mfma_packed`):
whether they may take it (:func:`packed_tops`) and the uint8 anchor codes of their packed panels
(:func:`pack_codes`), laid out as the kernel's ROWS x COLS tiles read them. Why the codes hold
every anchor: :mod:`mpt.kernels.mfma_packed`'s module docstring.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from mpt.kernels import gemm as _gemm
from mpt.kernels.block_pack import _field

__all__ = ["ROWS", "packed_tops", "pack_codes", "code_lane"]

ROWS = 4                      # tile rows: 4 x 32 outputs keep the scales and S (16 vectors)
                              # in the 32 AVX-512 registers; measured faster than 2 or 6
_ZERO_EXP = -126              # a zero's nominal exponent, and the anchor codes' floor


def packed_tops(a: np.ndarray, b: np.ndarray, emin_a: int, emin_b: int):
    """(max ea, max eb), the largest nominal exponents of operands a and b (float32 values, or
    float16/bfloat16 as stored; of formats whose emin are emin_a and emin_b), when they may take
    :func:`fused_chain_packed`: all finite, and every non-zero |a_ik·b_kj| within [2^-60, 2^60];
    None otherwise."""
    (hi_a, lo_a), (hi_b, lo_b) = _magnitude_range(a), _magnitude_range(b)
    if not (np.isfinite(hi_a) and np.isfinite(hi_b)):           # an Inf or a NaN
        return None
    tops = (_nominal_of(hi_a, emin_a), _nominal_of(hi_b, emin_b))
    if hi_a == 0 or hi_b == 0:                                   # every product is zero
        return tops
    return tops if lo_a * lo_b >= 2.0**-60 and hi_a * hi_b <= 2.0**60 else None


def _magnitude_range(x):
    """(largest, smallest non-zero) magnitude of x (float32, float16 or bfloat16) as float64;
    (0, 0) when every value is ±0; NaN when x holds one (its pattern is above Inf's)."""
    x = np.ascontiguousarray(x)
    storage = np.uint32 if x.dtype.itemsize == 4 else np.uint16
    bits = x.reshape(-1).view(storage)
    top, low = _magnitudes(bits, np.uint32(np.iinfo(storage).max >> 1))
    return tuple(float(np.array(v, storage).view(x.dtype)) for v in (top, low))


def _nominal_of(top, emin):
    """The nominal exponent of the largest magnitude ``top`` (it grows with the magnitude):
    floor(log2(top)) raised to emin, −126 for 0 (every value ±0)."""
    return _ZERO_EXP if top == 0 else max(math.frexp(top)[1] - 1, emin)


@njit(cache=True)
def _magnitudes(bits, mask):
    """(largest, smallest non-zero) magnitude pattern of float patterns bits (uint32 or uint16;
    ``mask`` drops the sign; the patterns of magnitudes order as their values); the smallest is
    0 when all are ±0. Integer min/max only, so the loop vectorizes."""
    hi, low = np.uint32(0), np.uint32(0xFFFFFFFF)
    for i in range(bits.size):
        m = np.uint32(bits[i]) & mask
        hi = max(hi, m)
        low = min(low, np.uint32(m - np.uint32(1)))   # ±0 wraps to the largest
    return hi, np.uint32(low + np.uint32(1))


def code_lane(j: int) -> int:
    """The byte that holds column j's code (of the first row of a pair; the second row's is 4
    bytes on) in a row of B's code panel and in the kernel's anchor-code vectors (64 bytes: two
    rows x COLS columns). The 128-bit lane (j % 16) // 4 holds columns 4·lane .. 4·lane + 3 and
    16 more, each 4 columns of the first row then of the second, so that the 16 codes of an
    output vector (a row's 16 columns) lie in the lanes of their 32-bit outputs: one in-lane byte
    shuffle (vpshufb) widens them (``mfma_packed._code_fields``)."""
    return 16 * (j % 16 // 4) + 8 * (j // 16) + j % 4


def pack_codes(va: np.ndarray, vb: np.ndarray, tops, emins):
    """The anchor codes of the packed panels va (Ba, Mt, K, ROWS) and vb (Bb, Nt, K, COLS)
    (float32, ``mpt.kernels.gemm.pack_rows`` and ``pack_cols``; ``tops``: their largest nominal
    exponents, :func:`packed_tops`; ``emins``: their formats' emin): A's (Ba, Mt, K, ROWS)
    uint32, u = clip(ea + s, 0, 255) in each byte; B's (Bb, Nt, K, 2·COLS) uint8,
    v = clip(s − 126 − eb, 0, 255) twice per column, in the interleaved panel
    ``mfma_packed._emit_codes`` reads (bytes L = :func:`code_lane` (j) and L + 4 of column j), with
    s = 255 − max ea and the nominal exponents ea, eb (a zero's −126, a subnormal's emin). The
    codes hold every anchor when max ea + max eb <= 129 (module docstring), which
    :func:`packed_tops` operands meet: a largest nominal exponent that comes from a normal value
    is at most log2 of it, so two such sum to at most log2 of the largest product, 60; one that
    comes from a subnormal or a zero (emin, −126) sums with the other operand's to at most
    emin + the largest exponent of its format, <= 1 for every format here. ValueError
    otherwise."""
    (top_a, top_b), (emin_a, emin_b) = tops, emins
    if top_a + top_b > 255 + _ZERO_EXP:
        raise ValueError(f"anchor codes need max ea + max eb <= {255 + _ZERO_EXP}; got "
                         f"{top_a} + {top_b} (operands outside packed_tops's range)")
    shift = np.int32(255 - top_a)
    ca = np.empty(va.shape, np.uint32)
    cb = np.empty(vb.shape[:3] + (2 * _gemm.COLS,), np.uint8)
    _codes_a(va.reshape(-1).view(np.uint32), np.uint32(emin_a + 127), shift, ca.reshape(-1))
    rows = cb.reshape(-1, 2 * _gemm.COLS)
    _codes_b(vb.reshape(-1, _gemm.COLS).view(np.uint32), np.uint32(emin_b + 127),
             np.int32(shift + _ZERO_EXP), rows, rows.view(np.uint32))
    return ca, cb


@njit(inline="always")
def _nominal(x, field_min):
    """The nominal exponent of the float32 pattern x (uint32) as an int32: its exponent field
    raised to ``field_min`` = emin + 127 (``block_pack._field``), minus 127; −126 for ±0."""
    field, nonzero = _field(x, field_min)
    return np.int32(field if nonzero else 1) - np.int32(127)


@njit(cache=True, parallel=True)
def _codes_a(bits, field_min, shift, out):
    """out[i] = clip(nominal(bits[i]) + shift, 0, 255)·0x01010101: element by element, in memory
    order (the loop vectorizes)."""
    for i in prange(bits.size):
        u = min(max(_nominal(bits[i], field_min) + shift, np.int32(0)), np.int32(255))
        out[i] = np.uint32(u) * np.uint32(0x01010101)


@njit(cache=True, parallel=True)
def _codes_b(bits, field_min, shift, out, words):
    """out[r, L] = out[r, L + 4] = clip(shift − nominal(bits[r, j]), 0, 255), L =
    :func:`code_lane` (j): each row of COLS values to its interleaved row of 2·COLS codes
    (``words``: out as uint32). The codes are written in column order first (a loop that
    vectorizes), then moved 4 columns (one word) at a time: word 4·lane + 2h + ρ (row ρ of a
    pair) takes columns 16h + 4·lane .. 16h + 4·lane + 3."""
    for r in prange(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[r, j] = np.uint8(min(max(shift - _nominal(bits[r, j], field_min),
                                         np.int32(0)), np.int32(255)))
        row = words[r]
        low = row[0], row[1], row[2], row[3]        # columns 0-15, 4 per word
        high = row[4], row[5], row[6], row[7]       # columns 16-31
        for lane in range(4):                       # word 4·lane + 2h + ρ: group 4h + lane
            row[4 * lane] = row[4 * lane + 1] = low[lane]
            row[4 * lane + 2] = row[4 * lane + 3] = high[lane]
