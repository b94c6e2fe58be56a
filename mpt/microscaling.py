"""L1: block-scaled formats (MXFP8/MXFP6/MXFP4/MXINT8 and NVFP4): exact quantizers, their exact
decode, and the 16×16 random Hadamard transform of the NVFP4 training recipe.

**Blocks.** A block is 1×32 or 1×16 elements along ``axis``, or 16×16 / 32×32 over the last two
axes (one scale per tile, as NVFP4 weights: the same tiles whichever of the two axes is ``axis``,
so a matrix and its transpose quantize to the same numbers). The last block along an axis may
be partial: the missing elements count as zeros. Scales have the input's shape with the blocked
axes divided by the block size (rounded up).

**MX** (:func:`quantize_mx`; OCP Microscaling v1.0): one E8M0 scale X = 2^e per block, elements
``round(x / X)`` in the element format (fp8 e4m3/e5m2, fp6 e2m3/e3m2, fp4 e2m1; MXINT8: int8
codes with an implicit 2^-6, clamped to ±127 as OCP clamps to ±max, NaN → 0) in ``mode``,
saturating (±Inf and overflow give
±max). The scaled value x·2^-e is exact (float64), so each element is rounded once. Scale
rules, by name (codes from :mod:`mpt.kernels.microscaling`):

- ``"ocp"`` — OCP's sample algorithm: e = floor(log2 amax) − emax_elem, clamped to [−127, 127];
  an all-zero block gets 2^-127; a block holding Inf/NaN gets the NaN scale 0xFF and its
  elements are rounded unscaled (NaN elements: the format's NaN, or for fp6/fp4 the signed zero
  of :func:`mpt.round`). What ``mpt.fp8.mx_quantize`` has always done.
- ``"te"`` — Transformer Engine's MXFP8 rule (``quantize_mxfp8.cuh``, ``ptx::float_to_e8m0``):
  NaN is ignored in the amax; the code is the exponent of fl32(amax · fl32(1/fmt_max)) rounded
  **up** (so the block maximum never saturates: amax 500 in e4m3 gives X = 2, element 256);
  amax 0 gives 0x00, Inf 0xFE. Elements are x·2^(127−code) converted RNE saturating; NaN becomes
  0x7F (fp8), +max (fp6/fp4). TE multiplies in float32, which can only round products below
  2^-126, whose fp8 code is a signed zero either way: the exact product gives the same codes.
- ``"trainium"`` — Trainium3's ``nki.isa.quantize_mx`` (documented: "a block scale that is two
  times larger" than OCP's sample algorithm): e = floor(log2 amax) − emax_elem + 1; specials as
  ``"ocp"``; element rounding RNE (assumption: the documentation does not name it).

**NVFP4** (:func:`quantize_nvfp4`; TE's ``core_nvfp4.cuh``/``quantize_transpose_nvfp4.cuh``):
e2m1 elements, one UE4M3 scale per 1×16 (or 16×16) block, and a float32 per-tensor scale.
With amax the tensor's amax (NaN ignored) and every operation a float32 RNE step:

    S_enc = fl32(2688 / amax), min FLT_MAX; 1 when amax is 0 or S_enc is 0 (amax = Inf)
    S_dec = fl32(1.0 / S_enc) computed in double (TE's ``1.0 / S_enc``), then to float32
    s     = E4M3_RNE_satfinite(fl32(block_amax · fl32(S_enc · fl32(1/6))))   rule "te"
    inv   = min(fl32(1 / fl32(s · S_dec)), FLT_MAX)
    q     = e2m1(fl32(x · inv)), RNE (or stochastic) saturating; NaN → +6; −0 stays −0

Named variants of the block scale: ``"te_v2.8"`` = fl32(fl32(block_amax / 6) · S_enc) (TE
v2.8–v2.13, the quantize-transpose kernel) and ``"te_v2.8_rowwise"`` = fl32(fl32(block_amax ·
fl32(1/6)) · S_enc) (v2.8–v2.13, the rowwise-only kernel); they differ from ``"te"`` at E4M3
ties. The result keeps ``tensor_scale = S_dec`` and ``amax`` (TE dequantizes with
e2m1 · fl32(fl32(s·amax)·fl32(1/2688)), and its GEMM multiplies by amax_a·amax_b/2688²).

**Rounding modes:** ``"nearest_even"``; ``"stochastic"`` (mpt's: 32-bit Philox word i of stream
``(seed, stream)`` rounds element i of x in C order, or explicit ``random_bits``); and
``"stochastic_8bit"`` — TE's NVFP4 stochastic rounding, 8 random bits r per element: the
magnitude rounds up iff floor(frac·256) + r >= 256, with r the top byte of the same word (which
is what mpt's stochastic rounding computes from a word whose low 24 bits are zero).

**Decode** (:meth:`BlockScaledArray.decode`) is exact: element value × scale value ×
``tensor_scale`` in float64 (at most 3 + 4 + 24 significant bits). Oracle:
``mpt.reference.microscaling``. Tests: ``tests/test_microscaling.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt import rounding as _rounding
from mpt.formats import Format, get_format
from mpt.kernels import microscaling as K
from mpt.kernels import mma as _mma
from mpt.kernels.random import random_words

__all__ = [
    "BlockScaledArray", "quantize_mx", "quantize_nvfp4", "nvfp4_global_scale", "nvfp4_gemm_alpha",
    "MX_ELEMENT_FORMATS", "SCALE_RULES", "SCALE_FORMATS",
    "NVFP4_SCALE_RULES", "MODES", "BLOCKS", "RHT_SIGN_MASK", "rht_matrix", "rht_is_orthogonal",
    "hadamard_transform",
]

MX_ELEMENT_FORMATS = ("fp8_e4m3fn", "fp8_e5m2", "fp6_e2m3fn", "fp6_e3m2fn", "fp4_e2m1fn", "int8")
SCALE_RULES = ("ocp", "te", "trainium")
NVFP4_SCALE_RULES = ("te", "te_v2.8", "te_v2.8_rowwise")
MODES = ("nearest_even", "stochastic", "stochastic_8bit")
BLOCKS = ((1, 16), (1, 32), (16, 16), (32, 32))
SCALE_FORMATS = ("e8m0", "fp8_e4m3fn")   # E8M0, and UE4M3 stored as e4m3fn (sign ignored)

_F32 = np.float32
_FLT_MAX = _F32(float.fromhex("0x1.fffffep+127"))
_INT_SCALE = 2.0**-6          # MXINT8: value = code · 2^-6
_NVFP4_RANGE = _F32(448 * 6)  # E4M3 max · E2M1 max = 2688


def _choice(value, valid, name):
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}; got {value!r}")
    return value


# ---- block layout -----------------------------------------------------------------------------
def _block(block) -> tuple[int, int]:
    """A block as (rows, columns): 16 / 32 mean 1×16 / 1×32."""
    b = (1, block) if isinstance(block, (int, np.integer)) and not isinstance(block, bool) \
        else tuple(block) if isinstance(block, (tuple, list)) else None
    if b not in BLOCKS:
        raise ValueError(f"block must be 16, 32, (1, 16), (1, 32), (16, 16) or (32, 32); got "
                         f"{block!r}")
    return b


class _Layout:
    """How an array of ``shape`` is cut into blocks along ``axis``.

    ``blocks(x)`` views x as (..., nR, br, nC, bc): for a 1-D block, axis moved last and a unit
    row axis added; for a 2-D block, the last two axes with ``axis`` last (transposed when axis
    is the second-to-last), zero-padded to whole blocks. ``unblocks`` and ``scales_out`` undo it.
    """

    def __init__(self, shape, axis, block):
        self.shape, self.block = tuple(shape), _block(block)
        ndim = len(self.shape)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or \
                not -ndim <= axis < ndim:
            raise ValueError(f"axis must be an int in [{-ndim}, {ndim}) for shape {self.shape}; "
                             f"got {axis!r}")
        self.axis = int(axis) % ndim
        if self.block[0] > 1 and (ndim < 2 or self.axis < ndim - 2):
            raise ValueError(f"a 2-D block {self.block} covers the last two axes: axis must be "
                             f"-1 or -2 of an array with >= 2 dims; got axis={axis} for shape "
                             f"{self.shape}")

    @property
    def two_d(self):
        return self.block[0] > 1

    def _moved(self, x):
        if self.two_d:
            return np.swapaxes(x, -1, -2) if self.axis == x.ndim - 2 else x
        return np.moveaxis(x, self.axis, -1)[..., None, :]

    def blocks(self, x):
        """x (self.shape) as (..., nR, br, nC, bc), zero-padded."""
        m = self._moved(x)
        br, bc = self.block
        rows, cols = m.shape[-2:]
        pad = [(0, 0)] * (m.ndim - 2) + [(0, -rows % br), (0, -cols % bc)]
        m = np.pad(m, pad) if any(p[1] for p in pad) else m
        return m.reshape(m.shape[:-2] + (m.shape[-2] // br, br, m.shape[-1] // bc, bc))

    def unblocks(self, xb):
        """The inverse of :meth:`blocks` (padding dropped)."""
        m = xb.reshape(xb.shape[:-4] + (xb.shape[-4] * xb.shape[-3], xb.shape[-2] * xb.shape[-1]))
        rows, cols = self._moved(np.empty(self.shape, np.bool_)).shape[-2:]
        m = m[..., :rows, :cols]
        if self.two_d:
            return np.swapaxes(m, -1, -2) if self.axis == len(self.shape) - 2 else m
        return np.moveaxis(m[..., 0, :], -1, self.axis)

    def scales_out(self, s):
        """Per-block values (..., nR, nC) in the layout of the scales."""
        if self.two_d:
            return np.swapaxes(s, -1, -2) if self.axis == len(self.shape) - 2 else s
        return np.moveaxis(s[..., 0, :], -1, self.axis)

    def scales_in(self, s):
        """The inverse of :meth:`scales_out`."""
        if self.two_d:
            return np.swapaxes(s, -1, -2) if self.axis == len(self.shape) - 2 else s
        return np.moveaxis(s, self.axis, -1)[..., None, :]

    @property
    def scale_shape(self):
        shape = list(self.shape)
        if self.two_d:
            size = self.block[0]
            shape[-2], shape[-1] = -(-shape[-2] // size), -(-shape[-1] // size)
        else:
            shape[self.axis] = -(-shape[self.axis] // self.block[1])
        return tuple(shape)


# ---- the result ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockScaledArray:
    """A block-scaled tensor: element codes, one scale per block, and a per-tensor scale.

    codes: the element codes, in the element format's dtype, with the original shape.
    scales: one code per block in the scale format's dtype (``float8_e8m0fnu``, or
    ``float8_e4m3fn`` holding UE4M3, whose sign bit is ignored), shaped as the codes with the
    blocked axes divided by the block size (rounded up). block: one of :data:`BLOCKS`;
    axis: the (non-negative) axis the blocks run along. tensor_scale: the float32 per-tensor
    decode factor (1 for MX, S_dec for NVFP4). amax: NVFP4's float32 tensor amax (None for MX).
    Validated when built: kernels trust these fields.
    """

    codes: np.ndarray
    scales: np.ndarray
    element_format: Format
    scale_format: Format
    block: tuple
    axis: int
    tensor_scale: np.float32 = _F32(1)
    amax: np.float32 | None = None

    def __post_init__(self):
        for name, value, valid in (("element_format", self.element_format, MX_ELEMENT_FORMATS),
                                   ("scale_format", self.scale_format, SCALE_FORMATS)):
            if not isinstance(value, Format) or value.name not in valid:
                raise TypeError(f"{name} must be a Format among {valid}; got {value!r}")
        for name, arr, fmt in (("codes", self.codes, self.element_format),
                               ("scales", self.scales, self.scale_format)):
            if not isinstance(arr, np.ndarray) or arr.dtype != fmt.dtype:
                raise TypeError(f"{name} must be an ndarray of {fmt.dtype} ({fmt.name}); got "
                                f"{getattr(arr, 'dtype', type(arr).__name__)}")
        if _block(self.block) != self.block:
            raise ValueError(f"block must be a tuple among {BLOCKS}; got {self.block!r}")
        layout = _Layout(self.codes.shape, self.axis, self.block)
        if layout.axis != self.axis:
            raise ValueError(f"axis must be non-negative; got {self.axis}")
        if self.scales.shape != layout.scale_shape:
            raise ValueError(f"scales must have shape {layout.scale_shape} for codes of shape "
                             f"{self.codes.shape}, block {self.block}, axis {self.axis}; got "
                             f"{self.scales.shape}")
        if not isinstance(self.tensor_scale, np.float32) or not \
                (np.isfinite(self.tensor_scale) and self.tensor_scale > 0):
            raise ValueError(f"tensor_scale must be a finite positive np.float32; got "
                             f"{self.tensor_scale!r}")
        if self.amax is not None and not isinstance(self.amax, np.float32):
            raise TypeError(f"amax must be None or an np.float32; got {type(self.amax).__name__}")

    @property
    def shape(self):
        return self.codes.shape

    def element_values(self) -> np.ndarray:
        """The elements' exact values (float64, MXINT8 with its 2^-6), unscaled."""
        if self.element_format.kind == "int":
            return self.codes.astype(np.float64) * _INT_SCALE
        return _rounding.decode(self.codes, np.float64)

    def scale_values(self) -> np.ndarray:
        """The scales' exact values (float64; UE4M3's sign bit ignored; NaN for NaN codes)."""
        return np.abs(_rounding.decode(self.scales, np.float64))

    def decode(self) -> np.ndarray:
        """The exact values: element × block scale × tensor_scale, float64 (exact: at most
        3 + 4 + 24 significant bits, exponents within float64's range)."""
        layout = _Layout(self.shape, self.axis, self.block)
        sb = layout.scales_in(self.scale_values())                    # (..., nR, nC)
        xb = layout.blocks(self.element_values())                     # (..., nR, br, nC, bc)
        with np.errstate(invalid="ignore"):
            return layout.unblocks(xb * sb[..., :, None, :, None]) * float(self.tensor_scale)


