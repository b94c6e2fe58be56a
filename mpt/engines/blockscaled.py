"""Block-scaled MMA: Blackwell's tcgen05 kind::mxf8f6f4 / mxf4 / mxf4nvf4 and RTX Blackwell's
``mma.sync.block_scale``, bit for bit (reference model: MMA-Sim, arXiv:2511.10909).

:func:`block_scaled_mma` computes D = (A ⊙ scale_a)·(B ⊙ scale_b) + C with the block scales
applied *inside* the instruction, chaining instructions in increasing k (each result, FP32, is
the next instruction's C):

- **kind "mxf8f6f4"** (K = 32 per instruction, one UE8M0 scale per 32 elements of A and of B):
  the block model of the Blackwell f8f6f4 MMA — one block of 32 exact products, each with
  nominal exponent e(a) + e(b) + e(sa) + e(sb), truncated to F = 25 fraction bits below the
  largest exponent of the products and C, added exactly, rounded toward zero to FP32. Elements
  e4m3/e5m2 (reference model); e2m1, e3m2 and e2m3 (mixable) follow the same rule with their
  own minimum exponent (label: assumption — MMA-Sim leaves them TODO).
- **kinds "mxf4" and "mxf4nvf4"** (K = 64; E2M1 elements): scales UE8M0 per 32 (mxf4,
  mxf4nvf4), UE8M0 per 16 or UE4M3 per 16 (mxf4nvf4; NVFP4), and on RTX Blackwell also UE4M3
  per 32. Each group of 16 products is summed exactly, times |sa|·|sb|, with exponent
  e(sa) + e(sb); the four group terms and C are aligned with F = 35 and rounded toward zero
  (:mod:`mpt.kernels.blockscaled`). The sign bit of a UE4M3 scale is ignored.
- **Specials**: a NaN scale, a NaN C or a NaN element gives the canonical NaN 0x7FFFFFFF; an Inf
  element (e5m2) gives that Inf (Inf·0 and +Inf with −Inf: NaN); an infinite C gives that Inf
  (assumption: MMA-Sim has no rule for it).
- **Zero rule** (``zero_rule``; open question, see ``mpt.mma``'s presets): ``"mpt"`` (default,
  assumption) — a zero product, a group with a zero scale and a zero C take the exponent
  e_zero = −133 of Blackwell's FP32-output block model, and a non-zero sum that rounds to zero
  keeps its sign; ``"mma_sim"`` (reference model) — every zero value (element, scale, C) has
  exponent −126, so a zero product has −126 + the partner's and the scales' exponents, and a
  zero result is +0.

Oracle: ``mpt.reference.microscaling.block_scaled_dot_reference``; MMA-Sim itself was run on
random and directed cases outside the repository (see tests/test_blockscaled.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt import rounding as _rounding
from mpt.formats import get_format
from mpt.kernels import blockscaled as _bs
from mpt.kernels import gemm as _gemm
from mpt.kernels import mma as _mma

__all__ = ["BlockScaledKind", "KINDS", "ARCHS", "ZERO_RULES", "block_scaled_mma"]

_F8F6F4 = ("fp8_e4m3fn", "fp8_e5m2", "fp6_e3m2fn", "fp6_e2m3fn", "fp4_e2m1fn")
_FLT_MAX = float.fromhex("0x1.fffffep+127")
_RZ_FP32 = (2.0**-126, 2.0**-23, _FLT_MAX, False)     # (2^emin, ulp, max, nearest?)
_E_ZERO = -133
ZERO_RULES = ("mpt", "mma_sim")
_SCALE_FORMATS = {"ue8m0": "e8m0", "e8m0": "e8m0", "ue4m3": "fp8_e4m3fn"}


@dataclass(frozen=True)
class BlockScaledKind:
    """One kind of block-scaled MMA: products per instruction ``k``, alignment width
    ``fraction_bits`` (F), element formats accepted for A and B (mixable), and whether its
    terms are single products ("product") or exact sums of 16 products ("group16")."""

    name: str
    k: int
    fraction_bits: int
    elements: tuple[str, ...]
    terms: str
    evidence: str


KINDS = {
    "mxf8f6f4": BlockScaledKind("mxf8f6f4", 32, 25, _F8F6F4, "product",
                                "reference model (e4m3/e5m2); assumption (e3m2/e2m3/e2m1)"),
    "mxf4": BlockScaledKind("mxf4", 64, 35, ("fp4_e2m1fn",), "group16", "reference model"),
    "mxf4nvf4": BlockScaledKind("mxf4nvf4", 64, 35, ("fp4_e2m1fn",), "group16", "reference model"),
}

#: (kind, scale format, block) -> PTX instruction, per architecture (MMA-Sim's isa tables).
ARCHS = {
    "blackwell": {
        ("mxf8f6f4", "ue8m0", 32): "tcgen05.mma.kind::mxf8f6f4.block_scale.scale_vec::1X",
        ("mxf4", "ue8m0", 32): "tcgen05.mma.kind::mxf4.block_scale.scale_vec::2X",
        ("mxf4nvf4", "ue8m0", 32): "tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::2X",
        ("mxf4nvf4", "ue8m0", 16): "tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::4X",
        ("mxf4nvf4", "ue4m3", 16): "tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::4X",
    },
    "rtx_blackwell": {
        ("mxf8f6f4", "ue8m0", 32): "mma.sync.block_scale m16n8k32 kind::mxf8f6f4 ue8m0",
        ("mxf4", "ue8m0", 32): "mma.sync.block_scale m16n8k64 kind::mxf4 ue8m0",
        ("mxf4nvf4", "ue8m0", 32): "mma.sync.block_scale m16n8k64 kind::mxf4nvf4 ue8m0 block32",
        ("mxf4nvf4", "ue8m0", 16): "mma.sync.block_scale m16n8k64 kind::mxf4nvf4 ue8m0 block16",
        ("mxf4nvf4", "ue4m3", 32): "mma.sync.block_scale m16n8k64 kind::mxf4nvf4 ue4m3 block32",
        ("mxf4nvf4", "ue4m3", 16): "mma.sync.block_scale m16n8k64 kind::mxf4nvf4 ue4m3 block16",
    },
}


def _choice(value, valid, name):
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}; got {value!r}")


def _format_of(x, arg, valid):
    try:
        name = get_format(x.dtype).name
    except (TypeError, ValueError):
        name = None
    if name not in valid:
        raise TypeError(f"{arg} must hold one of {', '.join(valid)} (their ml_dtypes dtypes); got "
                        f"dtype {x.dtype}")
    return name


def _batched(x, batch):
    """(x as contiguous (B', R, C), (B,) index of each broadcast batch element into it)."""
    flat = np.ascontiguousarray(x).reshape((int(np.prod(x.shape[:-2])),) + x.shape[-2:])
    index = np.arange(flat.shape[0]).reshape(x.shape[:-2])
    return flat, np.ascontiguousarray(np.broadcast_to(index, batch)).ravel()


def _terms(x32, emin, zero_rule):
    """(values, nominal powers of two) float64 of float32 values of a format with ``emin``;
    a zero's nominal is 0 (never the anchor) or, under MMA-Sim's rule, 2^-126."""
    value, nominal = np.empty(x32.shape), np.empty(x32.shape)
    _mma.decode_terms(np.ascontiguousarray(x32).ravel(), 2.0**emin, value.ravel(), nominal.ravel())
    if zero_rule == "mma_sim":
        nominal[value == 0] = 2.0**-126
    return value, nominal


def _check_args(a, b, scale_a, scale_b, c, kind, scale_format, block, arch, zero_rule):
    """Validate; returns (kind spec, element formats, scale format name, batch shape)."""
    _choice(kind, tuple(KINDS), "kind")
    _choice(arch, tuple(ARCHS), "arch")
    _choice(zero_rule, ZERO_RULES, "zero_rule")
    _choice(scale_format, tuple(_SCALE_FORMATS), "scale_format")
    canonical = "ue4m3" if scale_format == "ue4m3" else "ue8m0"
    combos = ARCHS[arch]
    if (kind, canonical, block) not in combos:
        valid = "; ".join(f"{k}/{s}/{b}" for k, s, b in combos)
        raise ValueError(f"{arch} has no kind={kind!r} with scale_format={scale_format!r} and "
                         f"block={block!r}; it has (kind/scale/block): {valid}")
    spec = KINDS[kind]
    for arg, x, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., K, N)")):
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            raise ValueError(f"{arg} must be an ndarray of shape {dims}; got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
    fa, fb = _format_of(a, "a", spec.elements), _format_of(b, "b", spec.elements)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.shape[-2] != k:
        raise ValueError(f"a (..., M, K) and b (..., K, N) disagree on K: {a.shape}, {b.shape}")
    if k % spec.k:
        raise ValueError(f"K must be a multiple of {spec.k} (one {kind} instruction); got {k}")
    sfmt = _SCALE_FORMATS[scale_format]
    batch_dims = [a.shape[:-2], b.shape[:-2]]
    for arg, s, x, rows, cols in (("scale_a", scale_a, a, m, k // block),
                                  ("scale_b", scale_b, b, k // block, n)):
        if not isinstance(s, np.ndarray) or s.dtype != get_format(sfmt).dtype:
            raise TypeError(f"{arg} must be an ndarray of {get_format(sfmt).dtype} "
                            f"({scale_format}); got {getattr(s, 'dtype', type(s).__name__)}")
        if s.shape != x.shape[:-2] + (rows, cols):
            raise ValueError(f"{arg} must have shape {x.shape[:-2] + (rows, cols)} (its "
                             f"operand's batch dimensions); got {s.shape}")
    if c is not None:
        if not isinstance(c, np.ndarray) or c.dtype != np.float32 or c.ndim < 2 \
                or c.shape[-2:] != (m, n):
            raise TypeError(f"c must be None or a float32 ndarray of shape (..., {m}, {n})")
        batch_dims.append(c.shape[:-2])
    try:
        batch = np.broadcast_shapes(*batch_dims)
    except ValueError:
        raise ValueError("the batch dimensions of a, b, scale_a, scale_b (and c) do not "
                         "broadcast") from None
    return spec, fa, fb, sfmt, batch


def _scale_terms(s, sfmt, zero_rule, repeat, axis):
    """(|values|, nominal powers of two) float64 of scale codes, repeated ``repeat`` times along
    ``axis`` (one entry per element or per group of 16); NaN codes: value NaN, nominal 0."""
    values = np.abs(_rounding.decode(s, np.float32))
    v, p = _terms(values, get_format(sfmt).emin, zero_rule)
    if repeat > 1:
        v, p = np.repeat(v, repeat, axis=axis), np.repeat(p, repeat, axis=axis)
    return v, p


def _scaled(x, fmt, sv, sp, block, along_rows, zero_nominal, dtype):
    """(values, nominal powers of two) of an operand with its E8M0 scales folded in."""
    value, nominal = np.empty(x.shape, dtype), np.empty(x.shape, dtype)
    _bs.scaled_terms(x, 2.0**get_format(fmt).emin, zero_nominal, sv, sp, block, along_rows,
                     value, nominal)
    return value, nominal


def _packable(a, b, sa, sb):
    """Whether the scale-folded operands meet the register kernel's conditions (those of
    ``mpt.kernels.gemm.block_chain_packed``): finite, within float32 (an element's last bit
    times 2^-127 is at least 2^-143, so they are then exact), every non-zero product within
    [2^-60, 2^60]. Bounds: |a·sa| over all blocks, from the elements' and scales' ranges."""
    ranges = []
    for x, s in ((a, sa), (b, sb)):
        finite, lo, hi = _mma.magnitude_range(x)
        s_finite, s_lo, s_hi = _mma.magnitude_range(s)
        if not (finite and s_finite) or hi * s_hi >= 2.0**127:
            return False
        ranges.append((lo * s_lo, hi * s_hi))
    (lo_a, hi_a), (lo_b, hi_b) = ranges
    return hi_a == 0 or hi_b == 0 or (lo_a * lo_b >= 2.0**-60 and hi_a * hi_b <= 2.0**60)


def _product_terms_chain(a, b, sa, sb, fa, fb, sfmt, block, zero_rule, acc, ia, ib, spec,
                         zero_pow2):
    """kind::mxf8f6f4: the block model on scale-folded operands; the register kernel
    (``product_chain_packed``) where its conditions hold, else ``mpt.kernels.mma.block_chain``.
    Returns the (B, M, N) float64 accumulator."""
    sav, sap = _scale_terms(sa, sfmt, zero_rule, 1, -1)            # (Ba, M, K/32)
    sbv, sbp = _scale_terms(sb, sfmt, zero_rule, 1, -2)            # (Bb, K/32, N)
    zero_nominal = 0.0 if zero_rule == "mpt" else 2.0**-126
    params = (spec.k, spec.fraction_bits, zero_pow2, _RZ_FP32)
    k = a.shape[-1]
    if zero_rule == "mpt" and _packable(a, b, sav, sbv):
        rows = _gemm.BLOCK_ROWS
        av, ap = _scaled(a, fa, sav, sap, block, False, zero_nominal, np.float32)
        bv, bp = _scaled(b, fb, sbv, sbp, block, True, zero_nominal, np.float32)
        a_p = [_gemm.pack_rows(x, rows) for x in (av, ap)]
        b_p = [_gemm.pack_cols(x) for x in (bv, bp)]
        m, n = acc.shape[1:]
        tiles = _gemm.pack_tiles(acc, rows)
        _bs.product_chain_packed(*a_p, *b_p, tiles, ia, ib, 0, k, *params)
        return np.ascontiguousarray(_gemm.unpack_tiles(tiles, rows, m, n))
    av, ap = _scaled(a, fa, sav, sap, block, False, zero_nominal, np.float64)
    bv, bp = _scaled(b, fb, sbv, sbp, block, True, zero_nominal, np.float64)
    _mma.block_chain(av, ap, bv, bp, acc, ia, ib, 0, k, *params)
    return acc


def block_scaled_mma(a, b, scale_a, scale_b, c=None, *, kind, scale_format, block,
                     arch="blackwell", zero_rule="mpt"):
    """D = A·B + C with block scales applied inside Blackwell's block-scaled MMA (see module).

    a: (..., M, K) element codes (ml_dtypes dtypes: float8_e4m3fn / float8_e5m2 / float6_* /
    float4_e2m1fn for mxf8f6f4, float4_e2m1fn for mxf4 and mxf4nvf4); b: (..., K, N).
    scale_a: a's batch dimensions + (M, K/block), scale_b: b's + (K/block, N) —
    ``float8_e8m0fnu`` codes for scale_format "ue8m0" (alias "e8m0"), ``float8_e4m3fn`` codes
    for "ue4m3" (sign ignored). c: (..., M, N) float32 or None (+0). The batch dimensions of a,
    b and c broadcast. K must be a multiple of the instruction's K (32 or 64); instructions are
    chained in increasing k, each result rounded toward zero to FP32 and fed back as the next C.
    ``arch``: "blackwell" (tcgen05) or "rtx_blackwell" (mma.sync.block_scale); ``zero_rule``:
    "mpt" or "mma_sim".
    Returns float32 (..., M, N) with canonical NaNs.
    """
    spec, fa, fb, sfmt, batch = _check_args(a, b, scale_a, scale_b, c, kind, scale_format, block,
                                            arch, zero_rule)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    a_flat, ia = _batched(a.astype(np.float32), batch)              # (Ba, M, K)
    b_flat, ib = _batched(b.astype(np.float32), batch)              # (Bb, K, N)
    sa_flat, sb_flat = _batched(scale_a, batch)[0], _batched(scale_b, batch)[0]
    acc = np.zeros((ia.size, m, n))                                 # (B, M, N)
    if c is not None:
        acc[:] = np.broadcast_to(c, batch + (m, n)).reshape(-1, m, n)
    zero_pow2 = 2.0 ** (_E_ZERO if zero_rule == "mpt" else -126)
    with np.errstate(invalid="ignore", over="ignore"), _mma.threads_for(ia.size * m * n * k):
        if spec.terms == "product":
            acc = _product_terms_chain(a_flat, b_flat, sa_flat, sb_flat, fa, fb, sfmt, block,
                                       zero_rule, acc, ia, ib, spec, zero_pow2)
        else:
            per = block // _bs.GROUP
            sav, sap = _scale_terms(sa_flat, sfmt, zero_rule, per, -1)     # (Ba, M, K/16)
            sbv, sbp = _scale_terms(sb_flat, sfmt, zero_rule, per, -2)     # (Bb, K/16, N)
            _bs.group_chain(a_flat, b_flat, sav, sap, sbv, sbp, acc, ia, ib, 0, k,
                            spec.fraction_bits, zero_pow2, _RZ_FP32)
        d = acc.astype(np.float32)
    d.view(np.uint32)[np.isnan(d)] = 0x7FFFFFFF                      # canonical NaN
    if zero_rule == "mma_sim":
        d[d == 0] = 0.0                                             # MMA-Sim: +0
    return d.reshape(batch + (m, n))

