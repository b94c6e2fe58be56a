"""L1: the block-FMA arithmetic kind ("block") — NVIDIA Tensor Cores' block model as an operand
class: operands decoded into (value, nominal power of two) pairs, chained in blocks of L products
(docs/tensor_cores.md; the presets are in :mod:`mpt.engines.nvidia`). Kernels:
:mod:`mpt.kernels.mma` (any inputs) and the register-blocked fast path of :mod:`mpt.kernels.gemm`.
Oracle: :mod:`mpt.reference.mma`.
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_int
from mpt.engines.operands import PackedOperands, emin_pow2, output_params, register_kind
from mpt.formats import get_format
from mpt.kernels import gemm as _gemm
from mpt.kernels import mma as _mma

__all__ = ["BlockOperands", "packable"]

_MAGNITUDE_LIMIT = 60   # the fast path's product range [2^-60, 2^60] (mpt.kernels.mma.block_chain)


#: output format -> the roundings a block of that output may end with
_BLOCK_ROUNDINGS = {"fp32": ("rz_fp32", "rz_e8m13"), "fp16": ("rne_fp16",)}


@register_kind("block")
class BlockOperands(PackedOperands):
    """The block model: operands decoded into (value, nominal power of two) pairs; the
    register-blocked kernel when the operands meet its conditions (finite, non-zero products in
    [2^-60, 2^60]; int32 partial sums of ``sum_chunk`` products), else the general kernel."""

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

    def prepare(self):
        cfg = self.cfg
        rounding, e_zero = cfg.output(self.out_format)
        precision, emin, largest, nearest = output_params(rounding)
        out = (2.0 ** emin, 2.0 ** (1 - precision), largest, nearest)
        self.params = (cfg.block, cfg.fraction_bits, 2.0 ** e_zero, out)
        if packable(self.a, self.b):
            self.rows = _gemm.BLOCK_ROWS
        self.a, self.b = self._decode(self.a, self.formats[0]), self._decode(self.b, self.formats[1])
        if self.rows:
            self.pack()

    def _decode(self, x32, fmt):
        """(values, nominal powers of two): float32 for the packed path, else float64."""
        dtype = np.float32 if self.rows else np.float64
        value, nominal = np.empty(x32.shape, dtype), np.empty(x32.shape, dtype)
        _mma.decode_terms(x32.ravel(), emin_pow2(fmt), value.ravel(), nominal.ravel())
        return value, nominal

    def new_acc(self, c=None):
        if not self.rows:
            return super().new_acc(c)
        if c is None:
            rows, cols = self._shape
            return np.zeros((self.batch_size, -(-rows // self.rows), -(-cols // _gemm.COLS),
                             self.rows * _gemm.COLS))
        return _gemm.pack_tiles(self._padded(c), self.rows)

    def chain(self, acc, k0, k1):
        if self.rows:
            block, fraction_bits = self.params[:2]
            _gemm.block_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, block,
                                     _gemm.sum_chunk(block, fraction_bits), *self.params[1:])
        else:
            _mma.block_chain(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, *self.params)

    def values(self, acc):
        if self.rows:
            rows, cols = self._shape
            acc = _gemm.unpack_tiles(acc, self.rows, rows, cols)
        return super().values(acc)


def packable(a, b) -> bool:
    """Whether operand values a and b (float32 or float64 arrays) meet the register kernel's
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