# ---- inputs -------------------------------------------------------------------------------------
def _as_f32(x, name="x"):
    """x as a float32 array; narrower format dtypes are decoded exactly. float64 is refused (the
    hardware quantizers read float32 or narrower)."""
    arr = np.asarray(x)
    if arr.dtype == np.float32:
        return arr
    try:
        fmt = get_format(arr.dtype)
    except (TypeError, ValueError):
        fmt = None
    if fmt is None or fmt.kind != "float" or fmt.name in ("fp32", "fp64"):
        raise TypeError(f"{name} must be float32 or a narrower float format dtype; got "
                        f"{arr.dtype}")
    return _rounding.decode(arr, np.float32)


def _words(shape, mode, seed, stream, random_bits):
    """The uint32 random words of x's elements (shape), or None for round-to-nearest."""
    _choice(mode, MODES, "mode")
    if mode == "nearest_even":
        for name, value in (("seed", seed), ("stream", stream), ("random_bits", random_bits)):
            if value is not None:
                raise ValueError(f"{name} is only used by the stochastic modes")
        return None
    if (seed is None) == (random_bits is None):
        raise ValueError(f"mode={mode!r} needs exactly one of seed or random_bits")
    if random_bits is not None:
        if stream is not None:
            raise ValueError("stream is only used with seed, not with random_bits")
        if not isinstance(random_bits, np.ndarray) or random_bits.dtype != np.uint32 \
                or random_bits.shape != shape:
            raise TypeError(f"random_bits must be a uint32 ndarray of x's shape {shape}")
        words = random_bits
    else:
        words = random_words(seed, 0 if stream is None else stream, int(np.prod(shape)))
        words = words.reshape(shape)
    return words & np.uint32(0xFF000000) if mode == "stochastic_8bit" else words


