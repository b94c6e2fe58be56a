"""L1: exact rounding of float32/float64 bit patterns to any format, and exact decoding.

Everything is integer arithmetic on bit views (Numba cannot type ml_dtypes dtypes): a source word
``b`` (uint32 for float32, uint64 for float64) becomes the code of the target format (uint8/16/32;
float32-stored formats -- tf32, custom -- get their code decoded to float32 bits by
:func:`decode_bits`). Each input is rounded once, directly to the target: float64 input never
passes through float32.

Rounding a finite magnitude ``|x|`` (source magnitude bits ``a``, sign ``s``) to a format with
``M`` fraction bits, smallest normal exponent ``emin``, source fraction bits ``SM``:

  normal path      code = ((a + addend(a, d0)) >> d0) - rebias,   d0 = SM - M >= 1
                   rounding the source *pattern* at bit d0 is exact: a carry out of the fraction
                   lands in the exponent field, which is the next binade's first number;
                   ``rebias`` moves the exponent field from the source's bias to the target's.
  subnormal path   for |x| below the target's min normal (only needed when the target's emin is
                   above the source's): with ``sig`` the significand (hidden bit included) and
                   E the exponent of |x|, code = (sig + addend(sig, d)) >> d, d = d0 + emin - E:
                   the result counts units of the min subnormal, and a carry to 2^M is min normal.

``addend(v, d)`` is what to add before dropping the low ``d`` bits of ``v`` (:func:`_round_shift`):
  nearest_even  2^(d-1) - 1 + (parity of the kept significand): ties go to the even one; with
                M = 0 (e8m0) a normal binade's significand is 1, so ties go up (ml_dtypes
                0.6+ too; 0.5 sends them to the even code)
  nearest_away  2^(d-1)
  toward_zero   0
  up / down     2^d - 1 for positive / negative values, else 0
  stochastic    the top k = min(r, d) bits of the 32-bit random word, placed just below the kept
                bits (``r = rbits``, 32 by default). Over all 2^r values of those bits the
                magnitude rounds away from zero for exactly floor(rem * 2^(r-d)) of them (``rem``
                the d discarded bits), so when d <= r the mean of the results is exactly x; when
                d > r the discarded bits below the top r are ignored: the mean is biased toward
                zero by less than 2^-r units in the last place.

Then, per format: subnormal results flush to signed zero when ``flush`` (round first, then flush);
a result above max overflows to the format's Inf (its NaN without Inf: e4m3fn/fnuz/e8m0; ±max for
fp6/fp4, as ml_dtypes) where IEEE 754 overflows to infinity -- nearest and stochastic modes, up for
positive and down for negative values -- and to ±max otherwise or when ``saturate``; Inf inputs map
to the same overflow code (±max when ``saturate``, as PTX ``.satfinite``); NaN inputs to the
format's canonical NaN (sign kept where the format has signed NaNs; fp6/fp4 have none: ml_dtypes
gives the zero with the opposite sign bit, reproduced here); e8m0 has neither zero nor sign: zero,
negative inputs and NaN give NaN (0xFF), results below 2^-127 give 2^-127. Integer formats round
with the mode at the units place and clamp to [lowest, max] (Inf included).

Two ways to run the same element code: the drivers below take the RoundSpec at run time (one
compilation per array dtype); :func:`specialised` freezes spec and mode as constants (compiled per
format, mode and options, cached on disk), several times faster: worth it for large arrays.

Oracles: ``mpt.reference.rounding`` (exact rationals, and a float64-vectorised version for
exhaustive domains). Tests: ``tests/test_rounding*.py``.
"""
import functools
from collections import namedtuple

import numpy as np
from numba import njit, prange

from mpt.kernels.random import BLOCK, CHUNK, fill_words

__all__ = [
    "RNE", "RNA", "RZ", "RU", "RD", "SR", "MODE_CODES",
    "RoundSpec", "DecodeSpec", "round_spec", "decode_spec", "direct_source",
    "round_bits", "round_bits_words", "round_bits_philox", "specialised", "decode_bits",
]

RNE, RNA, RZ, RU, RD, SR = 0, 1, 2, 3, 4, 5
MODE_CODES = {"nearest_even": RNE, "nearest_away": RNA, "toward_zero": RZ, "up": RU, "down": RD,
              "stochastic": SR}

