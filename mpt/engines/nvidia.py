"""L1: NVIDIA Tensor Cores — the block-FMA model and its presets per GPU generation.

The model (docs/tensor_cores.md): K is consumed in blocks of L products in increasing k; each
product is exact and not renormalised; every term (c included) is truncated to F fraction bits
below the largest exponent of the block (a zero term counts with the exponent e_zero); the exact
sum is rounded once per block — RZ-FP32, RZ-E8M13 (Ada/Hopper FP8) or RNE-FP16 — and is the next
block's c. Kernels: :mod:`mpt.kernels.mma` (any inputs) and the register-blocked fast paths of
:mod:`mpt.kernels.block_gemm`. Oracle: :mod:`mpt.reference.mma`; hardware: the vendored
V100/A100/H100 samples (tests/test_mma_hardware.py).

Evidence: the FP16/BF16/TF32 configurations of Volta, Ampere and Hopper reproduce every row of
the real-GPU samples (hardware-verified); Turing, Ada, Blackwell and every FP8 configuration
follow the bit-accurate models of MMA-Sim (Xie et al., arXiv:2511.10909) and of Khattak and
Mikaitis (arXiv:2512.07004), which their authors checked on those GPUs (reference model).
"""
from __future__ import annotations

import numpy as np

from mpt.engines.model import MMAConfig, MMAModel, register_model
from mpt.engines.operands import PackedOperands, emin_pow2, output_params, register_kind, \
    tiles, transposed
from mpt.formats import get_format
from mpt.kernels import block_gemm as _block
from mpt.kernels import mma as _mma

__all__ = ["PRESETS", "BlockOperands", "FP8", "F8F6F4"]

FP8 = ("fp8_e4m3fn", "fp8_e5m2")
F8F6F4 = FP8 + ("fp6_e3m2fn", "fp6_e2m3fn", "fp4_e2m1fn")

@register_kind("block")
class BlockOperands(PackedOperands):
    """The block model, on one of three kernels (``mode``):

    * ``"tiles"``: the register-blocked kernel (``mpt.kernels.block_gemm.block_chain_packed``),
      8 x 64 output tiles;
    * ``"lanes"``: the same arithmetic with one independent dot product per lane
      (``block_chain_lanes``), for many small products, which tiles would pad (a batch of
      1 x 16 · 16 x 1 products fills 1 of a tile's 512 outputs);
    * ``"general"``: ``mpt.kernels.mma.block_chain``, on operands decoded into (value, nominal
      power of two), for everything else.

    The fast kernels run when a block's sums fit in int32, the operands are finite and every
    non-zero product's nominal exponent lies in their window (``tile_params``); a chain whose c
    is not finite or could grow past the window, or a raised flag, falls back to the general
    kernel (same bits, slower)."""

    mode = "general"

    def prepare(self):
        cfg = self.cfg
        rounding, e_zero = cfg.output(self.out_format)
        precision, emin, largest, nearest = output_params(rounding)
        self.params = (cfg.block, cfg.fraction_bits, 2.0 ** e_zero,
                       (2.0 ** emin, 2.0 ** (1 - precision), largest, nearest))
        self.sources = (self.a, self.b, self.ia, self.ib)
        self.decoded = None
        if _block.block_fits(cfg.block, cfg.fraction_bits):
            self._pack(e_zero, precision, emin, nearest)

    def _lanes_pay(self) -> bool:
        """Whether one dot product per lane pads less than half as much as tiles do."""
        rows, cols = _block.BLOCK_ROWS, _block.BLOCK_COLS
        per_tiles = min(tiles(self.m, rows) * tiles(self.n, cols),
                        tiles(self.n, rows) * tiles(self.m, cols)) * rows * cols
        outputs = self.batch_size * self.m * self.n
        return 2 * tiles(outputs, cols) * cols < self.batch_size * per_tiles

    def _pack(self, e_zero, precision, emin, rne16):
        """Pack for a fast kernel if the operands meet its conditions."""
        lanes = self._lanes_pay()
        if not lanes:
            self.rows, self.cols = _block.BLOCK_ROWS, _block.BLOCK_COLS
            self.orient()
        ea, eb = (get_format(f).emin for f in (self.formats[::-1] if self.swap else self.formats))
        finite, ranges = _block.operand_ranges(self.a, self.b, ea, eb)
        prm = np.zeros(8, np.int32)
        variant, shift_a, shift_b = _block.tile_params(
            self.cfg.block, self.cfg.fraction_bits, e_zero, precision, emin, rne16, *ranges,
            prm) if finite else (-1, 0, 0)
        if variant < 0:
            self.rows, self.swap = 0, False
            self.a, self.b, self.ia, self.ib = self.sources
            return
        self.prm, self.variant = prm, variant
        self.highest, self.c_low = ranges[1], self.cfg.fraction_bits - 125
        if lanes:
            self.mode = "lanes"
            self.a = _block.pack_lanes(self.a, self.b, self.ia, self.ib, ea, eb,
                                       (shift_a, shift_b))
        else:
            self.mode = "tiles"
            self.a = _block.pack_block_rows(self.a, ea, shift_a)
            self.b = _block.pack_block_cols(self.b, eb, shift_b)
        self.acc_dtype = np.float32

    def new_acc(self, c=None):
        if self.mode != "lanes":
            return super().new_acc(c)
        outputs = self.batch_size * self.m * self.n
        acc = np.zeros(tiles(outputs, _block.BLOCK_COLS) * _block.BLOCK_COLS, np.float32)
        if c is not None:
            acc[:outputs] = np.asarray(c, np.float32).reshape(-1)
        return acc

    def values(self, acc):
        if self.mode != "lanes":
            return super().values(acc)
        return np.array(self._outputs(acc), dtype=np.float32)

    def _outputs(self, acc):
        """The (B, M, N) outputs of a fast kernel's accumulator, as a view."""
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
        """Run the fast kernel; whether it raised the flag."""
        if self.mode == "lanes":
            return _block.block_chain_lanes(*self.a, acc, k0, k1, self.prm, self.variant)
        return _block.block_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1,
                                         self.prm, self.variant)

    def _chain_start(self, acc, k):
        """A copy of acc's c (0.0 when it is all zero) if the fast kernel may run a chain of k
        products from it — c finite, |c| + k·2^(highest+2) below 2^E_MAX (no block's anchor
        exceeds it) and, for RZ outputs, no non-zero |c| below 2^(F−125) — else None."""
        finite, largest, smallest = _block.finite_range(acc)
        if not finite or largest + k * 2.0 ** (self.highest + 2) >= 2.0 ** _block.E_MAX or \
                (not self.variant & _block.RNE16 and 0 < smallest < 2.0 ** self.c_low):
            return None
        return acc.copy() if largest else 0.0

    def _general(self, acc, k0, k1):
        """The general kernel on a (B, M, N) float64 accumulator."""
        if self.decoded is None:
            a, b, _, _ = self.sources
            self.decoded = (*_decode(a, self.formats[0]), *_decode(b, self.formats[1]))
        _mma.block_chain(*self.decoded, acc, *self.sources[2:], k0, k1, *self.params)