def _amax(xb, ignore_nan):
    """Per-block max|x| of (..., nR, br, nC, bc) -> (..., nR, nC) float32 (NaN propagates
    unless ignored: ``fmaxf``/PTX max return the non-NaN operand)."""
    a = np.abs(xb)
    reduce = np.fmax if ignore_nan else np.maximum
    return reduce.reduce(reduce.reduce(a, axis=-1, initial=0), axis=-2, initial=0)


def _element_info(fmt):
    """(Format, emax of the element format, its largest value) of an MX element format."""
    fmt = get_format(fmt)
    if fmt.name not in MX_ELEMENT_FORMATS:
        raise ValueError(f"fmt must be an MX element format ({', '.join(MX_ELEMENT_FORMATS)}); "
                         f"got {fmt.name}")
    if fmt.kind == "int":
        return fmt, 0, 127 * _INT_SCALE
    return fmt, fmt.emax, fmt.max


def _round_elements(y, fmt, mode, words, nan_code):
    """Codes of the scaled values y in fmt: RNE or stochastic, saturating; NaN inputs become
    ``nan_code`` when given (else what mpt.round gives). MXINT8: round(y·2^6) clamped to ±127,
    NaN → 0."""
    stochastic = words is not None
    kw = dict(random_bits=np.ascontiguousarray(words)) if stochastic else {}
    rmode = "stochastic" if stochastic else "nearest_even"
    nan = np.isnan(y)
    if fmt.kind == "int":
        codes = _rounding.round(np.where(nan, 0, y) / _INT_SCALE, fmt, rmode, **kw)
        return np.maximum(codes, np.int8(-127))
    codes = _rounding.round(y, fmt, rmode, saturate=True, **kw)
    if nan_code is not None and nan.any():
        codes = codes.copy()
        codes.view(np.uint8)[nan] = nan_code
    return codes


