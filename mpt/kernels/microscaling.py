"""L1: block-scale codes of the microscaling formats, from float32 bit patterns.

One kernel turns the float32 ``amax`` of each block into its E8M0 scale code (a biased power of
two, 0x00 = 2^-127 ... 0xFE = 2^127, 0xFF = NaN) under one of three named rules. With
``emax`` the exponent of the element format's largest binade (e4m3: 8, e5m2: 15, e2m3: 2,
e3m2: 4, e2m1: 2, MXINT8: 0) and ``floor_log2`` read from the bits (float32 subnormals
included):

``OCP``   OCP Microscaling v1.0's sample algorithm: exponent floor(log2 amax) − emax, clamped to
          [−127, 127]; amax = 0 gives 0x00; a non-finite amax (the block holds Inf or NaN: the
          amax propagates them) gives 0xFF.
``TRN``   Trainium3's ``nki.isa.quantize_mx`` (documented): a scale twice OCP's, exponent
          floor(log2 amax) − emax + 1, same clamp and specials.
``TE``    Transformer Engine's MXFP8 rule (``ptx::float_to_e8m0`` applied to
          ``amax · Quantized_Limits::max_norm_rcp``): the argument is the float32 product
          ``val = fl32(amax · fl32(1/fmt_max))``, computed by the caller, and the code is val's
          exponent rounded **up** (``cvt.rp.satfinite.ue8m0x2.f32``): the biased exponent field
          of val, plus one when val has a non-zero fraction, except that 0xFE stays 0xFE
          (satfinite) and a subnormal val <= 2^-127 stays 0x00. val = 0 gives 0x00, Inf 0xFE,
          NaN 0xFF.

Oracle: ``mpt.reference.microscaling`` (exact rationals). Tests: ``tests/test_microscaling.py``.
"""
import numpy as np
from numba import njit

__all__ = ["OCP", "TRN", "TE", "SCALE_RULE_CODES", "e8m0_codes"]

OCP, TRN, TE = 0, 1, 2
SCALE_RULE_CODES = {"ocp": OCP, "trainium": TRN, "te": TE}

_EXP_MASK = 0x7F800000
_FRAC_MASK = 0x007FFFFF


@njit(cache=True, inline="always")
def _floor_log2(bits):
    """floor(log2 v) of a finite non-zero float32 with bit pattern ``bits`` (sign ignored)."""
    field = (bits & _EXP_MASK) >> 23
    if field != 0:
        return field - 127
    frac = bits & _FRAC_MASK
    p = 0
    while frac >> (p + 1):
        p += 1
    return p - 149                              # a subnormal: frac·2^-149


@njit(cache=True, inline="always")
def _te_code(bits):
    """``cvt.rp.satfinite.ue8m0`` of the non-negative float32 ``bits`` (see module docstring)."""
    field = (bits & _EXP_MASK) >> 23
    frac = bits & _FRAC_MASK
    if field == 0xFF:
        return 0xFF if frac != 0 else 0xFE      # NaN, Inf (satfinite)
    if frac != 0 and field != 0xFE and not (field == 0 and frac <= 0x400000):
        field += 1                              # round the exponent up
    return field


@njit(cache=True)
def e8m0_codes(amax, rule, emax, out):
    """out[i] = E8M0 code of block amax[i] under ``rule`` (OCP, TRN or TE; see above).

    amax: (n,) uint32 bit patterns of non-negative float32 values (for TE: of
    ``fl32(amax · fl32(1/fmt_max))``); emax: the element format's largest exponent (OCP, TRN);
    out: (n,) uint8.
    """
    for i in range(amax.size):
        bits = np.int64(amax[i]) & 0x7FFFFFFF
        if rule == TE:
            out[i] = _te_code(bits)
        elif (bits & _EXP_MASK) == _EXP_MASK:
            out[i] = 0xFF                       # Inf or NaN in the block
        elif bits == 0:
            out[i] = 0                          # an all-zero block: the smallest scale
        else:
            e = _floor_log2(bits) - emax + (1 if rule == TRN else 0)
            out[i] = min(max(e, -127), 127) + 127
