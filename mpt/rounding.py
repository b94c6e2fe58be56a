"""L1 public API: round real numbers to any format, bit-exactly; decode any format exactly.

``mpt.round(x, fmt, mode)`` is the one place where a value becomes a low-precision number. Its
precision contract: the input (float32/float64, or any format dtype, decoded exactly first) is
rounded once, directly to ``fmt`` (float64 input never passes through float32), in ``mode``; the
result has ``fmt``'s storage dtype. The rules (ties, overflow, NaN, Inf, saturation, flushing,
stochastic rounding) are in :mod:`mpt.kernels.rounding`; the oracle is
:mod:`mpt.reference.rounding`, and round-to-nearest-even equals ml_dtypes/numpy ``astype`` bit for
bit for float32 input (ml_dtypes' float64 casts to bf16/fp8 round twice through float32; mpt
does not).
"""
import numpy as np

from mpt._checks import check_bool
from mpt.formats import UNSIGNED, Format, RoundingMode, get_format, rounding_mode
from mpt.kernels import rounding as K
from mpt.kernels.random import split64

__all__ = ["round", "decode", "SPECIALISE_MIN", "PARALLEL_MIN"]

#: Arrays at least this long run the kernel compiled for their format (a compilation of about
#: two seconds the first time, then cached on disk); shorter ones run the generic kernel.
SPECIALISE_MIN = 1 << 14
#: Arrays shorter than this run on the calling thread: waking Numba's workers costs more.
PARALLEL_MIN = 1 << 16



def _code_dtype(fmt: Format):
    """Unsigned dtype holding one code (fp6/fp4/int4 codes sit in the low bits of a byte; codes of
    float32-stored formats in a uint32, where they are decoded in place)."""
    bits = 32 if _float32_stored(fmt) else fmt.bits
    return next(d for width, d in UNSIGNED.items() if bits <= 8 * width)


def _float32_stored(fmt: Format):
    """tf32 and custom formats: values stored as float32, not as their own code."""
    return np.dtype(fmt.dtype) == np.float32 and fmt.name != "fp32"


def _as_float_array(x, name="x"):
    """``x`` as a float32/float64 ndarray; other format dtypes are decoded exactly to float32."""
    if isinstance(x, (bool, np.bool_, int, np.integer)):
        raise TypeError(f"{name} must be a float array or scalar (float32, float64 or a format "
                        f"dtype); got {type(x).__name__}")
    arr = np.asarray(x)
    if arr.dtype in (np.float32, np.float64):
        return arr
    try:
        fmt = get_format(arr.dtype)
    except (TypeError, ValueError):
        fmt = None
    if fmt is None or fmt.kind != "float":
        raise TypeError(f"{name} must be a float array or scalar (float32, float64 or a format "
                        f"dtype); got dtype {arr.dtype}")
    return decode(arr)


def _check_random(mode, x_shape, seed, stream, random_bits):
    """Validate the stochastic-rounding arguments against ``mode``."""
    if mode is not RoundingMode.STOCHASTIC:
        for name, value in (("seed", seed), ("stream", stream), ("random_bits", random_bits)):
            if value is not None:
                raise ValueError(f"{name} is only used by mode='stochastic'; "
                                 f"got mode={mode.value!r}")
        return
    if (seed is None) == (random_bits is None):
        raise ValueError("mode='stochastic' needs exactly one of seed (the Philox key) or "
                         "random_bits (a uint32 array of x's shape)")
    if random_bits is None:
        return
    if stream is not None:
        raise ValueError("stream is only used with seed, not with random_bits")
    if not isinstance(random_bits, np.ndarray) or random_bits.dtype != np.uint32:
        got = getattr(random_bits, "dtype", type(random_bits).__name__)
        raise TypeError(f"random_bits must be a uint32 ndarray of x's shape {x_shape}; got {got}")
    if random_bits.shape != x_shape:
        raise ValueError(f"random_bits must have x's shape {x_shape}; got {random_bits.shape}")


def _widen(x):
    """x as float64: exact (a signalling NaN only raises the invalid flag: it stays a NaN)."""
    with np.errstate(invalid="ignore"):
        return x.astype(np.float64)


def _round_fp64(x, saturate, subnormals):
    """fp64 target: the value is already exact; only the saturate/flush options change it."""
    fmt = get_format("fp64")
    out = _widen(x)
    if not subnormals:
        out = np.where(np.abs(out) < fmt.min_normal, np.copysign(0.0, out), out)
    if saturate:
        out = np.where(np.isinf(out), np.copysign(fmt.max, out), out)
    return out


