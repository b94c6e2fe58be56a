"""L1: operands — A and B of one product, decoded once for one MMA model, and the chain over k.

Every arithmetic ``kind`` of :class:`~mpt.engines.model.MMAModel` has one :class:`Operands`
subclass, registered with :func:`register_kind`. ``mpt.mma`` and ``mpt.gemm`` only use this
interface:

* ``ops = cls(model, cfg, a, b, formats, out_format, batch, scales, options)`` decodes the
  operands once (:meth:`Operands.decode`; ``scales``: the instruction's block scales, for kinds
  with ``SCALES``; ``options``: keyword options the kind accepts, ``OPTIONS``);
* ``acc = ops.new_acc(c)`` makes an accumulator holding c (or +0);
* ``ops.chain(acc, k0, k1)`` runs the model over k in [k0, k1), in increasing k, in place
  (k0 and k1 multiples of :attr:`Operands.unit`, or K); ``acc = ops.chain_from(c, k0, k1)``
  is both steps at once (a kind may skip filling an accumulator its kernel overwrites);
* ``ops.values(acc)`` returns the accumulator as (B, M, N) values of the output format: float32
  (float64 for an fp64 output); ``mma`` writes the canonical NaN over NaNs when the kind's
  hardware returns one (``canonical_nan``).

The base class keeps the accumulator as a plain (B, M, N) array of :attr:`acc_dtype`; subclasses
with packed, register-blocked kernels override the three methods. ``accepts(cfg, fmt)`` (a
classmethod) says whether a configuration takes a format: ``fmt in cfg.inputs``, or a family
such as Gaudi's FP8 biases.
"""
from __future__ import annotations

import math

import numpy as np

from mpt.formats import get_format
from mpt.kernels import gemm as _gemm
from mpt.kernels import readonly
from mpt.kernels.half import widen16
from mpt.rounding import decode
from mpt.rounding import round as _round

__all__ = ["Operands", "PackedOperands", "register_kind", "operands_class", "roundings", "values32",
           "decoded", "batched", "tiles", "transposed", "output_params", "emin_pow2"]

_KINDS: dict[str, type] = {}


def register_kind(kind: str):
    """Class decorator: the operand class of every model of arithmetic ``kind``."""
    def register(cls):
        if kind in _KINDS:
            raise ValueError(f"MMA arithmetic kind {kind!r} is already registered")
        _KINDS[kind] = cls
        return cls
    return register


def operands_class(kind: str) -> type:
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(f"no operand class for MMA arithmetic kind {kind!r}; known kinds: "
                         f"{', '.join(_KINDS)}") from None


