"""L1: fp16 and bf16 bit patterns to and from float32, exactly as IEEE conversion does.

The hot paths of the GEMM engines and the autograd storage widen fp16/bf16 operands to float32
(exact: every fp16 and bf16 value is a float32) and narrow float32 results back with
round-to-nearest-even. These kernels do it branch-free on bit views, so that their loops
vectorize; they equal ``mpt.round`` (narrowing) and ml_dtypes' casts (widening) bit for bit,
NaN payloads aside where the docstrings say. Tests: ``tests/test_mma_fast.py``.
"""
import numpy as np
from numba import njit

from mpt.kernels import readonly
from mpt.kernels.mma import f32_bits, f32_from_bits

__all__ = ["fp16_as_f32", "widen_fp16", "widen_bf16", "narrow_fp16", "narrow_bf16", "widen16",
           "narrow16", "canonical_nan"]


@njit(inline="always")
def fp16_as_f32(h):
    """The float32 bit pattern of the fp16 bit pattern h, exactly as IEEE conversion gives it
    (NaN payloads shifted up 13 bits). The magnitude bits moved up 13 places are the value times
    2^-112 for every finite fp16 (normal and subnormal), so one float32 multiply by 2^112
    rebiases it exactly; exponent field 31 (Inf, NaN) maps to 255. Branch-free, so that loops
    over it vectorize."""
    x = np.uint32(h)
    mag = np.uint32((x & np.uint32(0x7FFF)) << np.uint32(13))
    finite = f32_bits(f32_from_bits(mag) * np.float32(2.0**112))
    special = mag | np.uint32(0x70000000)            # exponent field 31 -> 255
    bits = special if (x & np.uint32(0x7C00)) == np.uint32(0x7C00) else finite
    return bits | ((x & np.uint32(0x8000)) << np.uint32(16))


@njit(cache=True)
def widen_fp16(h, out):
    """out = the float32 bit patterns of fp16 bit patterns h (both (n,), uint16/uint32):
    :func:`fp16_as_f32` of each."""
    for i in range(h.size):
        out[i] = fp16_as_f32(h[i])


@njit(cache=True)
def widen_bf16(h, out):
    """out = the float32 bit patterns of bf16 bit patterns h ((n,) uint16 -> (n,) uint32): the
    top half of a float32 (signalling NaNs stay as they are)."""
    for i in range(h.size):
        out[i] = np.uint32(h[i]) << np.uint32(16)


@njit(cache=True)
def narrow_fp16(x, out):
    """out = fp16 bit patterns of float32 bit patterns x ((n,) uint32 -> (n,) uint16), rounded
    to nearest-even, the IEEE conversion: a magnitude of at least 2^16 is Inf (or a NaN, whose
    payload keeps its top 10 bits, at least 1, as numpy's conversion does; ``mpt.round`` gives
    the quiet NaN 0x7E00 with the sign instead); below 2^-14 (fp16 subnormals) one float32
    addition of 2^-1 rounds at the grid of 2^-24 (the hardware's RNE), and the sum's low bits
    are the code; otherwise the exponent is rebiased and adding 0xFFF plus the kept parity bit
    carries exactly when the 13 dropped bits are above a tie, or a tie next to an odd value (a
    carry out of the fraction is the next binade, out of 65504 Inf). Branch-free, so that the
    loop vectorizes."""
    for i in range(x.size):
        b = x[i]
        mag = np.uint32(b & np.uint32(0x7FFFFFFF))
        sign = np.uint32((b >> np.uint32(16)) & np.uint32(0x8000))
        normal = (mag - np.uint32(0x38000000) + np.uint32(0xFFF) +
                  ((mag >> np.uint32(13)) & np.uint32(1))) >> np.uint32(13)
        tiny = f32_bits(f32_from_bits(mag) + np.float32(0.5)) - np.uint32(0x3F000000)
        nan = np.uint32(0x7C00) | max((mag >> np.uint32(13)) & np.uint32(0x3FF), np.uint32(1))
        big = nan if mag > np.uint32(0x7F800000) else np.uint32(0x7C00)
        code = tiny if mag < np.uint32(0x38800000) else normal
        out[i] = np.uint16(sign | (big if mag >= np.uint32(0x47800000) else code))


@njit(cache=True)
def narrow_bf16(x, out):
    """out = bf16 bit patterns of float32 bit patterns x ((n,) uint32 -> (n,) uint16), rounded
    to nearest-even: adding 0x7FFF plus the kept parity bit carries exactly when the dropped
    half is above a tie, or a tie next to an odd value (a carry out of the fraction is the next
    binade, out of the largest finite value Inf). NaNs give the quiet NaN 0x7FC0 with their
    sign, as ml_dtypes' cast and ``mpt.round`` do. Branch-free, so that the loop vectorizes."""
    for i in range(x.size):
        b = x[i]
        rounded = (b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        nan = (b & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
        out[i] = np.uint16(((b >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
                           if nan else rounded)


def _half(dtype) -> bool:
    """Whether ``dtype`` is float16 (True) or bfloat16 (False); TypeError for anything else."""
    dtype = np.dtype(dtype)
    if dtype == np.float16 or dtype.name == "bfloat16":
        return dtype == np.float16
    raise TypeError(f"expected a float16 or bfloat16 dtype; got {dtype}")


def widen16(x: np.ndarray) -> np.ndarray:
    """The float32 values of a float16 or bfloat16 array x (any layout), exactly, NaN payloads
    kept: :func:`widen_fp16` / :func:`widen_bf16`."""
    out = np.empty(x.shape, np.float32)
    (widen_fp16 if _half(x.dtype) else widen_bf16)(
        readonly(np.ascontiguousarray(x).reshape(-1).view(np.uint16)),
        out.reshape(-1).view(np.uint32))
    return out


def narrow16(x: np.ndarray, dtype) -> np.ndarray:
    """A float32 array x (any layout) rounded to nearest-even into float16 or bfloat16
    ``dtype``: :func:`narrow_fp16` / :func:`narrow_bf16`."""
    out = np.empty(x.shape, dtype)
    (narrow_fp16 if _half(dtype) else narrow_bf16)(
        np.ascontiguousarray(x).reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16))
    return out


@njit(cache=True)
def canonical_nan(bits):
    """Write the canonical NaN (sign 0, every other bit 1) over every NaN of the (n,) float32
    (uint32) or float16 (uint16) patterns ``bits``, in place: a NaN's magnitude bits exceed
    Inf's. Branch-free, so that the loop vectorizes."""
    wide = bits.itemsize == 4
    magnitude = bits.dtype.type(0x7FFFFFFF if wide else 0x7FFF)
    inf = bits.dtype.type(0x7F800000 if wide else 0x7C00)
    for i in range(bits.size):
        b = bits[i]
        bits[i] = magnitude if (b & magnitude) > inf else b
