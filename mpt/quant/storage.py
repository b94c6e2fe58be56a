"""L4: low-precision weight storage — NF4 with double quantization, int8 per channel.

**NF4** (QLoRA): blocks of 64 share a float32 absmax; codes index the 16 levels of
``get_format("nf4")``; two codes per byte, the first in the high nibble (bitsandbytes' order).
Double quantization stores the absmax values as 8-bit codes of bitsandbytes' signed dynamic map
(blocks of 256, after subtracting their mean) — 8/64 + 32/(64·256) = 0.127 bits per parameter
instead of 0.5. Every container is checked when it is built (its arrays go to kernels).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mpt._checks import check_array, check_finite, check_int, check_real
from mpt.formats import get_format
from mpt.kernels import quant as K
from mpt.quant.observers import PerChannelMinMaxObserver

__all__ = ["NF4_BLOCKSIZE", "DQ_BLOCKSIZE", "nf4_decision_points", "dynamic_map", "pack_nibbles",
           "unpack_nibbles", "NF4Weight", "nf4_quantize", "nf4_dequantize", "Int8Weight",
           "int8_quantize_per_channel"]

NF4_BLOCKSIZE = 64
DQ_BLOCKSIZE = 256


def _midpoints(levels: np.ndarray) -> np.ndarray:
    """Exact float64 midpoints of adjacent float32 levels (25 significant bits at most)."""
    lv = levels.astype(np.float64)
    return (lv[:-1] + lv[1:]) / 2


def nf4_decision_points(rule: str = "nearest") -> np.ndarray:
    """The 15 float64 thresholds ``m_k``: code = #{k : x > m_k}.

    ``"nearest"``: exact midpoints — the nearest level, an exact tie to the lower level.
    ``"bitsandbytes"``: the midpoints rounded to float32, as bitsandbytes' decision tree compares
    against float32 constants; it differs from "nearest" only for the six float32 inputs equal to
    a midpoint that rounded up (there it picks the lower level, 2^-25 relatively farther).
    """
    mids = _midpoints(np.array(get_format("nf4").levels, np.float32))
    if rule == "nearest":
        return mids
    if rule == "bitsandbytes":
        return mids.astype(np.float32).astype(np.float64)
    raise ValueError(f"rule must be 'nearest' or 'bitsandbytes'; got {rule!r}")


def dynamic_map() -> np.ndarray:
    """bitsandbytes' signed 8-bit dynamic map (``create_dynamic_map(signed=True)``), 256 sorted
    float32 values: for i = 0..6 the 2^i midpoints of ``linspace(0.1, 1, 2^i + 1)`` times
    ``10^(i−6)``, both signs, plus 0 and 1.0 (no −1). Built in float64, rounded once to float32
    (bitsandbytes builds it with float32 ``torch.linspace``: a value may differ in its last bit).
    Largest half-gap: 0.9/128 = 0.00703125 (the top decade, and −1 against −0.99296875).
    """
    values = [0.0, 1.0]
    for i in range(7):
        bounds = np.linspace(0.1, 1.0, 2**i + 1)
        means = 10.0 ** (i - 6) * (bounds[:-1] + bounds[1:]) / 2
        values += list(means) + list(-means)
    return np.sort(np.array(values, np.float64)).astype(np.float32)


def _int_codes(name: str, values, bits: int) -> np.ndarray:
    """``values`` (integers in [0, 2^bits)) as a flat uint8 array; a float, bool or out-of-range
    value is refused, never truncated."""
    arr = np.asarray(values)
    top = (1 << bits) - 1
    if arr.size and arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be integers in [0, {top}]; got dtype {arr.dtype}")
    if arr.size and not 0 <= arr.min() <= arr.max() <= top:
        raise ValueError(f"{name} must be integers in [0, {top}] ({bits}-bit); got values in "
                         f"[{arr.min()}, {arr.max()}]")
    return arr.astype(np.uint8).ravel()


def pack_nibbles(codes) -> np.ndarray:
    """uint8 bytes holding two 4-bit codes each, the first in the high nibble (a trailing odd code
    gets a zero low nibble). ``codes``: integers in [0, 15]."""
    codes = _int_codes("codes", codes, 4)
    padded = np.zeros(codes.size + codes.size % 2, np.uint8)
    padded[:codes.size] = codes
    return (padded[0::2] << np.uint8(4)) | padded[1::2]


def unpack_nibbles(packed, n: int) -> np.ndarray:
    """The first ``n`` 4-bit codes of :func:`pack_nibbles` bytes (integers in [0, 255])."""
    packed = _int_codes("packed", packed, 8)
    n = check_int("n", n, min=0, max=2 * packed.size)
    return np.stack([packed >> np.uint8(4), packed & np.uint8(15)], axis=1).ravel()[:n]


@dataclass(frozen=True)
class NF4Weight:
    """A tensor stored in NF4: packed codes, one float32 absmax per block of 64 — or, with double
    quantization, the absmax as dynamic-map codes with one float32 scale per 256 of them plus
    their float32 mean (``absmax_offset``)."""

    packed: np.ndarray                     # (ceil(n/2),) uint8
    shape: tuple
    blocksize: int
    absmax: np.ndarray | None              # (nblocks,) float32, without double quantization
    absmax_codes: np.ndarray | None = None  # (nblocks,) uint8 dynamic-map codes
    absmax_scale: np.ndarray | None = None  # (ceil(nblocks/256),) float32
    absmax_offset: np.float32 | None = None

    def __post_init__(self):
        """Check that every field has the dtype and size the kernels index (``nblocks =
        ceil(n/blocksize)``, n the product of ``shape``), and that the absmax values are finite
        and >= 0: a mismatch would read outside the arrays."""
        if not isinstance(self.shape, (tuple, list)):
            raise TypeError(f"shape must be a tuple of non-negative ints; got "
                            f"{type(self.shape).__name__}")
        shape = tuple(check_int(f"shape[{i}]", d, min=0) for i, d in enumerate(self.shape))
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "blocksize", check_int("blocksize", self.blocksize, min=1))
        n = math.prod(shape)
        nblocks = -(-n // self.blocksize)
        check_array("packed", self.packed, np.uint8, shape=(-(-n // 2),))
        if self.absmax_codes is None:
            if self.absmax_scale is not None or self.absmax_offset is not None:
                raise ValueError("absmax_scale and absmax_offset belong to double quantization: "
                                 "give absmax_codes too (and absmax=None)")
            _check_absmax("absmax", self.absmax, nblocks)
            return
        if self.absmax is not None:
            raise ValueError("give absmax or, with double quantization, absmax_codes; not both")
        check_array("absmax_codes", self.absmax_codes, np.uint8, shape=(nblocks,))
        _check_absmax("absmax_scale", self.absmax_scale, -(-nblocks // DQ_BLOCKSIZE))
        offset = check_real("absmax_offset", self.absmax_offset)
        if float(np.float32(offset)) != offset:
            raise ValueError(f"absmax_offset must be a float32 value; got {self.absmax_offset!r}")
        object.__setattr__(self, "absmax_offset", np.float32(offset))

    @property
    def double_quant(self) -> bool:
        return self.absmax_codes is not None

    def block_absmax(self) -> np.ndarray:
        """The float32 absmax used to dequantize (decoded from double quantization if used):
        ``fl32(fl32(code·scale) + offset)``."""
        if not self.double_quant:
            return self.absmax
        centered = K.blockwise_decode(self.absmax_codes, dynamic_map(), self.absmax_scale,
                                      DQ_BLOCKSIZE)
        return centered + self.absmax_offset

    @property
    def nbytes(self) -> int:
        parts = (self.packed, self.absmax, self.absmax_codes, self.absmax_scale)
        return sum(p.nbytes for p in parts if p is not None) + (4 if self.double_quant else 0)


def _check_absmax(name: str, value, size: int) -> None:
    check_array(name, value, np.float32, shape=(size,))
    if not (check_finite(name, value) >= 0).all():
        raise ValueError(f"{name} must be >= 0 (a block's largest magnitude); got a negative "
                         "value")


def nf4_quantize(x, blocksize: int = NF4_BLOCKSIZE, double_quant: bool = False,
                 rule: str = "nearest") -> NF4Weight:
    """NF4 of a finite float32 array (flattened in C order): per block ``absmax = max|x|``,
    ``code = nearest level of fl32(x·fl32(1/absmax))`` (:func:`nf4_decision_points`), packed.

    ``double_quant``: ``offset = fl32(mean(absmax))`` (float64 ``fsum``), the centered
    ``fl32(absmax − offset)`` quantized with :func:`dynamic_map` in blocks of 256 the same way.
    The decoded absmax then satisfies (tests/test_nf4.py) ``|absmax' − absmax| <= A2·(0.00703125
    + 2^-20) + 2^-24·|absmax'|``, A2 the block's max |absmax − offset|. Oracle:
    ``mpt.reference.blockwise_absmax_reference``.
    """
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"x must be float32 (decode fp16/bf16 first); got {x.dtype}")
    codes, absmax = K.blockwise_absmax_encode(x.ravel(), blocksize, nf4_decision_points(rule))
    packed = pack_nibbles(codes)
    if not double_quant:
        return NF4Weight(packed, x.shape, blocksize, absmax)
    offset = np.float32(math.fsum(absmax.astype(np.float64)) / absmax.size)
    dcodes, dscale = K.blockwise_absmax_encode(absmax - offset, DQ_BLOCKSIZE,
                                               _midpoints(dynamic_map()))
    return NF4Weight(packed, x.shape, blocksize, None, dcodes, dscale, offset)


def nf4_dequantize(w: NF4Weight) -> np.ndarray:
    """float32 ``fl32(level[code] · absmax[block])`` in the stored shape."""
    n = int(np.prod(w.shape, dtype=np.int64))
    codes = unpack_nibbles(w.packed, n)
    levels = np.array(get_format("nf4").levels, np.float32)
    return K.blockwise_decode(codes, levels, w.block_absmax(), w.blocksize).reshape(w.shape)


# ---- int8 per-channel weight storage -------------------------------------------------------------
@dataclass(frozen=True)
class Int8Weight:
    """Symmetric per-channel int8 weights: ``codes`` (int8, the weight's shape) and one float32
    ``scale`` per slice along ``axis``; value ``fl32(code · scale)``."""

    codes: np.ndarray
    scale: np.ndarray
    axis: int = 0

    def __post_init__(self):
        """int8 ``codes`` of at least one dimension, ``axis`` one of them (stored normalised to
        ``[0, ndim)``), one finite float32 ``scale`` > 0 per slice along it."""
        codes = check_array("codes", self.codes, np.int8)
        if codes.ndim == 0:
            raise ValueError("codes must have at least one dimension (the channel axis)")
        axis = check_int("axis", self.axis, min=-codes.ndim, max=codes.ndim - 1) % codes.ndim
        object.__setattr__(self, "axis", axis)
        scale = check_array("scale", self.scale, np.float32, shape=(codes.shape[axis],))
        if not (check_finite("scale", scale) > 0).all():
            raise ValueError("scale must be > 0 in every channel")

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes

    def dequantize(self) -> np.ndarray:
        shape = [1] * self.codes.ndim
        shape[self.axis] = self.scale.size
        # |code| <= 128 < 2^24: fl32(code·scale) equals the fake-quant kernel's double product
        return self.codes.astype(np.float32) * self.scale.reshape(shape)


def int8_quantize_per_channel(w, axis: int = 0) -> Int8Weight:
    """int8 codes of float32 ``w`` with PyTorch's per-channel symmetric qint8 qparams
    (``s = max(amax/127.5, 2^-23)``, z = 0) and its fake-quant arithmetic; ``dequantize()`` equals
    ``fake_quantize_per_channel_affine`` of ``w`` bit for bit."""
    w = np.asarray(w)
    if w.dtype != np.float32:
        raise TypeError(f"w must be float32; got {w.dtype}")
    if w.ndim == 0:
        raise ValueError("w must have at least one dimension (the channel axis)")
    axis = check_int("axis", axis, min=-w.ndim, max=w.ndim - 1)
    obs = PerChannelMinMaxObserver(ch_axis=axis, dtype="qint8", qscheme="per_channel_symmetric")
    obs(w)
    scale, zp = obs.calculate_qparams()
    _, _, codes = K.fake_quant_per_channel(w, scale, zp, axis, obs.quant_min, obs.quant_max)
    return Int8Weight(codes.astype(np.int8), scale, axis % w.ndim)