def _decode(x32, fmt):
    """(values, nominal powers of two) as float64 for the general kernel."""
    value, nominal = np.empty(x32.shape), np.empty(x32.shape)
    _mma.decode_terms(np.ascontiguousarray(x32).ravel(), emin_pow2(fmt), value.ravel(),
                      nominal.ravel())
    return value, nominal


def _outs(fp32_rounding, fp32_e_zero, fp16_e_zero=None):
    fp32 = (("fp32", fp32_rounding, fp32_e_zero),)
    return fp32 if fp16_e_zero is None else fp32 + (("fp16", "rne_fp16", fp16_e_zero),)


def _half(instruction, block, fraction_bits, outputs, formats=("fp16", "bf16"), **kw):
    """The same parameters for FP16 and for BF16 inputs (which the hardware does not mix)."""
    return tuple(MMAConfig((f,), instruction, block, fraction_bits, outputs, **kw)
                 for f in formats)


_VERIFIED = {"evidence": "hardware-verified"}

# e_zero of the FP32 output is measured for Ampere/Ada (-132) and Hopper/Blackwell (-133). Volta
# and Turing take FP16 inputs only, whose products have nominal exponents >= -28, and a non-zero
# FP32 c has one >= -126, so any e_zero below -28 gives the same bits: -132 is used there.
PRESETS = tuple(register_model(m) for m in (
    MMAModel("volta", "block", "NVIDIA V100 Tensor Cores (sm_70)", _half(
        "mma.sync m8n8k4 (wmma 16x16x16 = four k4 steps)", 4, 23, _outs("rz_fp32", -132, -19),
        formats=("fp16",), **_VERIFIED), ("v100",)),
    MMAModel("turing", "block", "NVIDIA T4 Tensor Cores (sm_75)", _half(
        "mma.sync m16n8k8", 8, 24, _outs("rz_fp32", -132, -20), formats=("fp16",)), ("t4",)),
    MMAModel("ampere", "block", "NVIDIA A100/A30/A2 Tensor Cores (sm_80, sm_86)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20),
        **_VERIFIED) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132), **_VERIFIED),
    ), ("a100", "a30", "a2")),
    MMAModel("ada", "block", "NVIDIA L40S / RTX 4090 Tensor Cores (sm_89)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20)) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132)),
        MMAConfig(FP8, "mma.sync m16n8k16 fp8; m16n8k32 = 2 blocks of 16", 16, 13,
                  _outs("rz_e8m13", -132, -20)),
    ), ("l40s", "rtx4090")),
    MMAModel("hopper", "block", "NVIDIA H100/H200/H800 Tensor Cores (sm_90)", _half(
        "wgmma / mma.sync k16 (one block of 16)", 16, 25, _outs("rz_fp32", -133, -21),
        **_VERIFIED) + (
        MMAConfig(("tf32",), "wgmma / mma.sync k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133),
                  **_VERIFIED),
        MMAConfig(FP8, "wgmma k32 (one block of 32)", 32, 13, _outs("rz_e8m13", -133)),
    ), ("h100", "h200", "h800")),
    MMAModel("blackwell", "block", "NVIDIA B200 Tensor Cores (sm_100)", _half(
        "tcgen05.mma kind::f16 (k16)", 16, 25, _outs("rz_fp32", -133, -21)) + (
        MMAConfig(("tf32",), "tcgen05.mma kind::tf32 (k8)", 8, 25, _outs("rz_fp32", -133)),
        MMAConfig(F8F6F4, "tcgen05.mma kind::f8f6f4 (k32)", 32, 25, _outs("rz_fp32", -133)),
    ), ("b200",)),
))