# ---- MX -----------------------------------------------------------------------------------------
def quantize_mx(x, fmt, *, axis=-1, block=32, scale_rule="ocp", mode="nearest_even", seed=None,
                stream=None, random_bits=None) -> BlockScaledArray:
    """Quantize x to MX with element format ``fmt`` and one E8M0 scale per block (see the module
    docstring for the rules). x: float32 or a narrower float format; block: 32 (the OCP
    block), 16, (1, 32), (1, 16), (16, 16) or (32, 32); scale_rule: "ocp", "te" or "trainium"; mode:
    "nearest_even", "stochastic" or "stochastic_8bit" (with seed/stream or random_bits).
    Oracle: ``mpt.reference.microscaling.quantize_mx_reference``."""
    fmt, emax, fmax = _element_info(fmt)
    _choice(scale_rule, SCALE_RULES, "scale_rule")
    x = _as_f32(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    layout = _Layout(x.shape, axis, block)
    words = _words(x.shape, mode, seed, stream, random_bits)
    te = scale_rule == "te"
    amax = _amax(layout.blocks(x), ignore_nan=te)                  # (..., nR, nC)
    if te:
        amax = amax * _F32(1.0 / fmax)                             # fl32(amax · fl32(1/max))
    codes8 = np.empty(amax.size, np.uint8)
    K.e8m0_codes(np.ascontiguousarray(amax).reshape(-1).view(np.uint32),
                 K.SCALE_RULE_CODES[scale_rule], emax, codes8)
    codes8 = codes8.reshape(amax.shape)
    # x / X: exact in float64. A NaN scale: TE's elements become NaN, OCP's are left unscaled.
    shift = np.where(codes8 == 0xFF, np.nan if te else 0.0, codes8.astype(np.float64) - 127)
    y = layout.blocks(x.astype(np.float64)) * np.exp2(-shift)[..., :, None, :, None]
    nan_code = None
    if te:
        nan_code = 0x7F if fmt.bits == 8 and fmt.kind == "float" else \
            int(_rounding.round(np.float32(fmax), fmt).view(np.uint8))
    wb = None if words is None else layout.blocks(words)
    codes = _round_elements(y, fmt, mode, wb, nan_code)
    return BlockScaledArray(np.ascontiguousarray(layout.unblocks(codes)),
                            np.ascontiguousarray(layout.scales_out(codes8)).view(
                                get_format("e8m0").dtype),
                            fmt, get_format("e8m0"), layout.block, layout.axis)


# ---- NVFP4 --------------------------------------------------------------------------------------
def nvfp4_global_scale(amax) -> np.float32:
    """TE's S_enc = fl32(2688 / amax), at most FLT_MAX; 1 when amax is 0 or S_enc is 0."""
    amax = _F32(amax)
    with np.errstate(divide="ignore", over="ignore"):
        s = np.fmin(_NVFP4_RANGE / amax, _FLT_MAX)                  # fminf: NaN -> FLT_MAX
    return _F32(1) if amax == 0 or s == 0 else _F32(s)


def _nvfp4_block_scale(block_amax, s_enc, rule):
    """The float32 value each rule casts to E4M3 (see the module docstring)."""
    six = _F32(6)
    with np.errstate(over="ignore"):
        if rule == "te":
            return block_amax * (s_enc * (_F32(1) / six))
        if rule == "te_v2.8":
            return np.fmin((block_amax / six) * s_enc, _FLT_MAX)
        return (block_amax * (_F32(1) / six)) * s_enc


def quantize_nvfp4(x, *, axis=-1, block=16, scale_rule="te", mode="nearest_even",
                   global_amax=None, seed=None, stream=None, random_bits=None) -> BlockScaledArray:
    """Quantize x to NVFP4: e2m1 elements, a UE4M3 scale per 1×16 (``block=16``) or 16×16 block,
    a float32 per-tensor scale (module docstring). ``global_amax``: the float32 amax S_enc is
    computed from (default: x's, NaN ignored; TE takes it after the Hadamard transform for the
    transformed copy). Oracle: ``mpt.reference.microscaling.quantize_nvfp4_reference``."""
    _choice(scale_rule, NVFP4_SCALE_RULES, "scale_rule")
    x = _as_f32(x)
    if x.ndim == 0:
        raise ValueError("x must have at least one dimension")
    layout = _Layout(x.shape, axis, block)
    if 32 in layout.block:
        raise ValueError(f"NVFP4 blocks are 1x16 or 16x16; got {layout.block}")
    words = _words(x.shape, mode, seed, stream, random_bits)
    if global_amax is None:
        global_amax = np.fmax.reduce(np.abs(x).ravel(), initial=0)
    amax = _F32(global_amax)
    s_enc = nvfp4_global_scale(amax)
    s_dec = _F32(1.0 / float(s_enc))                                # double division, to float
    xb = layout.blocks(x)                                           # (..., nR, br, nC, bc)
    scale = _rounding.round(_nvfp4_block_scale(_amax(xb, True), s_enc, scale_rule),
                            "fp8_e4m3fn", saturate=True)            # (..., nR, nC)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        inv = np.minimum(_F32(1) / (scale.astype(np.float32) * s_dec), _FLT_MAX)
        y = xb * inv[..., :, None, :, None]                         # float32 products
    fp4 = get_format("fp4_e2m1fn")
    wb = None if words is None else layout.blocks(words)
    codes = _round_elements(y, fp4, mode, wb, nan_code=0x07)      # NaN -> +6
    return BlockScaledArray(np.ascontiguousarray(layout.unblocks(codes)),
                            np.ascontiguousarray(layout.scales_out(scale)), fp4,
                            get_format("fp8_e4m3fn"), layout.block, layout.axis, s_dec, amax)


def nvfp4_gemm_alpha(amax_a, amax_b, alpha=1.0) -> np.float32:
    """Transformer Engine's per-tensor factor of an NVFP4 GEMM (``nvte_nvfp4_compute_per_tensor_
    scale``): fl32(fl32(fl32(alpha·amax_A)·amax_B)·fl32(1/(6²·448²))), float32 steps left to
    right. ``mpt.gemm`` multiplies the FP32 result by it (``scale_a=alpha``)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _F32(_F32(_F32(_F32(alpha) * _F32(amax_a)) * _F32(amax_b)) * _ALPHA_FACTOR)


_ALPHA_FACTOR = _F32(1.0 / (6.0 * 6.0 * 448.0 * 448.0))


# ---- the 16x16 random Hadamard transform ---------------------------------------------------------
#: TE's fixed sign vector of the NVFP4 weight-gradient RHT: bit i set <=> s_i = -1.
RHT_SIGN_MASK = 0xD7E8


def _rht_signs():
    """The integer matrix diag(s)·H16 (Sylvester's Hadamard matrix, entries ±1)."""
    h = np.ones((1, 1), np.int64)
    while h.shape[0] < 16:
        h = np.block([[h, h], [h, -h]])
    s = np.array([-1 if RHT_SIGN_MASK >> i & 1 else 1 for i in range(16)], np.int64)
    return s[:, None] * h


def rht_matrix() -> np.ndarray:
    """Q = diag(s)·H16/4, float64 (16, 16), entries ±1/4 (exact): TE applies y = x·Q to each
    row of 16 consecutive elements."""
    return _rht_signs() / 4.0


def rht_is_orthogonal() -> bool:
    """Q·Qᵀ = I exactly: (diag(s)·H16)(diag(s)·H16)ᵀ = 16·I in integers, and Q = that / 4."""
    sh = _rht_signs()
    return bool(np.array_equal(sh @ sh.T, 16 * np.eye(16, dtype=np.int64)))


def hadamard_transform(x, axis=-1) -> np.ndarray:
    """TE's NVFP4 RHT: each run of 16 consecutive elements along ``axis`` times Q (bf16 ±1/4).

    x: bfloat16 array whose length along axis is a multiple of 16. Each output element is the
    Tensor Core's bf16 dot product of 16 terms with FP32 output (TE's ``wmma`` m16n16k16, no
    accumulator; the Blackwell block model: one block of 16, F=25, RZ to FP32, e_zero = −133,
    reference model) rounded to bf16 (``cvt.rn``; NaN → 0x7FFF). Returns bfloat16, x's shape.
    """
    bf16 = get_format("bf16")
    arr = np.asarray(x)
    if arr.dtype != bf16.dtype:
        raise TypeError(f"x must be a bfloat16 array; got {arr.dtype}")
    if arr.ndim == 0 or arr.shape[axis] % 16:
        raise ValueError(f"x's length along axis {axis} must be a multiple of 16; got shape "
                         f"{arr.shape}")
    moved = np.moveaxis(arr, axis, -1)
    rows = np.ascontiguousarray(moved).reshape(1, -1, 16).astype(np.float32)  # (1, R, 16)
    q = rht_matrix().astype(np.float32)[None]                                 # (1, 16, 16)
    terms = []
    for v in (rows, q):
        value, nominal = np.empty(v.shape), np.empty(v.shape)
        _mma.decode_terms(v.ravel(), bf16.min_normal, value.ravel(), nominal.ravel())
        terms += [value, nominal]
    acc = np.zeros((1, rows.shape[1], 16))
    zero = np.zeros(1, np.int64)
    out = (2.0**-126, 2.0**-23, float(_FLT_MAX), False)                      # RZ-FP32
    with np.errstate(invalid="ignore", over="ignore"):
        _mma.block_chain(*terms, acc, zero, zero, 0, 16, 16, 25, 2.0**-133, out)
        y = _rounding.round(acc.astype(np.float32), bf16)
    y.view(np.uint16)[np.isnan(acc)] = 0x7FFF
    return np.moveaxis(y.reshape(moved.shape), -1, axis)
