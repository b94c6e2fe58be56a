"""L1: Tensor Core block-FMA model, the exact dot product and IEEE mul-add, as Numba kernels.

The block model (docs/tensor_cores.md §1) for one output element and one block of L products:

    E     = max(2^e_zero, nominal(c), max_k nominal(a_k)·nominal(b_k))      (powers of two)
    q     = E·2^-F                                                           (smallest bit kept)
    total = trunc(c/q) + Σ_k trunc(a_k·b_k/q)                                 (integer, exact)
    d     = round_out(total·q)          RZ to 24 or 14 bits (FP32, E8M13) or RNE to FP16

``nominal(x) = 2^max(floor(log2|x|), emin_fmt)`` (a subnormal keeps its format's emin; products
are NOT renormalised, so E uses e_a + e_b even when the significand product is in [2, 4)).

Why this is exact in float64 (no integer bit tricks needed), for every input format the presets
accept (fp16, bf16, tf32, fp8, fp6, fp4: at most 11 significant bits, |exponent| <= 149):
  * a_k·b_k has at most 22 significant bits and lies in [2^-298, 2^256]: exact in float64.
  * Multiplying by 1/q = 2^(F-E) is exact (a power of two; all values stay far inside float64's
    normal range, since 2^-158 <= q <= 2^241), and ``trunc`` is exact.
  * |a_k·b_k| < 4·nominal(a_k)·nominal(b_k) <= 4E, so each truncated term is an integer below
    2^(F+2) <= 2^27; c (< 2·nominal(c) <= 2E) gives one below 2^(F+1). A block has at most 32
    products plus c, so |total| < 33·2^27 < 2^33 <= 2^53: the float64 sum is exact in any order.
  * total·q (< 2^33 times a power of two) is exact, and rounding it to the output grid is one
    power-of-two scaling plus ``trunc``/``rint`` (RNE), both exact.
The zero-term exponent e_zero enters every block: a non-zero c has nominal(c) >= 2^emin_out >
2^e_zero (emin_out = -126 or -14 against e_zero <= -132 or <= -19), and c = 0 is itself a zero
term, so max(2^e_zero, ...) equals the spec's rule "a zero term takes e_zero" in every case.

Specials follow from float arithmetic: a NaN operand or Inf·0 gives a NaN term, an Inf product an
Inf term, +Inf + −Inf a NaN; infinite/NaN terms have nominal exponent 0 so they never move E.
Kernels return NaN with whatever payload; the public wrapper writes the canonical NaN.

Oracle: ``mpt.reference.mma`` (exact rationals, bit patterns in and out), and the hardware samples
in tests/data/tensor_core_dumps (tests/test_mma_hardware.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic

from mpt.kernels.threads import one_thread

__all__ = ["magnitude_range", "decode_terms", "block_chain", "exact_chain", "mul_add_chain",
           "threads_for", "pow2_floor", "recip_pow2", "f32_bits", "f32_from_bits"]

_PARALLEL_WORK = 1 << 18  # products below which waking worker threads costs more than it saves

_EXP_MASK = 0x7FF0000000000000
_FRAC_MASK = (1 << 52) - 1
_RECIP_BITS = 0x7FE0000000000000  # bits(2^e) + bits(2^-e) for a normal power of two 2^e

TILE_I = 32   # output rows per task (block model)
TILE_J = 64   # output columns per task: 64 float64 = 8 AVX-512 vectors


def _bitcast(source, target):
    """An intrinsic: the ``target`` value whose IEEE bit pattern is the ``source`` value x (an
    LLVM bitcast between types of one width)."""
    def cast(typingctx, x):
        if x != source:
            return None

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))
        return target(source), codegen
    cast.__name__ = f"bitcast_{source}_{target}"
    return intrinsic(cast)


#: The IEEE bit pattern of a float64 as int64, and back; of a float32 as uint32, and back.
_as_bits = _bitcast(types.float64, types.int64)
_from_bits = _bitcast(types.int64, types.float64)
f32_bits = _bitcast(types.float32, types.uint32)
f32_from_bits = _bitcast(types.uint32, types.float32)


@njit(inline="always")
def pow2_floor(x):
    """2^floor(log2|x|) for a finite non-zero normal float64 (0 for ±0)."""
    return _from_bits(_as_bits(x) & _EXP_MASK)


@njit(inline="always")
def recip_pow2(p):
    """1/p, exactly, for p a power of two whose reciprocal is a normal float64."""
    return _from_bits(_RECIP_BITS - _as_bits(p))


def threads_for(work):
    """Run the kernels of a call of ``work`` products on one thread when it is small
    (:func:`mpt.kernels.threads.one_thread`); the bits never depend on it."""
    return one_thread(work < _PARALLEL_WORK)


@njit(cache=True)
def magnitude_range(x):
    """(all finite?, smallest non-zero |x| (inf if none), largest |x|) of a float32 array."""
    lo, hi = np.inf, 0.0
    for v in x.ravel():
        m = abs(np.float64(v))
        if not m < np.inf:
            return False, lo, hi
        if m != 0.0:
            lo = min(lo, m)
        hi = max(hi, m)
    return True, lo, hi


@njit(cache=True)
def decode_terms(x, emin_pow2, value, nominal):
    """Split exactly-decoded inputs into (value, nominal power of two) for the block model.

    x: (n,) float32 values of the input format; emin_pow2 = 2^emin of that format.
    value: (n,) out, x exactly. nominal: (n,) out, max(2^floor(log2|x|), emin_pow2) for finite
    non-zero x, 0 for zeros, Inf and NaN (they never set the anchor). Outputs are float64, or
    float32 for the fast path (exact: a power of two within float32's range there).
    """
    for i in range(x.size):
        v = np.float64(x[i])
        value[i] = v
        nominal[i] = max(pow2_floor(v), emin_pow2) if (v != 0.0 and abs(v) < np.inf) else 0.0


@njit(inline="always")
def _round_out(total, q, out_min_pow2, out_ulp, out_max, nearest):
    """Round the exact value total·q to the output format (see module docstring).

    out_min_pow2 = 2^emin_out, out_ulp = 2^-(p-1) for p significant bits, out_max = largest
    finite output; ``nearest`` selects RNE, else RZ. Overflow past out_max gives ±Inf (RZ-FP32
    reaches it only at 2^128, since the RZ result never exceeds the exact value); an exact zero
    total is +0; a non-zero total that rounds to zero keeps its sign.
    """
    v = total * q
    grid = max(pow2_floor(v), out_min_pow2) * out_ulp
    x = v * recip_pow2(grid)
    x = (np.rint(x) if nearest else np.trunc(x)) * grid
    x = x if abs(x) <= out_max else np.copysign(np.inf, x)
    x = x if abs(v) < np.inf else v
    return x if total != 0.0 else 0.0


@njit(inline="always")
def block_start(d, anchor, zero_pow2, out_min_pow2):
    """Step 5 begins: anchor = max(2^e_zero, nominal(c)) for each accumulator value c of d (W,)."""
    for w in range(d.shape[0]):
        c = d[w]
        nominal_c = max(pow2_floor(c), out_min_pow2) if (c != 0.0 and abs(c) < np.inf) else 0.0
        anchor[w] = max(nominal_c, zero_pow2)


@njit(inline="always")
def block_scale(d, anchor, scale, c_term, total, fraction_bits, scale_cap):
    """Steps 6 begin, once the anchor E is known: scale = 1/q = 2^F/E (capped, see block_chain),
    c's truncated term (float64: c may be Inf or NaN), products' total = 0."""
    two_f = 2.0 ** fraction_bits   # hoisted: a power inside the loop is a libm call per element
    for w in range(d.shape[0]):
        inv_q = recip_pow2(np.float64(anchor[w])) * two_f
        c_term[w] = np.trunc(d[w] * inv_q)
        scale[w] = min(inv_q, scale_cap)
        total[w] = 0


@njit(inline="always")
def block_finish(d, anchor, c_term, total, fraction_bits, out):
    """Steps 7-8: D = round_out((total + c_term)·q) into d (W,)."""
    ulp = 2.0 ** -fraction_bits
    for w in range(d.shape[0]):
        q = np.float64(anchor[w]) * ulp
        d[w] = _round_out(np.float64(total[w]) + c_term[w], q, out[0], out[1], out[2], out[3])


@njit(inline="always")
def _block_row(d, va, pa, vb, pb, kb, ke, j0, scratch, fraction_bits, zero_pow2, out):
    """One block [kb, ke) for one output row segment d (W,) in place (the accumulator c -> D).

    va, pa: (K,) this row of A (values, nominal powers of two); vb, pb: (K, N) all of B;
    j0: first column of d; scratch: (W,) float64 buffers anchor, scale, c_term and total.
    """
    anchor, scale, c_term, total = scratch
    w_n = d.shape[0]
    block_start(d, anchor, zero_pow2, out[0])
    k = kb
    while k + 4 <= ke:  # max is exact and associative: unroll k by 4
        p0, p1, p2, p3 = pa[k], pa[k + 1], pa[k + 2], pa[k + 3]
        b0, b1, b2, b3 = pb[k, j0:], pb[k + 1, j0:], pb[k + 2, j0:], pb[k + 3, j0:]
        for w in range(w_n):
            anchor[w] = max(max(anchor[w], max(p0 * b0[w], p1 * b1[w])),
                            max(p2 * b2[w], p3 * b3[w]))
        k += 4
    for k in range(k, ke):
        p0, b0 = pa[k], pb[k, j0:]
        for w in range(w_n):
            anchor[w] = max(anchor[w], p0 * b0[w])
    block_scale(d, anchor, scale, c_term, total, fraction_bits, np.inf)
    k = kb
    while k + 4 <= ke:  # integer-valued float64 sums below 2^53 are exact in any order
        v0, v1, v2, v3 = va[k], va[k + 1], va[k + 2], va[k + 3]
        b0, b1, b2, b3 = vb[k, j0:], vb[k + 1, j0:], vb[k + 2, j0:], vb[k + 3, j0:]
        for w in range(w_n):
            s = scale[w]
            total[w] += ((np.trunc(v0 * b0[w] * s) + np.trunc(v1 * b1[w] * s))
                         + (np.trunc(v2 * b2[w] * s) + np.trunc(v3 * b3[w] * s)))
        k += 4
    for k in range(k, ke):
        v0, b0 = va[k], vb[k, j0:]
        for w in range(w_n):
            total[w] += np.trunc(v0 * b0[w] * scale[w])
    block_finish(d, anchor, c_term, total, fraction_bits, out)


@njit(inline="always")
def tile_counts(m, n):
    """The number of TILE_I-row and TILE_J-column output tiles of an (M, N) output."""
    return (m + TILE_I - 1) // TILE_I, (n + TILE_J - 1) // TILE_J


@njit(inline="always")
def output_tile(t, nti, ntj, n):
    """Task ``t`` of the (batch, output tile) tasks: batch z, first row i0, first column j0 and
    the tile's width w_n (< TILE_J at the right edge)."""
    j0 = t % ntj * TILE_J
    return t // (nti * ntj), (t // ntj) % nti * TILE_I, j0, min(j0 + TILE_J, n) - j0


@njit(cache=True, parallel=True)
def block_chain(va, pa, vb, pb, acc, ia, ib, k0, k1, block, fraction_bits, zero_pow2, out):
    """Chain blocks of ``block`` products over k in [k0, k1), in increasing k, into acc.

    va, pa: (Ba, M, K) float64 from :func:`decode_terms`; vb, pb: (Bb, K, N) likewise.
    acc: (B, M, N) float64, in: c (values of the output format), out: D. Batch z uses A[ia[z]]
    and B[ib[z]]. Each block's result is rounded to the output format and is the next block's c.
    Parameters are the spec's: F = fraction_bits, 2^e_zero = zero_pow2, and the output format
    ``out`` = (2^emin, 2^-(p-1), max finite, round to nearest?).

    This is the general path (any inputs, specials included). Finite operands in a window of
    exponents, with block·2^(F+2) <= 2^31, take the register-blocked kernels of
    ``mpt.kernels.block_gemm`` instead (float32/int32 lanes; exactness argued there). Other
    finite operands whose non-zero products have magnitudes in [2^-60, 2^60] (Blackwell's
    f8f6f4 blocks of 32 with F = 25, the scale-folded block-scaled operands) take
    ``mpt.kernels.gemm.block_chain_packed`` (16 float32/int32 lanes), exact for the same reasons
    plus: a product of two values of at most 11 significant bits is exact in float32 and its
    nominal product (> |a·b|/4 >= 2^-62) is a normal float32; a block with a non-zero product
    then has E >= 2^-62 and a scale 2^(F-E) <= 2^87, so capping the scale at 2^88 (finite in
    float32) only touches blocks whose products are all 0; scaling by a power of two is exact
    or underflows below 1, where truncation gives 0 anyway; and each truncated term is an
    integer below 2^(F+2), so int32 holds the sum of 2^(29-F) of them (c's term and the sum of
    a longer block's partial sums stay in float64).
    Tasks are (batch, 32x64 output tiles); each output element is computed by one thread in a
    fixed order, so the bits do not depend on threads.
    """
    nb, m, n = acc.shape
    nti, ntj = tile_counts(m, n)
    for t in prange(nb * nti * ntj):
        z, i0, j0, w_n = output_tile(t, nti, ntj, n)
        scratch = (np.empty(w_n), np.empty(w_n), np.empty(w_n), np.empty(w_n))
        a_v, a_p, b_v, b_p = va[ia[z]], pa[ia[z]], vb[ib[z]], pb[ib[z]]
        for kb in range(k0, k1, block):
            ke = min(kb + block, k1)
            for i in range(i0, min(i0 + TILE_I, m)):
                _block_row(acc[z, i, j0:j0 + w_n], a_v[i], a_p[i], b_v, b_p, kb, ke, j0, scratch,
                           fraction_bits, zero_pow2, out)


# ---- exact dot product: a long fixed-point accumulator ("Kulisch") -----------------------------
# The products of two float32 values are exact float64 numbers that are integer multiples of
# 2^-298 and below 2^256; with K < 2^31 terms the sum stays below 2^288. 22 limbs of 32 bits from
# 2^-352 (a float64 significand, 53 bits, of a value >= 2^-298 starts at or above 2^-350) to 2^352
# hold every sum exactly; each int64 limb takes 2^31 additions of a 32-bit piece before it could
# overflow, and carries are only propagated at the end.
_LIMBS = 22
_LIMB_LSB = -352


@njit(inline="always")
def _limbs_add(limbs, x):
    """limbs += x for a finite non-zero float64 x that is a multiple of 2^-352 and < 2^352."""
    bits = _as_bits(x)
    mant = (bits & _FRAC_MASK) | (1 << 52)            # normal float64: x = ±mant·2^(e - 1075)
    offset = ((bits >> 52) & 0x7FF) - 1075 - _LIMB_LSB
    j = offset >> 5
    r = offset & 31
    low = (mant & ((1 << (32 - r)) - 1)) << r         # below 2^32
    rest = mant >> (32 - r)                           # below 2^52
    sign = -1 if bits < 0 else 1
    limbs[j] += sign * low
    limbs[j + 1] += sign * (rest & 0xFFFFFFFF)
    limbs[j + 2] += sign * (rest >> 32)


@njit(inline="always")
def _limbs_normalise(limbs):
    """Propagate carries: limbs[0..-2] in [0, 2^32), the sign in the top limb."""
    for j in range(_LIMBS - 1):
        carry = limbs[j] >> 32
        limbs[j] -= carry << 32
        limbs[j + 1] += carry


@njit(inline="always")
def _limbs_bits(limbs, lo, count):
    """Bits [lo, lo + count) of a normalised non-negative accumulator, as an int (count <= 31)."""
    j = lo >> 5
    r = lo & 31
    x = limbs[j] >> r
    if j + 1 < _LIMBS:
        x |= limbs[j + 1] << (32 - r)
    return x & ((1 << count) - 1)


@njit(inline="always")
def _limbs_round(limbs, precision, emin, out_max):
    """Round the exact accumulator to nearest-even with ``precision`` bits, exponent >= emin.

    Returns the float64 value (±Inf past out_max; +0 for an exact zero).
    """
    _limbs_normalise(limbs)
    negative = limbs[_LIMBS - 1] < 0
    if negative:
        for j in range(_LIMBS):
            limbs[j] = -limbs[j]
        _limbs_normalise(limbs)
    top = -1
    for j in range(_LIMBS - 1, -1, -1):
        if limbs[j] != 0:
            width = 0
            while limbs[j] >> width:
                width += 1
            top = 32 * j + width - 1
            break
    if top < 0:
        return 0.0
    quantum = max(top + _LIMB_LSB, emin) - (precision - 1)   # exponent of the output ulp
    pos = quantum - _LIMB_LSB
    kept = _limbs_bits(limbs, pos, top - pos + 1) if top >= pos else 0
    half = _limbs_bits(limbs, pos - 1, 1)
    sticky = _limbs_bits(limbs, pos - 1 - (pos - 1) % 32, (pos - 1) % 32) != 0
    for j in range((pos - 1) // 32):
        sticky = sticky or limbs[j] != 0
    if half and (sticky or kept & 1):
        kept += 1
    x = kept * _from_bits(np.int64(quantum + 1023) << 52)
    x = x if x <= out_max else np.inf
    return -x if negative else x


@njit(cache=True, parallel=True)
def exact_chain(a, b, acc, ia, ib, k0, k1, precision, emin, out_max):
    """acc = RNE(acc + Σ_{k0<=k<k1} a_k·b_k) with ONE rounding: the exact dot product.

    a: (Ba, M, K) float32, b: (Bb, K, N) float32 (any format narrower than fp32, decoded),
    acc: (B, M, N) float64 holding values of the output format (``precision`` bits, ``emin``,
    largest finite ``out_max``). Specials as in the block model: a NaN operand, Inf·0 or
    +Inf with −Inf give NaN, otherwise an Inf term gives that Inf; an exact zero gives +0.
    One task per output row; results do not depend on threads.
    """
    nb, m, n = acc.shape
    for t in prange(nb * m):
        z, i = t // m, t % m
        limbs = np.zeros(_LIMBS, np.int64)
        a_row, b_mat = a[ia[z], i], b[ib[z]]
        for j in range(n):
            limbs[:] = 0
            c = acc[z, i, j]
            nan = c != c
            pos_inf = c == np.inf
            neg_inf = c == -np.inf
            if c != 0.0 and abs(c) < np.inf:
                _limbs_add(limbs, c)
            for k in range(k0, k1):
                p = np.float64(a_row[k]) * np.float64(b_mat[k, j])   # exact (48 bits)
                if p != 0.0 and abs(p) < np.inf:
                    _limbs_add(limbs, p)
                else:
                    nan = nan or p != p
                    pos_inf = pos_inf or p == np.inf
                    neg_inf = neg_inf or p == -np.inf
            if nan or (pos_inf and neg_inf):
                acc[z, i, j] = np.nan
            elif pos_inf or neg_inf:
                acc[z, i, j] = np.inf if pos_inf else -np.inf
            else:
                acc[z, i, j] = _limbs_round(limbs, precision, emin, out_max)


@njit(cache=True, parallel=True)
def mul_add_chain(a, b, acc, ia, ib, k0, k1):
    """acc = (…((acc + a_k0·b_k0) + a_k0+1·b_k0+1) …), every product and sum rounded to FP32 (RNE).

    a: (Ba, M, K) float32, b: (Bb, K, N) float32, acc: (B, M, N) float32 in/out. Numba does not
    contract ``x + y*z`` into an FMA without fastmath, so each operation rounds once (IEEE).
    Oracle: ``mpt.reference.mma.ieee_mul_add_reference``. One task per output row.
    """
    nb, m, n = acc.shape
    for t in prange(nb * m):
        z, i = t // m, t % m
        row, a_row, b_mat = acc[z, i], a[ia[z], i], b[ib[z]]
        for k in range(k0, k1):
            ak, b_k = a_row[k], b_mat[k]
            for j in range(n):
                row[j] = row[j] + ak * b_k[j]