def _round_codes(src, fmt, mode, saturate, subnormals, seed, stream, random_bits):
    """Codes (a ``_code_dtype`` array of src's shape) of the rounded values of float array src;
    for float32-stored formats, the float32 bits of the values."""
    if not K.direct_source(fmt, src.dtype):
        src = _widen(src)
    flat = np.ascontiguousarray(src).reshape(-1)                   # (n,)
    bits = flat.view(np.uint32 if flat.dtype == np.float32 else np.uint64)
    sp = K.round_spec(fmt, flat.dtype, saturate=saturate, subnormals=subnormals)
    stochastic = mode is RoundingMode.STOCHASTIC
    key = None if random_bits is not None or not stochastic else \
        (split64(seed, "seed"), split64(0 if stream is None else stream, "stream"))
    if flat.size >= SPECIALISE_MIN and random_bits is None:  # compiled for this format
        codes = np.empty(flat.size, _code_dtype(fmt))              # (n,)
        dp = K.decode_spec(fmt, np.float32) if _float32_stored(fmt) else None  # fused decode
        serial, parallel = K.specialised(sp, K.SR if stochastic else K.MODE_CODES[mode.value], dp)
        if stochastic and flat.size < PARALLEL_MIN:
            serial(bits, codes, *key, 0)
        elif stochastic:
            parallel(bits, codes, *key)
        else:
            (serial if flat.size < PARALLEL_MIN else parallel)(bits, codes)
        return codes.reshape(src.shape)
    # the generic kernels take one signature, uint64 words in and out (one compilation each)
    bits, codes = bits.astype(np.uint64), np.empty(flat.size, np.uint64)  # (n,), (n,)
    serial = flat.size < PARALLEL_MIN
    if not stochastic:
        (K.round_run if serial else K.round_bits)(bits, codes, sp, K.MODE_CODES[mode.value])
    elif random_bits is not None:
        words = np.ascontiguousarray(random_bits).reshape(-1)      # (n,)
        (K.round_run_words if serial else K.round_bits_words)(bits, words, codes, sp)
    elif serial:
        K.round_run_philox(bits, codes, sp, *key, 0)
    else:
        K.round_bits_philox(bits, codes, sp, *key)
    codes = codes.astype(_code_dtype(fmt))                         # exact: codes fit
    if _float32_stored(fmt):
        K.decode_bits(codes, codes, K.decode_spec(fmt, np.float32))  # in place: code -> bits
    return codes.reshape(src.shape)


def round(x, fmt, mode="nearest_even", *, saturate=False, subnormals=True, seed=None,
          stream=None, random_bits=None):
    """Round ``x`` to format ``fmt`` in ``mode``; returns an array of ``fmt``'s dtype.

    x: float32/float64 array or scalar, or an array of any float format dtype (decoded exactly).
    fmt: a Format or name (``mpt.get_format``; None is refused, it does not mean fp64).
    mode: ``nearest_even`` (default), ``nearest_away``, ``toward_zero``, ``up``, ``down``,
    ``stochastic``.
    saturate (a bool): overflow and Inf give ±max instead of Inf/NaN. subnormals=False (a bool):
    results that would be subnormal become zero of the same sign (rounded first, then flushed).
    stochastic rounding takes either ``seed`` (64-bit Philox key; word i of stream ``stream``, 0 by
    default, rounds element i in C order, so results do not depend on threads) or ``random_bits``
    (uint32, x's shape: what a hardware SR unit is fed).
    Integer formats round in ``mode`` at the units place, then clamp to [lowest, max]; NaN input
    is an error. Custom formats and tf32 return float32 values. Scalars in, NumPy scalars out.
    """
    fmt = get_format(fmt)
    if fmt.kind not in ("float", "int"):
        raise ValueError(f"fmt {fmt.name} is a {fmt.kind} format, not a float or integer grid: "
                         "quantize to it with mpt.quant")
    mode = rounding_mode(mode)
    saturate = check_bool("saturate", saturate)
    subnormals = check_bool("subnormals", subnormals)
    arr = _as_float_array(x)
    _check_random(mode, arr.shape, seed, stream, random_bits)
    if fmt.name == "fp64":
        out = _round_fp64(arr, saturate, subnormals)
        return out[()] if out.ndim == 0 else out
    no_nan_code = fmt.kind == "int" or (fmt.custom and fmt.nan == "ieee" and fmt.mantissa_bits == 0)
    if no_nan_code and np.isnan(arr).any():
        raise ValueError(f"x contains NaN, which format {fmt.name} cannot encode")
    out = _round_codes(arr, fmt, mode, saturate, subnormals, seed, stream, random_bits)
    out = out.view(fmt.dtype)
    return out[()] if out.ndim == 0 else out


def decode(x, dtype=np.float32):
    """The exact values of ``x`` (an array of any format dtype) as ``dtype`` (float32/float64).

    Every format but fp64 embeds exactly in float32 (fp64 needs ``dtype=np.float64``, and fp64
    input always decodes to float64). NaN codes give the canonical quiet NaN with the code's sign
    bit (fnuz's single NaN, 0x80, decodes to -NaN and e8m0's 0xFF to +NaN, as ml_dtypes);
    float32-stored formats (tf32, custom) are returned as float32 values unchanged.
    Oracle: ``mpt.reference.rounding.decode_exact``.
    """
    arr = np.asarray(x)
    dtype = np.dtype(dtype) if dtype is not None else None  # np.dtype(None) would be float64
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64; got {dtype}")
    try:
        fmt = get_format(arr.dtype)
    except (TypeError, ValueError):
        raise TypeError(f"x must be an array of a format dtype; got dtype {arr.dtype}") from None
    if fmt.kind == "int" or fmt.name in ("fp32", "fp64"):
        return arr.astype(np.float64 if fmt.name == "fp64" else dtype)  # exact
    flat = np.ascontiguousarray(arr).reshape(-1).view(_code_dtype(fmt))  # (n,)
    out = np.empty(flat.size, np.uint32 if dtype == np.float32 else np.uint64)
    K.decode_bits(flat, out, K.decode_spec(fmt, dtype))
    return out.view(dtype).reshape(arr.shape)