#: How a code of a format decodes to float32/float64 bits (all fields int64).
#: m, bias: fraction bits and bias; tsign: sign bit position (signed formats); signed: 0/1;
#: magmask: magnitude bits; all_normal: 1 when exponent field 0 is a normal binade (e8m0);
#: nan_lo..nan_hi: magnitudes that are NaN (empty range when none); inf_mag: magnitude of Inf (-1
#: when none); zero_nan: 1 when the code "sign bit alone" is NaN (fnuz); aligned: 1 for an IEEE
#: format with the output float's exponent field (bf16, tf32 to float32), whose magnitude bits
#: just shift up; out_m, out_bias, out_sign: the output float's fraction bits, bias, sign
#: position; out_nan, out_inf: its canonical NaN, Inf.
DecodeSpec = namedtuple("DecodeSpec", [
    "m", "bias", "tsign", "signed", "magmask", "all_normal", "nan_lo", "nan_hi", "inf_mag",
    "zero_nan", "aligned", "out_m", "out_bias", "out_sign", "out_nan", "out_inf",
])

#: Constants of one rounding (source float, target format, options), all int64 (Numba computes
#: in int64 anyway). Source: sm (fraction bits), sb (bias), s_sign (sign position),
#: s_abs (magnitude mask), s_frac (fraction mask), s_inf (magnitude of Inf). Target: m, emin,
#: rebias ((sb - bias) << m: source exponent field to target field), subpath (1 when the target's
#: normal range starts above the source's and it has a zero or subnormals), minnorm (source
#: magnitude bits of the target's min normal), dmax (largest shift: 62 keeps every shift defined
#: and still discards all of a 53-bit significand), maxmag (magnitude code
#: of max), tsign (sign position), negzero (has -0), unsigned (e8m0), nan_pos/nan_neg (codes for
#: +/-NaN input), ovf_pos/ovf_neg (codes for an Inf-like overflow or Inf input), saturate, flush,
#: is_int, int_lo, int_hi, code_mask (integers), aligned (1 for an IEEE target with the source's
#: exponent field and no saturate/flush: bf16, tf32; there Inf is the carry itself), rbits
#: (stochastic precision).
RoundSpec = namedtuple("RoundSpec", [
    "sm", "sb", "s_sign", "s_abs", "s_frac", "s_inf",
    "m", "emin", "rebias", "subpath", "minnorm", "dmax", "maxmag", "tsign", "negzero", "unsigned",
    "nan_pos", "nan_neg", "ovf_pos", "ovf_neg", "saturate", "flush", "is_int", "int_lo", "int_hi",
    "code_mask", "aligned", "rbits",
])


@njit(cache=True, inline="always")
def _round_shift(v, d, s, mode, word, sp, odd):
    """``v / 2^d`` rounded to an integer in ``mode`` (``v >= 0``, ``d >= 1``; see above).

    ``odd`` (0 or 1) is or-ed into the kept parity: with M = 0 the kept bits of a source pattern
    end in the exponent field, while the significand they stand for is 1, odd.

    ``word`` is None for the deterministic modes (pruned at compile time), else the random word.
    Shifts stay below 64: past ``dmax`` every bit of ``v`` is discarded either way, and the
    stochastic carry is computed from the top discarded bits instead of a 2^d-wide sum.
    """
    dc = min(d, sp.dmax)
    if word is not None:  # carry of (top k discarded bits) + (top k bits of the word), k <= d
        k = min(sp.rbits, d)
        top = (v & ((1 << dc) - 1)) >> min(d - k, 63)
        return (v >> dc) + ((top + (word >> (32 - k))) >> k)
    half = 1 << (dc - 1)
    add = half - 1 + (((v >> dc) | odd) & 1)          # nearest_even
    if mode == RNA:
        add = half
    if mode == RZ or (mode == RU and s == 1) or (mode == RD and s == 0):
        add = 0
    if (mode == RU and s == 0) or (mode == RD and s == 1):
        add = (1 << dc) - 1
    return (v + add) >> dc