def values32(x: np.ndarray, fmt: str) -> np.ndarray:
    """The float32 values of an operand (tf32: the low 13 bits of the pattern dropped), in x's
    layout: float32 operands are not copied (the kernels and packers take any strides)."""
    if fmt == "tf32":
        return (x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    if x.dtype == np.float32:
        return x
    if x.dtype.itemsize == 1:
        return decode(x)               # exact; faster than ml_dtypes' casts for 8-bit formats
    if fmt in ("fp16", "bf16"):        # exact; faster than numpy's / ml_dtypes' casts
        return widen16(x)
    return x.astype(np.float32)


def decoded(x: np.ndarray, fmt: str) -> np.ndarray:
    """The exact values of an operand: float64 for fp64, else float32 (:func:`values32`). A
    custom format (float32 storage) must hold numbers of that format: ValueError otherwise."""
    if fmt == "fp64":
        return np.ascontiguousarray(x, dtype=np.float64)
    x32 = values32(x, fmt)
    if get_format(fmt).custom:
        with np.errstate(over="ignore", invalid="ignore"):
            on_grid = _round(x32, fmt).view(np.uint32) == x32.view(np.uint32)
        bad = ~on_grid & ~np.isnan(x32)
        if bad.any():
            raise ValueError(f"operand holds values that are not {fmt} numbers, e.g. "
                             f"{x32[bad].ravel()[0]!r} (round them first: mpt.round(x, fmt))")
    return x32


def batched(x: np.ndarray, batch: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(flattened (B', R, C) array — a view where numpy can make one —, (B,) index of each
    broadcast batch element into it), both read-only (``mpt.kernels.readonly``: operands that
    are tensor views and fresh ones compile the kernels once)."""
    if x.ndim == 2 and not batch:                  # one matrix: the common case, kept cheap
        flat, index = x[None], np.zeros(1, np.int64)
    else:
        flat = x.reshape((math.prod(x.shape[:-2]),) + x.shape[-2:])
        index = np.arange(flat.shape[0])           # nothing broadcast: element z is flat[z]
        if x.shape[:-2] != batch:
            index = np.ascontiguousarray(np.broadcast_to(index.reshape(x.shape[:-2]),
                                                         batch)).ravel()
    return readonly(flat), readonly(index)


def tiles(n: int, size: int) -> int:
    """Tiles of ``size`` that cover ``n`` (ceil(n / size))."""
    return -(-n // size)


def transposed(x):
    """(B, R, C) -> (B, C, R), or each array of a tuple."""
    if isinstance(x, tuple):
        return tuple(transposed(y) for y in x)
    return x.transpose(0, 2, 1)


class Operands:
    """A and B of one product, decoded once, with the model's chain over k (module docstring).

    ``formats``: the (A, B) format names; ``out_format``: the output format name; ``batch``: the
    broadcast batch shape. Subclasses implement :meth:`chain` and may override :meth:`prepare`
    (decode the float32 operands ``self.a``/``self.b``), :meth:`new_acc` and :meth:`values`.
    """

    acc_dtype = np.float64
    #: the hardware writes one canonical NaN (NVIDIA: 0x7FFFFFFF / 0x7FFF) over every NaN result
    canonical_nan = True
    #: keyword options (``mpt.mma(..., name=value)``) this kind accepts
    OPTIONS: tuple[str, ...] = ()
    #: whether this kind takes the instruction's block scales (``scale_a``/``scale_b``)
    SCALES = False

    @classmethod
    def accepts(cls, cfg, fmt: str) -> bool:
        """Whether configuration ``cfg`` takes A or B operands of format ``fmt`` (a name): one of
        its ``inputs``. A kind whose formats form a parametrised family (Gaudi's FP8 biases,
        Trainium's cFP8 flavours) overrides it; ``inputs`` then lists the family's usual ones."""
        return fmt in cfg.inputs

    @classmethod
    def check_config(cls, cfg) -> None:
        """Refuse a configuration whose parameters this kind's kernels cannot run exactly
        (ValueError naming the parameter). Subclasses override it."""

    def __init__(self, model, cfg, a, b, formats, out_format, batch, scales=None, options=None):
        options = dict(options or {})
        unknown = sorted(set(options) - set(self.OPTIONS))
        if unknown:
            valid = ", ".join(self.OPTIONS) or "none"
            raise TypeError(f"model {model.name!r} takes no option {', '.join(unknown)}; its "
                            f"options: {valid}")
        if scales is not None and not self.SCALES:
            raise ValueError(f"model {model.name!r} takes no block scales (scale_a/scale_b) for "
                             f"{'/'.join(formats)} inputs")
        self.model, self.cfg, self.options, self.scales = model, cfg, options, scales
        self.formats, self.out_format = tuple(formats), out_format
        self.m, self.k, self.n = a.shape[-2], a.shape[-1], b.shape[-1]
        self.batch, self.shapes = batch, (a.shape, b.shape)
        self.a, self.ia = batched(self.decode(a, formats[0]), batch)  # (Ba, M, K)
        self.b, self.ib = batched(self.decode(b, formats[1]), batch)  # (Bb, K, N)
        self.prepare()

    def decode(self, x: np.ndarray, fmt: str) -> np.ndarray:
        """The values of one operand array for the kernels (default: :func:`decoded`, exact
        float32, float64 for fp64); a kind whose results depend on more than the values (NaN
        payloads, flushes) overrides it."""
        return decoded(x, fmt)

    def prepare(self) -> None:
        """Decode ``self.a``/``self.b`` further for the kernels (default: keep float32)."""

    @property
    def unit(self) -> int:
        """Products per chained step (the block or instruction K; 1 for per-k models)."""
        return self.cfg.block or 1

    @property
    def batch_size(self) -> int:
        return self.ia.size

    @property
    def work(self) -> int:
        """Products in the whole call (B·M·N·K)."""
        return self.batch_size * self.m * self.n * self.k

    def new_acc(self, c=None) -> np.ndarray:
        """An accumulator holding c ((B, M, N) values of the output format) or +0."""
        acc = np.zeros((self.batch_size, self.m, self.n), self.acc_dtype)
        if c is not None:
            acc[...] = c
        return acc

    def chain(self, acc, k0: int, k1: int) -> None:
        raise NotImplementedError

    def chain_from(self, c, k0: int, k1: int) -> np.ndarray:
        """A new accumulator holding c (None: +0) with the chain over [k0, k1) run onto it."""
        acc = self.new_acc(c)
        self.chain(acc, k0, k1)
        return acc

    def values(self, acc) -> np.ndarray:
        """The accumulator as (B, M, N) values: float32, or float64 for an fp64 output."""
        return np.ascontiguousarray(acc, dtype=np.float64 if self.out_format == "fp64"
                                    else np.float32)


class PackedOperands(Operands):
    """Operands for the register-blocked kernels of :mod:`mpt.kernels.gemm`: packed, zero-padded
    panels (A in row panels of :attr:`rows`, B in column panels of :attr:`cols`) and a padded
    accumulator. They compute Cᵀ = Bᵀ·Aᵀ instead when that pads less (the models that use them
    are symmetric in a and b, element by element). Subclasses set :attr:`rows` in
    :meth:`prepare` (0: not packed) and may hold a tuple of arrays per operand.
    """

    rows = 0
    cols = _gemm.COLS
    swap = False

    def orient(self) -> None:
        """Compute Cᵀ = Bᵀ·Aᵀ (``self.a``/``self.b`` become transposed views) if that pads less."""
        rows, cols = self.rows, self.cols
        self.swap = tiles(self.n, rows) * tiles(self.m, cols) < \
            tiles(self.m, rows) * tiles(self.n, cols)
        if self.swap:
            self.a, self.b = transposed(self.b), transposed(self.a)
            self.ia, self.ib = self.ib, self.ia

    def pack(self) -> None:
        """Orient and pack ``self.a``/``self.b`` (arrays or tuples of arrays; any strides)."""
        self.orient()
        self.a = _each(self.a, lambda x: _gemm.pack_rows(x, self.rows))
        self.b = _each(self.b, _gemm.pack_cols)

    @property
    def _shape(self) -> tuple[int, int]:
        """(rows, cols) of the computed product (N, M when swapped)."""
        return (self.n, self.m) if self.swap else (self.m, self.n)

    @property
    def padded_shape(self) -> tuple[int, int, int]:
        """(B, rows, cols) of the padded accumulator: whole tiles of the computed product."""
        rows, cols = self._shape
        return (self.batch_size, tiles(rows, self.rows) * self.rows,
                tiles(cols, self.cols) * self.cols)

    def _padded(self, c) -> np.ndarray:
        rows, cols = self._shape
        acc = np.zeros(self.padded_shape, self.acc_dtype)
        if c is not None:
            acc[:, :rows, :cols] = transposed(c) if self.swap else c
        return acc

    def new_acc(self, c=None) -> np.ndarray:
        if not self.rows:
            return super().new_acc(c)
        return self._padded(c)

    def values(self, acc) -> np.ndarray:
        if not self.rows:
            return super().values(acc)
        rows, cols = self._shape
        d = acc[:, :rows, :cols]
        return np.ascontiguousarray(transposed(d) if self.swap else d, dtype=np.float32)


def _each(x, fn):
    return tuple(fn(y) for y in x) if isinstance(x, tuple) else fn(x)


def roundings() -> tuple[str, ...]:
    """The names of the output roundings :func:`output_params` knows."""
    return tuple(_ROUNDINGS)


def output_params(rounding: str) -> tuple:
    """(significant bits, emin, largest finite value, round to nearest?) of an output rounding."""
    return _ROUNDINGS[rounding]


_ROUNDINGS = {
    "rz_fp32": (24, -126, float.fromhex("0x1.fffffep127"), False),
    "rz_e8m13": (14, -126, float.fromhex("0x1.fffcp127"), False),
    "rne_fp16": (11, -14, 65504.0, True),
    "rne_fp32": (24, -126, float.fromhex("0x1.fffffep127"), True),
}


def emin_pow2(fmt: str) -> float:
    """2^emin of a format: the nominal exponent of its subnormals."""
    return 2.0 ** get_format(fmt).emin
