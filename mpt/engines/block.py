"""L1: the block-FMA arithmetic kind ("block") — NVIDIA Tensor Cores' block model as an operand
class: operands chained in blocks of L products (docs/tensor_cores.md; the presets are in
:mod:`mpt.engines.nvidia`). Kernels: :mod:`mpt.kernels.mma` (any inputs) and the register-blocked
fast paths of :mod:`mpt.kernels.block_gemm` and :mod:`mpt.kernels.gemm`. Oracle:
:mod:`mpt.reference.mma`.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.engines.operands import (PackedOperands, emin_pow2, output_params, register_kind, tiles,
                                  transposed, values32)
from mpt.formats import get_format
from mpt.kernels import block_gemm as _block
from mpt.kernels import block_pack as _pack
from mpt.kernels import gemm as _gemm
from mpt.kernels import mma as _mma

__all__ = ["BlockOperands", "packable"]

_MAGNITUDE_LIMIT = 60   # the chunked kernel's product range [2^-60, 2^60] (mma.block_chain)

#: output format -> the roundings a block of that output may end with
_BLOCK_ROUNDINGS = {"fp32": ("rz_fp32", "rz_e8m13"), "fp16": ("rne_fp16",)}
#: the output roundings the tile kernels implement (mpt.kernels.block_gemm)
_TILE_ROUNDINGS = ("rz_fp32", "rz_e8m13", "rne_fp16")


@register_kind("block")
class BlockOperands(PackedOperands):
    """The block model, on one of four kernels (``mode``):

    * ``"tiles"``: the register-blocked tile kernel (``mpt.kernels.block_gemm.block_chain_packed``),
      8 x 64 output tiles;
    * ``"lanes"``: the same arithmetic with one independent dot product per lane
      (``block_chain_lanes``), for many small products, which tiles would pad (a batch of
      1 x 16 · 16 x 1 products fills 1 of a tile's 512 outputs);
    * ``"chunks"``: ``mpt.kernels.gemm.block_chain_packed`` on (value, nominal power of two)
      pairs, int32 partial sums of ``sum_chunk`` products — for operands the tile kernels do
      not take whose products lie in [2^-60, 2^60] (a block whose int32 sum could overflow:
      Blackwell's f8f6f4, 32 products with F = 25; the scale-folded block-scaled operands);
    * ``"general"``: ``mpt.kernels.mma.block_chain``, on operands decoded into float64 (value,
      nominal power of two) pairs, for everything else.

    The tile kernels run when a block's sums fit in int32, the output rounding is one of theirs,
    the input formats' products are exact in float32, the operands are finite and every non-zero
    product's nominal exponent lies in their window (``tile_params``); a chain whose c is not
    finite or could grow past the window, or a raised flag, falls back to the general kernel
    (same bits, slower)."""

    mode = "general"

    @classmethod
    def check_config(cls, cfg):
        """``block`` in [1, 32] and ``fraction_bits`` in [0, 25] (where the kernels' float64
        arithmetic is exact, mpt.kernels.mma), outputs fp32/fp16 with a block rounding and an
        ``e_zero`` in [-300, emin of the output) (a zero term must weigh less than any non-zero
        accumulator)."""
        check_int("block", cfg.block, min=1, max=32)
        check_int("fraction_bits", cfg.fraction_bits, min=0, max=25)
        for name, rounding, e_zero in cfg.outputs:
            if rounding not in _BLOCK_ROUNDINGS.get(name, ()):
                raise ValueError(f"each output of a block model must be ('fp32', 'rz_fp32' | "
                                 f"'rz_e8m13', e_zero) or ('fp16', 'rne_fp16', e_zero); got "
                                 f"{(name, rounding, e_zero)!r}")
            check_int(f"e_zero of output {name}", e_zero, min=-300,
                      max=get_format(name).emin - 1)

    def decode(self, x, fmt):
        """bf16 and fp16 operands stay as stored: the tile packers widen them as they read them
        (``mpt.kernels.gemm.source``), and :meth:`prepare` decodes them for the other kernels."""
        if (fmt, x.dtype.name) in (("bf16", "bfloat16"), ("fp16", "float16")):
            return x
        return super().decode(x, fmt)

    def prepare(self):
        cfg = self.cfg
        rounding, e_zero = cfg.output(self.out_format)
        precision, emin, largest, nearest = output_params(rounding)
        self.params = (cfg.block, cfg.fraction_bits, 2.0 ** e_zero,
                       (2.0 ** emin, 2.0 ** (1 - precision), largest, nearest))
        self.sources, self.index, self.terms = (self.a, self.b), (self.ia, self.ib), None
        if self._tiles_take(rounding) and \
                self._pack(e_zero, precision, emin, rounding == "rne_fp16"):
            return
        self.a, self.b = self.sources = tuple(values32(x, f)
                                              for x, f in zip(self.sources, self.formats))
        if packable(self.a, self.b):
            (fa, fb), dtype = self.formats, np.float32
            self.chunks(_decode(self.a, fa, dtype), _decode(self.b, fb, dtype))

    def _tiles_take(self, rounding) -> bool:
        """Whether the tile kernels implement this configuration: a block's terms sum in int32,
        an output rounding of theirs, and inputs of float formats whose products are exact in
        float32 (at most 24 significant bits between them)."""
        formats = [get_format(f) for f in self.formats]
        return _block.block_fits(self.cfg.block, self.cfg.fraction_bits) and \
            rounding in _TILE_ROUNDINGS and \
            all(f.kind == "float" and not f.levels for f in formats) and \
            sum(f.mantissa_bits + 1 for f in formats) <= 24

    def _lanes_pay(self) -> bool:
        """Whether one dot product per lane pads less than half as much as tiles do."""
        rows, cols = _block.BLOCK_ROWS, _block.BLOCK_COLS
        per_tiles = min(tiles(self.m, rows) * tiles(self.n, cols),
                        tiles(self.n, rows) * tiles(self.m, cols)) * rows * cols
        outputs = self.batch_size * self.m * self.n
        return 2 * tiles(outputs, cols) * cols < self.batch_size * per_tiles

    def _pack(self, e_zero, precision, emin, rne16) -> bool:
        """Pack for a tile kernel if the operands meet its conditions; whether they did."""
        lanes = self._lanes_pay()
        if not lanes:
            self.rows, self.cols = _block.BLOCK_ROWS, _block.BLOCK_COLS
            self.orient()
        ea, eb = (get_format(f).emin for f in (self.formats[::-1] if self.swap else self.formats))
        if lanes:   # lane panels, with the ranges found as they are packed
            values, (finite, ranges) = _pack.lane_values(self.a, self.b, self.ia, self.ib, ea, eb)
        else:       # tile panels, with the ranges read off them
            values, (finite, ranges) = _pack.pack_block_values(self.a, self.b, ea, eb)
        prm = np.zeros(8, np.int32)
        variant, shift_a, shift_b = _block.tile_params(
            self.cfg.block, self.cfg.fraction_bits, e_zero, precision, emin, rne16, *ranges,
            prm) if finite else (-1, 0, 0)
        if variant < 0:
            self.rows, self.cols, self.swap = 0, _gemm.COLS, False
            (self.a, self.b), (self.ia, self.ib) = self.sources, self.index
            return False
        self.prm, self.variant = prm, variant
        self.highest, self.c_low = ranges[1], self.cfg.fraction_bits - 125
        if lanes:
            self.mode = "lanes"
            self.a = _pack.lane_codes(*values, ea, eb, (shift_a, shift_b))
        else:
            self.mode = "tiles"
            codes = _pack.block_codes(*values, ea, eb, (shift_a, shift_b))
            self.a, self.b = zip(values, codes)
        self.acc_dtype = np.float32
        return True

    def chunks(self, a_terms, b_terms):
        """Run on the chunked kernel: pack the float32 (value, nominal power of two) pairs of A
        and of B (which :func:`packable` accepted)."""
        self.mode, self.rows = "chunks", _gemm.BLOCK_ROWS
        self.a, self.b = a_terms, b_terms
        self.pack()

    def new_acc(self, c=None):
        if self.mode == "chunks":
            if c is None:
                rows, cols = self._shape
                return np.zeros((self.batch_size, tiles(rows, self.rows), tiles(cols, self.cols),
                                 self.rows * self.cols))
            return _gemm.pack_tiles(self._padded(c), self.rows)
        if self.mode != "lanes":
            return super().new_acc(c)
        outputs = self.batch_size * self.m * self.n
        acc = np.zeros(tiles(outputs, _block.BLOCK_COLS) * _block.BLOCK_COLS, np.float32)
        if c is not None:
            acc[:outputs] = np.asarray(c, np.float32).reshape(-1)
        return acc

    def values(self, acc):
        if self.mode == "chunks":
            rows, cols = self._shape
            return super().values(_gemm.unpack_tiles(acc, self.rows, rows, cols))
        if self.mode != "lanes":
            return super().values(acc)
        return np.array(self._outputs(acc), dtype=np.float32)

    def _outputs(self, acc):
        """The (B, M, N) outputs of a tile or lane kernel's accumulator, as a view."""
        if self.mode == "lanes":
            return acc[:self.batch_size * self.m * self.n].reshape(self.batch_size, self.m,
                                                                     self.n)
        rows, cols = self._shape
        d = acc[:, :rows, :cols]
        return transposed(d) if self.swap else d

    def chain(self, acc, k0, k1):
        if self.mode == "general":
            self._general(acc, k0, k1)
            return
        if self.mode == "chunks":
            block, fraction_bits = self.params[:2]
            _gemm.block_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, block,
                                     _gemm.sum_chunk(block, fraction_bits), *self.params[1:])
            return
        start = self._chain_start(acc, k1 - k0)
        if start is not None and not self._fast(acc, k0, k1):
            return
        if start is not None:
            acc[...] = start
        d = self._outputs(acc)
        d64 = np.ascontiguousarray(d, dtype=np.float64)
        self._general(d64, k0, k1)
        d[...] = d64

    def _fast(self, acc, k0, k1) -> bool:
        """Run the tile or lane kernel; whether it raised the flag."""
        if self.mode == "lanes":
            return _block.block_chain_lanes(*self.a, acc, k0, k1, self.prm, self.variant)
        return _block.block_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1,
                                         self.prm, self.variant)

    def _chain_start(self, acc, k):
        """A copy of acc's c (0.0 when it is all zero) if the fast kernel may run a chain of k
        products from it — c finite, |c| + k·2^(highest+2) below 2^E_MAX (no block's anchor
        exceeds it) and, for RZ outputs, no non-zero |c| below 2^(F−125) — else None."""
        finite, largest, smallest = _pack.finite_range(acc)
        if not finite or largest + k * 2.0 ** (self.highest + 2) >= 2.0 ** _block.E_MAX or \
                (not self.variant & _block.RNE16 and 0 < smallest < 2.0 ** self.c_low):
            return None
        return acc.copy() if largest else 0.0

    def _general(self, acc, k0, k1):
        """The general kernel on a (B, M, N) float64 accumulator (the operands' float64 terms
        decoded on first use)."""
        if self.terms is None:
            (a, b), (fa, fb) = self.sources, self.formats
            self.terms = (*_decode(values32(a, fa), fa, np.float64),
                          *_decode(values32(b, fb), fb, np.float64))
        _mma.block_chain(*self.terms, acc, *self.index, k0, k1, *self.params)


def _decode(x32, fmt, dtype):
    """(values, nominal powers of two) of an operand's float32 values x32 as ``dtype``."""
    value, nominal = np.empty(x32.shape, dtype), np.empty(x32.shape, dtype)
    _mma.decode_terms(np.ascontiguousarray(x32).ravel(), emin_pow2(fmt), value.ravel(),
                      nominal.ravel())
    return value, nominal


def packable(a, b) -> bool:
    """Whether operand values a and b (float32 or float64 arrays) meet the chunked kernel's
    conditions: finite, below 2^128 (float32 holds them; every value mpt hands it is a multiple
    of 2^-149 with at most 24 significant bits, so exactly), and every non-zero |a_ik·b_kj|
    within [2^-60, 2^60]."""
    finite_a, lo_a, hi_a = _mma.magnitude_range(a)
    finite_b, lo_b, hi_b = _mma.magnitude_range(b)
    if not (finite_a and finite_b) or max(hi_a, hi_b) >= 2.0**128:
        return False
    if hi_a == 0 or hi_b == 0:
        return True   # every product is zero
    e = _MAGNITUDE_LIMIT
    return lo_a * lo_b >= 2.0 ** -e and hi_a * hi_b <= 2.0 ** e