@njit(cache=True, inline="always")
def _round_magnitude(a, s, sp, mode, word):
    """Magnitude code of |x| (source magnitude bits ``a``, sign ``s``), before specials."""
    d0 = sp.sm - sp.m
    mag = _round_shift(a, d0, s, mode, word, sp, int(sp.m == 0)) - sp.rebias
    # the subnormal path is computed for every element and selected: straight-line code vectorises
    ex = a >> sp.sm
    sig = (a & sp.s_frac) | (int(ex != 0) << sp.sm)
    sub = _round_shift(sig, d0 + sp.emin + sp.sb - max(ex, 1), s, mode, word, sp, 0)
    return sub if sp.subpath == 1 and a < sp.minnorm else mag


@njit(cache=True, inline="always")
def _round_code(b, sp, mode, word):
    """The target code of source word ``b`` (int64) in ``mode``; ``word``: None for a
    deterministic mode, the uint32 random word (as int64) for stochastic rounding."""
    s = (b >> sp.s_sign) & 1
    a = b & sp.s_abs
    mag = _round_magnitude(a, s, sp, mode, word)
    int_code = min(max(-mag if s == 1 else mag, sp.int_lo), sp.int_hi) & sp.code_mask
    if sp.flush == 1 and mag < (1 << sp.m):
        mag = 0
    mag = max(mag, 0)                                      # e8m0: below 2^-127 -> 2^-127
    code = ((s & (sp.negzero | int(mag != 0))) << sp.tsign) | mag  # fnuz: no -0
    signed_max = (s << sp.tsign) | sp.maxmag
    inf_code = sp.ovf_neg if s == 1 else sp.ovf_pos
    inf_like = sp.saturate == 0 and (mode == RNE or mode == RNA or word is not None
                                     or (mode == RU and s == 0) or (mode == RD and s == 1))
    if mag > sp.maxmag:
        code = inf_code if inf_like else signed_max
    if a == sp.s_inf:
        code = signed_max if sp.saturate == 1 else inf_code
    if a > sp.s_inf:
        code = sp.nan_neg if s == 1 else sp.nan_pos
    if sp.unsigned == 1 and (s == 1 or a == 0):
        code = sp.nan_pos
    if sp.aligned == 1:  # the carry of the normal path already gives Inf where IEEE wants it
        code = (sp.nan_neg if s == 1 else sp.nan_pos) if a > sp.s_inf else (s << sp.tsign) | mag
    return int_code if sp.is_int == 1 else code  # integers: two's complement, clamped


@njit(cache=True, inline="always")
def _msb(x):
    """Position of the highest set bit of 0 < x < 2^32 (branch-free binary search)."""
    p = np.int64(0)
    for k in (16, 8, 4, 2, 1):
        t = x >> k
        c = np.int64(t != 0)
        p += c * k
        x = t if c == 1 else x
    return p


@njit(cache=True, inline="always")
def _decode_one(code, dp):
    """Float bits (float32 or float64 per ``dp``) of the exact value of one ``code``."""
    s = (code >> dp.tsign) & dp.signed
    mag = code & dp.magmask
    e = mag >> dp.m
    normal = e != 0 or dp.all_normal == 1
    sig = (mag & ((np.int64(1) << dp.m) - 1)) | (np.int64(normal) << dp.m)
    k = max(e, 1 - dp.all_normal) - dp.bias - dp.m     # exponent of the last place
    p = _msb(sig)
    out_emin = 1 - dp.out_bias
    if k + p >= out_emin:
        bits = ((k + p + dp.out_bias) << dp.out_m) | ((sig - (np.int64(1) << p)) << (dp.out_m - p))
    else:  # a subnormal of the output float (e8m0's 2^-127, some custom formats)
        bits = sig << (k - out_emin + dp.out_m)
    if sig == 0:
        bits = np.int64(0)
    if mag == dp.inf_mag:
        bits = dp.out_inf
    if dp.aligned == 1:  # same exponent field: every code (subnormals, Inf) shifts up
        bits = mag << (dp.out_m - dp.m)
    if dp.nan_lo <= mag <= dp.nan_hi or (dp.zero_nan == 1 and s == 1 and mag == 0):
        bits = dp.out_nan
    return (s << dp.out_sign) | bits


@njit(cache=True, inline="always")
def _chunk(t, n):
    """Bounds [lo, hi) of parallel task ``t`` over ``n`` elements."""
    lo = t * CHUNK
    return lo, min(n, lo + CHUNK)


@njit(cache=True)
def round_run(x, o, sp, mode):
    """One task: o[i] = code of x[i] in a deterministic mode. Called from the parallel loops
    (kept out of line: a small parallel body compiles much faster) and, alone, for short arrays
    (waking worker threads costs more than it saves)."""
    for i in range(x.size):
        o[i] = _round_code(np.int64(x[i]), sp, mode, None)


@njit(cache=True)
def round_run_words(x, w, o, sp):
    """One task of stochastic rounding with the words w."""
    for i in range(x.size):
        o[i] = _round_code(np.int64(x[i]), sp, SR, np.int64(w[i]))


@njit(cache=True)
def round_run_philox(x, o, sp, key, stream, first_block):
    """One task of stochastic rounding, x starting at element 4 * first_block of the stream."""
    w = np.empty(x.size, np.uint32)  # (task,) this task's words: generated, then consumed
    fill_words(w, key, stream, first_block)
    round_run_words(x, w, o, sp)


@njit(cache=True, parallel=True)
def round_bits(src, out, sp, mode):
    """out[i] = src[i] rounded in the deterministic ``mode`` (RNE..RD) to the code of ``sp``.

    src: (n,) uint32 (float32 bits) or uint64 (float64 bits); out: (n,) uint8/16/32/64;
    sp: :func:`round_spec`. Oracle: ``mpt.reference.rounding.round_exact``.
    """
    for t in prange((src.size + CHUNK - 1) // CHUNK):
        lo, hi = _chunk(t, src.size)
        round_run(src[lo:hi], out[lo:hi], sp, mode)


@njit(cache=True, parallel=True)
def round_bits_words(src, words, out, sp):
    """Stochastic rounding of src[i] with the explicit uint32 random word words[i] (shapes (n,))."""
    for t in prange((src.size + CHUNK - 1) // CHUNK):
        lo, hi = _chunk(t, src.size)
        round_run_words(src[lo:hi], words[lo:hi], out[lo:hi], sp)


@njit(cache=True, parallel=True)
def round_bits_philox(src, out, sp, key, stream):
    """Stochastic rounding of src[i] with word i of the Philox stream (key, stream) (split64 pairs).

    Equal to :func:`round_bits_words` fed ``mpt.kernels.random.random_words(seed, stream, n)``.
    """
    for t in prange((src.size + CHUNK - 1) // CHUNK):
        lo, hi = _chunk(t, src.size)
        round_run_philox(src[lo:hi], out[lo:hi], sp, key, stream, lo // BLOCK)


@njit(cache=True)
def _element(b, sp, mode, dp, decode):
    """One element of :func:`specialised`'s drivers. Compiled once (for the specs' types), it is
    inlined by LLVM into each driver, where the spec folds: ``inline="always"`` would copy its
    Numba IR into each driver instead, 4-5x the compile time, same machine code."""
    code = _round_code(b, sp, mode, None)
    return _decode_one(code, dp) if decode else code


@njit(cache=True)
def _element_sr(b, word, sp, dp, decode):
    """One element of the stochastic drivers (as :func:`_element`)."""
    code = _round_code(b, sp, SR, word)
    return _decode_one(code, dp) if decode else code


@njit(cache=True, inline="always")
def _round_into(x, o, sp, mode, dp, decode):
    """The deterministic drivers' loop."""
    for i in range(x.size):
        o[i] = _element(np.int64(x[i]), sp, mode, dp, decode)


@njit(cache=True, inline="always")
def _round_into_sr(x, o, sp, dp, decode, key, stream, first_block):
    """The stochastic drivers' loop, x from element 4 * first_block of the stream on."""
    w = np.empty(x.size, np.uint32)  # (task,)
    fill_words(w, key, stream, first_block)
    for i in range(x.size):
        o[i] = _element_sr(np.int64(x[i]), np.int64(w[i]), sp, dp, decode)


#: The DecodeSpec that :func:`specialised` freezes when it outputs codes (never read)
_NO_DECODE = DecodeSpec(*([0] * len(DecodeSpec._fields)))


@functools.lru_cache(maxsize=None)
def specialised(sp, mode, dp=None):
    """Drivers with ``sp``, ``mode`` (and ``dp``) frozen as compile-time constants (same bits).

    Returns ``(serial, parallel)``: for ``mode`` in RNE..RD ``serial(src, out)`` and
    ``parallel(src, out)`` (as :func:`round_run`, :func:`round_bits`); for SR
    ``serial(src, out, key, stream, 0)`` and ``parallel(src, out, key, stream)`` (as
    :func:`round_run_philox`, :func:`round_bits_philox`). With a DecodeSpec ``dp`` (float32-stored
    formats) ``out`` gets the float bits of the value (as :func:`decode_bits` after). Cached on
    disk by Numba per spec: they close over plain data only (a jitted function's pickle holds a
    per-process id: no cache hit in a new process).
    """
    decode, dp = dp is not None, _NO_DECODE if dp is None else dp
    if mode == SR:
        @njit(cache=True)
        def run_sr(x, o, key, stream, first_block):
            _round_into_sr(x, o, sp, dp, decode, key, stream, first_block)

        @njit(cache=True, parallel=True)
        def kernel_sr(src, out, key, stream):
            for t in prange((src.size + CHUNK - 1) // CHUNK):
                lo, hi = _chunk(t, src.size)
                _round_into_sr(src[lo:hi], out[lo:hi], sp, dp, decode, key, stream, lo // BLOCK)
        return run_sr, kernel_sr

    @njit(cache=True)
    def run(x, o):
        _round_into(x, o, sp, mode, dp, decode)

    @njit(cache=True, parallel=True)
    def kernel(src, out):
        for t in prange((src.size + CHUNK - 1) // CHUNK):
            lo, hi = _chunk(t, src.size)
            _round_into(src[lo:hi], out[lo:hi], sp, mode, dp, decode)
    return run, kernel


@njit(cache=True, parallel=True)
def decode_bits(codes, out, dp):
    """out[i] = float32/float64 bits (per ``dp``) of the exact value of codes[i]; shapes (n,)."""
    for t in prange((codes.size + CHUNK - 1) // CHUNK):
        lo, hi = _chunk(t, codes.size)
        c = codes[lo:hi]
        o = out[lo:hi]
        for i in range(hi - lo):
            o[i] = _decode_one(np.int64(c[i]), dp)


# ---- constants of a rounding, from the format table (Python side) ----------------------------
_SOURCES = {  # fraction bits, bias, sign position of the source floats
    np.dtype(np.float32): (23, 127, 31),
    np.dtype(np.float64): (52, 1023, 63),
}
_INT_POINT = 11  # integers round as a float whose last place is 2^0 for every |x| < 2^12


def _float_out(dtype):
    """(out_m, out_bias, out_sign, canonical NaN bits, Inf bits) of float32/float64."""
    m, bias, sign = _SOURCES[np.dtype(dtype)]
    inf = ((1 << (sign - m)) - 1) << m
    return m, bias, sign, inf | (1 << (m - 1)), inf


def decode_spec(fmt, out_dtype=np.float32):
    """DecodeSpec of a float format whose values are exact in ``out_dtype`` (mantissa_bits <= 23).
    """
    m, signed = fmt.mantissa_bits, int(fmt.signed)
    out_m, out_bias, out_sign, out_nan, out_inf = _float_out(out_dtype)
    magmask = (1 << (fmt.bits - signed)) - 1
    inf_mag = ((1 << fmt.exponent_bits) - 1) << m if fmt.nan == "ieee" else -1
    nan_range = {"ieee": (inf_mag + 1, magmask), "fn": (magmask, magmask),
                 "e8m0": (magmask, magmask)}.get(fmt.nan, (1, 0))  # (1, 0): no NaN magnitude
    return DecodeSpec(
        m=m, bias=fmt.bias, tsign=(fmt.bits - 1) * signed, signed=signed, magmask=magmask,
        all_normal=int(fmt.nan == "e8m0"), nan_lo=nan_range[0], nan_hi=nan_range[1],
        inf_mag=inf_mag, zero_nan=int(fmt.nan == "fnuz"),
        aligned=int(fmt.nan == "ieee" and fmt.bias == out_bias and m >= 1
                    and fmt.exponent_bits == out_sign - out_m), out_m=out_m, out_bias=out_bias,
        out_sign=out_sign, out_nan=out_nan, out_inf=out_inf,
    )


def _max_magnitude(fmt):
    """Magnitude code of the largest finite value."""
    fraction = int((fmt.max / 2.0**fmt.emax - 1) * 2**fmt.mantissa_bits)  # exact: short binary
    return ((fmt.emax + fmt.bias) << fmt.mantissa_bits) | fraction


def _special_codes(fmt, maxmag):
    """((nan_pos, nan_neg), (ovf_pos, ovf_neg)): codes for NaN input and Inf-like overflow."""
    m, t = fmt.mantissa_bits, fmt.bits - 1
    magmask = (1 << (fmt.bits - int(fmt.signed))) - 1
    sign = 1 << t
    if fmt.nan == "ieee":
        inf = ((1 << fmt.exponent_bits) - 1) << m
        nan = inf | (1 << max(m - 1, 0))  # m = 0 (custom only): no NaN code; handled as float32
        return (nan, sign | nan), (inf, sign | inf)
    if fmt.nan == "fn":
        return (magmask, sign | magmask), (magmask, sign | magmask)
    if fmt.nan == "fnuz":
        return (sign, sign), (sign, sign)
    if fmt.nan == "e8m0":
        return (magmask, magmask), (magmask, magmask)
    # "none" (fp6, fp4): no NaN; ml_dtypes gives the zero with the opposite sign; overflow saturates
    return (sign, 0), (maxmag, sign | maxmag)


def direct_source(fmt, src_dtype):
    """Whether ``src_dtype`` words can be rounded to ``fmt`` by the kernels without widening.

    Needs at least one discarded bit (M < SM) and a target emin no lower than the source's, so
    float32 feeds every format but fp32 itself, e8m0 and custom formats reaching below 2^-126
    or with 23 fraction bits; those take float64 (an exact widening). fp64 takes nothing.
    """
    sm, sb, _ = _SOURCES[np.dtype(src_dtype)]
    return fmt.kind == "int" or (fmt.mantissa_bits < sm and fmt.emin >= 1 - sb)


@functools.lru_cache(maxsize=None)
def round_spec(fmt, src_dtype, *, saturate=False, subnormals=True, rbits=32):
    """RoundSpec for rounding ``src_dtype`` (float32/float64) words to ``fmt`` (see RoundSpec).

    Cached: a spec is built once per (format, source dtype, options)."""
    if not direct_source(fmt, src_dtype):
        raise ValueError(f"{np.dtype(src_dtype)} words cannot be rounded to {fmt.name} directly")
    if not 1 <= rbits <= 32:
        raise ValueError(f"rbits must be in [1, 32]; got {rbits}")
    sm, sb, s_sign = _SOURCES[np.dtype(src_dtype)]
    spec = dict(sm=sm, sb=sb, s_sign=s_sign, s_abs=(1 << s_sign) - 1, s_frac=(1 << sm) - 1,
                s_inf=((1 << (s_sign - sm)) - 1) << sm, rbits=rbits, saturate=int(saturate),
                dmax=62)
    if fmt.kind == "int":  # a float whose last place is 2^0 below 2^_INT_POINT, clamped
        lo, hi = int(fmt.lowest), int(fmt.max)
        spec.update(m=_INT_POINT, emin=_INT_POINT, maxmag=hi, tsign=0, negzero=0, unsigned=0,
                    nan_pos=0, nan_neg=0, ovf_pos=0, ovf_neg=0, flush=0, is_int=1, int_lo=lo,
                    int_hi=hi, code_mask=(1 << fmt.bits) - 1, aligned=0)
        emin, has_zero = _INT_POINT, True
    else:
        maxmag = _max_magnitude(fmt)
        nan, ovf = _special_codes(fmt, maxmag)
        spec.update(m=fmt.mantissa_bits, emin=fmt.emin, maxmag=maxmag,
                    tsign=(fmt.bits - 1) * int(fmt.signed), negzero=int(fmt.negative_zero),
                    unsigned=int(not fmt.signed), nan_pos=nan[0], nan_neg=nan[1], ovf_pos=ovf[0],
                    ovf_neg=ovf[1], flush=int(not subnormals and fmt.subnormals), is_int=0,
                    int_lo=0, int_hi=0, code_mask=0)
        emin, has_zero = fmt.emin, fmt.has_zero
        spec["aligned"] = int(fmt.nan == "ieee" and fmt.exponent_bits == s_sign - sm
                              and fmt.bias == sb and not saturate and not spec["flush"])
    spec.update(rebias=(sb - (1 - emin)) << spec["m"] if has_zero else (sb + emin) << spec["m"],
                subpath=int(has_zero and emin > 1 - sb), minnorm=(emin + sb) << sm)
    return RoundSpec(**{k: np.int64(v) for k, v in spec.items()})
