"""Tensor Core MMA models per GPU generation, and the GEMM around them.

**Hardware** (:func:`mma`): ``D = A·B + C`` as one GPU's Tensor Core computes it, bit for bit:
the block model of docs/tensor_cores.md — K consumed in blocks of L products in increasing k,
exact unnormalised products, every term truncated to F fraction bits below the largest exponent,
one rounding per block (RZ-FP32, RNE-FP16 or RZ-E8M13) whose result is the next block's C.
Presets: ``volta``, ``turing``, ``ampere``, ``ada``, ``hopper``, ``blackwell`` (aliases ``v100``,
``t4``, ``a100``, ``a2``, ``a30``, ``l40s``, ``rtx4090``, ``h100``, ``h200``, ``h800``, ``b200``),
plus ``ieee_fma`` (sequential IEEE FP32 FMA in increasing k: a CPU or CUDA-core loop),
``ieee_mul_add`` (product and sum rounded separately) and ``exact`` (the exact dot product
rounded once to nearest). :func:`mma_models` lists them with their parameters.

**Software** (:func:`gemm`): what a library adds around the instructions — the k-order of
split-K (partial sums reduced with IEEE FP32 adds), FP8 promotion of the partial accumulator
into an FP32 register every ``promote_every`` products (DeepSeek-V3: 128), dequantisation
scales, and the output cast (the epilogue).

NaN results are always the canonical NaN (0x7FFFFFFF / 0x7FFF), as on NVIDIA GPUs. Oracles:
``mpt.reference.mma`` (exact rationals) and the hardware samples in
``tests/data/tensor_core_dumps`` of the repository.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from mpt import rounding as _rounding
from mpt._checks import check_int
from mpt.formats import get_format
from mpt.kernels import gemm as _gemm
from mpt.kernels import mma as _mma
from mpt.kernels.fma import fma_array

__all__ = ["MMAConfig", "MMAModel", "mma_models", "get_mma_model", "mma", "gemm"]

# output rounding -> (significant bits, emin, largest finite value, round to nearest?)
_ROUNDINGS = {
    "rz_fp32": (24, -126, float.fromhex("0x1.fffffep127"), False),
    "rz_e8m13": (14, -126, float.fromhex("0x1.fffcp127"), False),
    "rne_fp16": (11, -14, 65504.0, True),
    "rne_fp32": (24, -126, float.fromhex("0x1.fffffep127"), True),
}


@dataclass(frozen=True)
class MMAConfig:
    """How a model computes for one family of input formats.

    ``inputs``: format names accepted for A and B (any combination of them); ``instruction``:
    the PTX instruction(s) modelled; ``block``: L, products per block (``None``: all of K at once,
    the exact model; 1: one product at a time, the IEEE models); ``fraction_bits``: F (None when
    not a block model); ``outputs``: (output format, rounding, e_zero) triples.
    """

    inputs: tuple[str, ...]
    instruction: str
    block: int | None
    fraction_bits: int | None
    outputs: tuple[tuple[str, str, int | None], ...]

    def __post_init__(self):
        """Check what the kernels rely on (a hand-built config reaches them unchanged): input
        formats known by their canonical names, ``block`` None or in [1, 32] and
        ``fraction_bits`` None or in [0, 25] (the range where the block model's float64
        arithmetic is exact, mpt.kernels.mma), outputs ``(fp32|fp16, rounding, e_zero)`` with
        ``e_zero`` None or an int in [-300, emin of the output) (a zero term must weigh less than
        any non-zero accumulator)."""
        if not isinstance(self.inputs, tuple) or not self.inputs or \
                any(get_format(f).name != f or get_format(f).kind != "float" for f in self.inputs):
            raise ValueError(f"inputs must be a non-empty tuple of float format names; got "
                             f"{self.inputs!r}")
        check_int("block", self.block, min=1, max=32, optional=True)
        check_int("fraction_bits", self.fraction_bits, min=0, max=25, optional=True)
        if not isinstance(self.outputs, tuple) or not self.outputs:
            raise ValueError(f"outputs must be a non-empty tuple of (format, rounding, e_zero); "
                             f"got {self.outputs!r}")
        for out in self.outputs:
            if not isinstance(out, tuple) or len(out) != 3 or out[0] not in ("fp32", "fp16") \
                    or out[1] not in _ROUNDINGS:
                raise ValueError(f"each output must be ('fp32' or 'fp16', one of "
                                 f"{', '.join(_ROUNDINGS)}, e_zero); got {out!r}")
            check_int(f"e_zero of output {out[0]}", out[2], min=-300,
                      max=get_format(out[0]).emin - 1, optional=True)

    def output(self, out_format: str) -> tuple[str, int | None]:
        """(rounding, e_zero) for an output format; ValueError naming the supported ones."""
        for name, rounding, e_zero in self.outputs:
            if name == out_format:
                return rounding, e_zero
        valid = ", ".join(repr(o[0]) for o in self.outputs)
        raise ValueError(f"out_format must be one of {valid} for {self.inputs} inputs; "
                         f"got {out_format!r}")


@dataclass(frozen=True)
class MMAModel:
    """A named MMA model: its kind ("block", "exact", "ieee_fma", "ieee_mul_add") and one
    :class:`MMAConfig` per family of input formats."""

    name: str
    kind: str
    description: str
    configs: tuple[MMAConfig, ...]
    aliases: tuple[str, ...] = ()

    def __post_init__(self):
        """A named kind with its configs' parameters: ``block`` and ``fraction_bits`` set (and
        ``e_zero`` on every output) for "block", ``block`` None for "exact", 1 for the IEEE
        kinds."""
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str; got {self.name!r}")
        want = {"block": "an int", "exact": None, "ieee_fma": 1, "ieee_mul_add": 1}
        if self.kind not in want:
            raise ValueError(f"kind must be one of {', '.join(map(repr, want))}; got "
                             f"{self.kind!r}")
        if not isinstance(self.configs, tuple) or not self.configs or \
                not all(isinstance(c, MMAConfig) for c in self.configs):
            raise TypeError(f"configs must be a non-empty tuple of MMAConfig; got "
                            f"{self.configs!r}")
        for cfg in self.configs:
            block_ok = cfg.block is not None and cfg.fraction_bits is not None and \
                all(e is not None for _, _, e in cfg.outputs) if self.kind == "block" else \
                cfg.block == want[self.kind]
            if not block_ok:
                raise ValueError(f"a {self.kind!r} model needs block = {want[self.kind]}"
                                 + (", fraction_bits and every e_zero" if self.kind == "block"
                                    else "") + f"; config {cfg.inputs} has block={cfg.block}, "
                                 f"fraction_bits={cfg.fraction_bits}")
        if not isinstance(self.aliases, tuple) or not all(isinstance(a, str) for a in self.aliases):
            raise TypeError(f"aliases must be a tuple of str; got {self.aliases!r}")

    @property
    def input_formats(self) -> tuple[str, ...]:
        return tuple(f for cfg in self.configs for f in cfg.inputs)

    def config(self, a_format: str, b_format: str) -> MMAConfig:
        """The configuration for these input formats; ValueError naming the supported ones."""
        for cfg in self.configs:
            if a_format in cfg.inputs and b_format in cfg.inputs:
                return cfg
        groups = "; ".join("/".join(cfg.inputs) for cfg in self.configs)
        raise ValueError(f"model {self.name!r} does not take inputs ({a_format}, {b_format}); "
                         f"it takes (mixable within a group): {groups}")

    def describe(self) -> dict:
        """The model as a JSON-ready dict."""
        return {"name": self.name, "aliases": list(self.aliases), "kind": self.kind,
                "description": self.description,
                "configs": [{"inputs": list(c.inputs), "instruction": c.instruction,
                             "block": c.block, "fraction_bits": c.fraction_bits,
                             "outputs": [{"format": o, "rounding": r, "e_zero": e}
                                         for o, r, e in c.outputs]} for c in self.configs]}


_FP8 = ("fp8_e4m3fn", "fp8_e5m2")
_F8F6F4 = _FP8 + ("fp6_e3m2fn", "fp6_e2m3fn", "fp4_e2m1fn")
_ANY = ("fp32", "tf32", "fp16", "bf16") + _F8F6F4 + ("fp8_e4m3fnuz", "fp8_e5m2fnuz")


def _outs(fp32_rounding, fp32_e_zero, fp16_e_zero=None):
    fp32 = (("fp32", fp32_rounding, fp32_e_zero),)
    return fp32 if fp16_e_zero is None else fp32 + (("fp16", "rne_fp16", fp16_e_zero),)


def _half(instruction, block, fraction_bits, outputs, formats=("fp16", "bf16")):
    """The same parameters for FP16 and for BF16 inputs (which the hardware does not mix)."""
    return tuple(MMAConfig((f,), instruction, block, fraction_bits, outputs) for f in formats)


# e_zero of the FP32 output is measured for Ampere/Ada (-132) and Hopper/Blackwell (-133). Volta
# and Turing take FP16 inputs only, whose products have nominal exponents >= -28, and a non-zero
# FP32 c has one >= -126, so any e_zero below -28 gives the same bits: -132 is used there.
_PRESETS = (
    MMAModel("volta", "block", "NVIDIA V100 Tensor Cores (sm_70)", _half(
        "mma.sync m8n8k4 (wmma 16x16x16 = four k4 steps)", 4, 23, _outs("rz_fp32", -132, -19),
        formats=("fp16",)), ("v100",)),
    MMAModel("turing", "block", "NVIDIA T4 Tensor Cores (sm_75)", _half(
        "mma.sync m16n8k8", 8, 24, _outs("rz_fp32", -132, -20), formats=("fp16",)), ("t4",)),
    MMAModel("ampere", "block", "NVIDIA A100/A30/A2 Tensor Cores (sm_80, sm_86)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20)) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132)),
    ), ("a100", "a30", "a2")),
    MMAModel("ada", "block", "NVIDIA L40S / RTX 4090 Tensor Cores (sm_89)", _half(
        "mma.sync m16n8k8; m16n8k16 = 2 blocks of 8", 8, 24, _outs("rz_fp32", -132, -20)) + (
        MMAConfig(("tf32",), "mma.sync m16n8k4; m16n8k8 = 2 blocks of 4", 4, 24,
                  _outs("rz_fp32", -132)),
        MMAConfig(_FP8, "mma.sync m16n8k16 fp8; m16n8k32 = 2 blocks of 16", 16, 13,
                  _outs("rz_e8m13", -132, -20)),
    ), ("l40s", "rtx4090")),
    MMAModel("hopper", "block", "NVIDIA H100/H200/H800 Tensor Cores (sm_90)", _half(
        "wgmma / mma.sync k16 (one block of 16)", 16, 25, _outs("rz_fp32", -133, -21)) + (
        MMAConfig(("tf32",), "wgmma / mma.sync k8 (one block of 8)", 8, 25, _outs("rz_fp32", -133)),
        MMAConfig(_FP8, "wgmma k32 (one block of 32)", 32, 13, _outs("rz_e8m13", -133)),
    ), ("h100", "h200", "h800")),
    MMAModel("blackwell", "block", "NVIDIA B200 Tensor Cores (sm_100)", _half(
        "tcgen05.mma kind::f16 (k16)", 16, 25, _outs("rz_fp32", -133, -21)) + (
        MMAConfig(("tf32",), "tcgen05.mma kind::tf32 (k8)", 8, 25, _outs("rz_fp32", -133)),
        MMAConfig(_F8F6F4, "tcgen05.mma kind::f8f6f4 (k32)", 32, 25, _outs("rz_fp32", -133)),
    ), ("b200",)),
    MMAModel("ieee_fma", "ieee_fma", "sequential IEEE FP32 fused multiply-add in increasing k "
             "(a CPU or CUDA-core loop; mpt's FP32 matmul)", (
        MMAConfig(_ANY, "fma.rn.f32 per k", 1, None, _outs("rne_fp32", None)),)),
    MMAModel("ieee_mul_add", "ieee_mul_add", "sequential IEEE FP32 multiply then add, each rounded "
             "(RNE), in increasing k", (
        MMAConfig(_ANY, "mul.rn.f32 + add.rn.f32 per k", 1, None, _outs("rne_fp32", None)),)),
    MMAModel("exact", "exact", "the exact dot product plus c, rounded once to nearest-even "
             "(the best any hardware could do)", (
        MMAConfig(_ANY, "exact sum, one rounding", None, None, (("fp32", "rne_fp32", None),
                                                                ("fp16", "rne_fp16", None))),)),
)

_BY_NAME = {key: m for m in _PRESETS for key in (m.name, *m.aliases)}


def mma_models() -> dict[str, MMAModel]:
    """Every preset by canonical name (aliases in ``MMAModel.aliases``), in generation order."""
    return {m.name: m for m in _PRESETS}


def get_mma_model(model) -> MMAModel:
    """A preset by name or alias (case-insensitive), or an :class:`MMAModel` passed through."""
    if isinstance(model, MMAModel):
        return model
    if not isinstance(model, str):
        raise TypeError(f"model must be a preset name or an MMAModel; got {type(model).__name__}")
    found = _BY_NAME.get(model.lower())
    if found is None:
        valid = ", ".join(f"{m.name} ({'/'.join(m.aliases)})" if m.aliases else m.name
                          for m in _PRESETS)
        raise ValueError(f"unknown MMA model {model!r}; valid models: {valid}")
    return found


# ---- operands -----------------------------------------------------------------------------------

def _input_formats(a, b, in_format):
    """(format of a, format of b) by name, checked against the arrays' dtypes."""
    if in_format is None:
        names = []
        for arg, x in (("a", a), ("b", b)):
            try:
                names.append(get_format(x.dtype).name)
            except ValueError:
                raise TypeError(f"{arg} has dtype {x.dtype}, which stores no mpt format") from None
    elif isinstance(in_format, (tuple, list)) and len(in_format) == 2:
        names = [get_format(f).name for f in in_format]
    elif isinstance(in_format, str):
        names = [get_format(in_format).name] * 2
    else:
        raise TypeError("in_format must be None, a format name or a pair of names; "
                        f"got {in_format!r}")
    for arg, x, name in (("a", a, names[0]), ("b", b, names[1])):
        if x.dtype != get_format(name).dtype:
            raise TypeError(f"{arg} must hold {name} values as {get_format(name).dtype}; "
                            f"got {x.dtype}")
    return names


def _values32(x, fmt):
    """The float32 values of an operand (tf32: the low 13 bits of the pattern dropped)."""
    if fmt == "tf32":
        return (np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.ascontiguousarray(x, dtype=np.float32)


def _batched(x, batch):
    """(flattened (B', R, C) array, (B,) index of each broadcast batch element into it)."""
    flat = np.ascontiguousarray(x).reshape((int(np.prod(x.shape[:-2])),) + x.shape[-2:])
    index = np.arange(flat.shape[0]).reshape(x.shape[:-2])
    return flat, np.ascontiguousarray(np.broadcast_to(index, batch)).ravel()


class _Operands:
    """A and B of one product, decoded once for one model, with ``chain(acc, k0, k1)``.

    The accumulator is what the model carries from k to k: float64 values of the output format
    for the block and exact models, float32 for the IEEE ones. The register-blocked kernels
    (ieee_fma, and the block model on operands that meet its fast conditions) work on packed,
    zero-padded panels and a padded accumulator; they compute C^T = B^T·A^T instead when that
    pads less (both models are symmetric in a and b, element by element).
    """

    def __init__(self, model, cfg, a, b, fa, fb, rounding, e_zero, batch):
        self.m, self.k, self.n = a.shape[-2], a.shape[-1], b.shape[-1]
        self.block = cfg.block
        a32, self.ia = _batched(_values32(a, fa), batch)
        b32, self.ib = _batched(_values32(b, fb), batch)
        self.path, self.rows, self.swap = model.kind, None, False
        if model.kind == "block":
            precision, emin, largest, nearest = _ROUNDINGS[rounding]
            out = (2.0 ** emin, 2.0 ** (1 - precision), largest, nearest)
            self.params = (cfg.block, cfg.fraction_bits, 2.0 ** e_zero, out)
            if cfg.block << (cfg.fraction_bits + 2) <= 1 << 31 and _products_in(a32, b32, 60):
                self.path, self.rows = "block_packed", _gemm.BLOCK_ROWS
            a32, b32 = self._decode(a32, fa), self._decode(b32, fb)
        elif model.kind == "exact":
            precision, emin, largest, _ = _ROUNDINGS[rounding]
            self.params = (precision, emin, largest)
        elif model.kind == "ieee_fma":
            self.rows = _gemm.ROWS
        if self.rows:
            self.swap = _tiles(self.n, self.rows) * _tiles(self.m, _gemm.COLS) < \
                _tiles(self.m, self.rows) * _tiles(self.n, _gemm.COLS)
            if self.swap:
                a32, b32 = _transposed(b32), _transposed(a32)
                self.ia, self.ib = self.ib, self.ia
            a32 = tuple(_gemm.pack_rows(x, self.rows) for x in a32) if self.path == "block_packed" \
                else _gemm.pack_rows(a32, self.rows)
            b32 = tuple(_gemm.pack_cols(x) for x in b32) if self.path == "block_packed" \
                else _gemm.pack_cols(b32)
        self.a, self.b = a32, b32

    def _decode(self, x32, fmt):
        """(values, nominal powers of two): float32 for the packed path, else float64."""
        dtype = np.float32 if self.path == "block_packed" else np.float64
        value, nominal = np.empty(x32.shape, dtype), np.empty(x32.shape, dtype)
        _mma.decode_terms(x32.ravel(), 2.0 ** get_format(fmt).emin, value.ravel(), nominal.ravel())
        return value, nominal

    @property
    def batch_size(self):
        return self.ia.size

    @property
    def work(self):
        """Products in the whole call (B·M·N·K)."""
        return self.batch_size * self.m * self.n * self.k

    def new_acc(self, c=None):
        """An accumulator holding c ((B, M, N) float32/float16 values) or +0."""
        dtype = np.float32 if self.path in ("ieee_fma", "ieee_mul_add") else np.float64
        rows, cols = (self.n, self.m) if self.swap else (self.m, self.n)
        if self.path == "block_packed" and c is None:
            return np.zeros((self.batch_size, _tiles(rows, self.rows), _tiles(cols, _gemm.COLS),
                             self.rows * _gemm.COLS))
        shape = (rows, cols)
        if self.rows:
            shape = (_tiles(rows, self.rows) * self.rows, _tiles(cols, _gemm.COLS) * _gemm.COLS)
        acc = np.zeros((self.batch_size,) + shape, dtype)
        if c is not None:
            acc[:, :rows, :cols] = _transposed(c) if self.swap else c
        return _gemm.pack_tiles(acc, self.rows) if self.path == "block_packed" else acc

    def chain(self, acc, k0, k1):
        """Run the model over k in [k0, k1), in place (k0, k1 multiples of the block or K)."""
        if self.path == "block_packed":
            _gemm.block_chain_packed(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, *self.params)
        elif self.path == "block":
            _mma.block_chain(*self.a, *self.b, acc, self.ia, self.ib, k0, k1, *self.params)
        elif self.path == "exact":
            _mma.exact_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1, *self.params)
        elif self.path == "ieee_mul_add":
            _mma.mul_add_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1)
        else:
            _gemm.fma_chain(self.a, self.b, acc, self.ia, self.ib, k0, k1)

    def values(self, acc):
        """The accumulator as (B, M, N) float32 values."""
        rows, cols = (self.n, self.m) if self.swap else (self.m, self.n)
        if self.path == "block_packed":
            acc = _gemm.unpack_tiles(acc, self.rows, rows, cols)
        d = acc[:, :rows, :cols]
        return np.ascontiguousarray(_transposed(d) if self.swap else d, dtype=np.float32)


def _transposed(x):
    """(B, R, C) -> (B, C, R), or each array of a tuple."""
    if isinstance(x, tuple):
        return tuple(_transposed(y) for y in x)
    return x.transpose(0, 2, 1)


def _products_in(a, b, e):
    """Whether a and b are finite and every non-zero |a_ik·b_kj| lies in [2^-e, 2^e]."""
    finite_a, lo_a, hi_a = _mma.magnitude_range(a)
    finite_b, lo_b, hi_b = _mma.magnitude_range(b)
    if not (finite_a and finite_b):
        return False
    if hi_a == 0 or hi_b == 0:
        return True   # every product is zero
    return lo_a * lo_b >= 2.0 ** -e and hi_a * hi_b <= 2.0 ** e


def _tiles(n, size):
    return -(-n // size)


def _prepare(a, b, c, model, in_format, out_format):
    """Validate the arguments shared by mma and gemm; returns (operands, c as (B, M, N), shape)."""
    model = get_mma_model(model)
    a, b = np.asarray(a), np.asarray(b)
    for arg, x, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., K, N)")):
        if x.ndim < 2:
            raise ValueError(f"{arg} must have shape {dims}; got shape {x.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a (..., M, K) and b (..., K, N) disagree on K: {a.shape} and {b.shape}")
    fa, fb = _input_formats(a, b, in_format)
    cfg = model.config(fa, fb)
    out_name = get_format(out_format).name
    rounding, e_zero = cfg.output(out_name)
    m, n = a.shape[-2], b.shape[-1]
    batch_dims = [a.shape[:-2], b.shape[:-2]]
    if c is not None:
        c = np.asarray(c)
        want = get_format(out_name).dtype
        if c.dtype != want:
            raise TypeError(f"c must be {want} for {out_name} output; got {c.dtype}")
        if c.ndim < 2:
            c = c.reshape((1,) * (2 - c.ndim) + c.shape)
        batch_dims.append(c.shape[:-2])
    try:
        batch = np.broadcast_shapes(*batch_dims)
        if c is not None:
            c = np.broadcast_to(c, batch + (m, n))
    except ValueError:
        shapes = ", ".join(str(s) for s in (a.shape, b.shape) + (() if c is None else (c.shape,)))
        raise ValueError(f"a, b (and c) batch dimensions do not broadcast: {shapes}") from None
    with _mma.threads_for(int(np.prod(batch)) * m * n * a.shape[-1]):
        ops = _Operands(model, cfg, a, b, fa, fb, rounding, e_zero, batch)
    c3 = None if c is None else c.reshape((-1, m, n))
    return ops, c3, batch + (m, n)


def _canonical_nan(x):
    """Write the canonical NaN (sign 0, all other bits 1) over every NaN of a float32/16 array."""
    bits = x.view(np.uint32 if x.dtype == np.float32 else np.uint16)
    bits[np.isnan(x)] = np.iinfo(bits.dtype).max >> 1
    return x


def _ieee_values(fn):
    """Run fn with numpy's overflow/invalid warnings off: Inf and NaN (signalling ones included)
    are values that the models define, not errors."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with np.errstate(over="ignore", invalid="ignore"):
            return fn(*args, **kwargs)
    return wrapped


@_ieee_values
def mma(a, b, c=None, *, model, in_format=None, out_format=None):
    """D = A·B + C with one MMA model, the whole K chained in blocks as the hardware does.

    a: (..., M, K), b: (..., K, N) arrays of the input format's dtype — float16, bfloat16,
    float8_e4m3fn / float8_e5m2 (mixable), fp6/fp4 (Blackwell), or float32 with
    ``in_format="tf32"`` (the low 13 bits are dropped, toward zero) or with an IEEE/exact model.
    ``in_format``: None (from the dtypes), a name, or a pair of names for (a, b).
    c: (..., M, N) float32 (FP32 output) or float16 (FP16 output), or None for +0; leading batch
    dimensions broadcast. ``out_format``: "fp32" or "fp16" (None: c's dtype, else "fp32").

    Precision contract: K is consumed in blocks of the model's L in increasing k; each block is
    the truncated fused dot-product-add of the spec and its result, rounded to the output
    (RZ-FP32, RZ-E8M13 for Ada/Hopper FP8, RNE-FP16), is the next block's c. ``ieee_fma`` and
    ``ieee_mul_add`` round at every k (RNE), ``exact`` once. Returns float32 or float16 D with
    canonical NaNs. Raises ValueError for input/output formats the model does not support.
    Oracle: ``mpt.reference.mma.mma_reference``; hardware: tests/test_mma_hardware.py.
    """
    if out_format is None:
        out_format = "fp16" if c is not None and np.asarray(c).dtype == np.float16 else "fp32"
    ops, c3, shape = _prepare(a, b, c, model, in_format, out_format)
    acc = ops.new_acc(c3)
    with _mma.threads_for(ops.work):
        ops.chain(acc, 0, ops.k)
    d = ops.values(acc)
    if get_format(out_format).name == "fp16":
        d = d.astype(np.float16)  # exact: the values are FP16 numbers
    return _canonical_nan(d).reshape(shape)


def _scale(s, arg, rows, cols, group):
    """A scale as ("tensor", float32) or ("block", float32 array of shape (rows, cols)).

    Python numbers are rounded to float32 (RNE); arrays must already be float32.
    """
    if isinstance(s, (int, float)) and not isinstance(s, bool):
        return "tensor", np.float32(s)
    if not isinstance(s, (np.ndarray, np.generic)) or s.dtype != np.float32:
        raise TypeError(f"{arg} must be a Python number or float32; got {type(s).__name__} "
                        f"{getattr(s, 'dtype', '')}".rstrip())
    if s.size == 1 and s.ndim <= 1:
        return "tensor", s.reshape(())[()]
    if s.ndim == 2 and group is not None and s.shape == (rows, cols):
        return "block", s
    need = "a scalar (per tensor)"
    if group is not None:
        need += f" or an array of shape {(rows, cols)} (per block)"
    else:
        need += "; per-block scales need promote_every (the scale block size along K)"
    raise ValueError(f"{arg} must be {need}; got shape {s.shape}")


@_ieee_values
def gemm(a, b, c=None, *, model, split_k=1, promote_every=None, scale_a=None, scale_b=None,
         out_format="fp32", in_format=None, accumulate="fp32"):
    """A GEMM as a GPU library runs it on one MMA model: the software around the Tensor Core.

    a (..., M, K), b (..., K, N), c (..., M, N) and ``in_format`` as in :func:`mma`; batch
    dimensions broadcast. Per output element, in this order:

    1. **split-K**: K is cut into ``split_k`` chunks of ceil(K/split_k) products rounded up to
       a multiple of the block L (of ``promote_every`` when given); each chunk runs on its own
       accumulator starting at +0, and the chunk results are added in chunk order with IEEE FP32
       adds (RNE), as a split-K reduction on CUDA cores.
    2. **promotion** (``promote_every=G``, a multiple of L): inside a chunk, every G products the
       MMA partial (started at +0) is added into an FP32 register with an IEEE ``fma(s, partial,
       register)`` — s = 1, or the block scale. DeepSeek-V3 uses G = 128 for Hopper FP8 (whose
       e8m13 partial otherwise keeps ~14 bits); None chains the whole chunk ("fast accumulation").
    3. **scales**: per tensor (``scale_a``/``scale_b`` scalars): D = fma(alpha, D, c) with
       alpha = RN32(scale_a·scale_b), at the end; per block (DeepSeek-V3: ``scale_a`` (M, K/G) for
       1×G tiles of A, ``scale_b`` (K/G, N/G) for G×G tiles of B): s = RN32(sa[i,g]·sb[g,j//G])
       multiplies each promoted partial (a per-tensor partner is folded into s).
    4. **c**: the MMA's C of the first chunk (no promotion), or the initial FP32 register (with
       promotion); with per-tensor scales it is added by the final fma instead (cuBLASLt's beta·C).
    5. **epilogue**: ``out_format`` "fp32" returns the FP32 accumulator; "fp16"/"bf16" round it
       once, RNE — what cuBLAS does with CUBLAS_COMPUTE_32F and a half output.

    ``accumulate="fp16"`` instead runs the Tensor Core's own FP16-output mode (RNE-FP16 after
    every block; c must be float16; no split-K, promotion or scales): FP16 accumulation, which is
    NOT the same as FP32 accumulation followed by an FP16 epilogue. With the defaults, ``gemm``
    returns exactly what :func:`mma` returns. Oracle: ``mpt.reference.mma.gemm_reference``.
    """
    if accumulate not in ("fp32", "fp16"):
        raise ValueError(f"accumulate must be 'fp32' or 'fp16'; got {accumulate!r}")
    out_name = get_format(out_format).name
    if out_name not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"out_format must be 'fp32', 'fp16' or 'bf16'; got {out_format!r}")
    split_k = check_int("split_k", split_k, min=1)
    promote_every = check_int("promote_every", promote_every, min=1, optional=True)
    scaled = scale_a is not None or scale_b is not None
    if accumulate == "fp16" and (split_k != 1 or promote_every is not None or scaled):
        raise ValueError("accumulate='fp16' models the Tensor Core's FP16 output mode alone: "
                         "split_k, promote_every and scales need accumulate='fp32'")
    ops, c3, shape = _prepare(a, b, c, model, in_format, accumulate)
    unit = promote_every or ops.block or 1
    if promote_every is not None and ops.block and promote_every % ops.block:
        raise ValueError(f"promote_every must be a multiple of the model's block of {ops.block} "
                         f"products; got {promote_every}")
    m, k, n = ops.m, ops.k, ops.n
    if k == 0:
        promote_every = None  # no products: nothing to promote, D = c (or +0)
    kg = _tiles(k, promote_every) if promote_every else 0
    sa = None if scale_a is None else _scale(scale_a, "scale_a", m, kg, promote_every)
    sb = None if scale_b is None else _scale(scale_b, "scale_b", kg, _tiles(n, promote_every or 1),
                                             promote_every)
    c_at_end = scaled and not any(s is not None and s[0] == "block" for s in (sa, sb))
    step = max(unit, _tiles(_tiles(k, split_k), unit) * unit)
    with _mma.threads_for(ops.work):
        d = None
        for k0 in range(0, max(k, 1), step):
            own_c = c3 if (k0 == 0 and not c_at_end) else None
            part = _chunk(ops, k0, min(k0 + step, k), own_c, promote_every, sa, sb)
            d = part if d is None else d + part                     # IEEE FP32 adds (RNE)
        if c_at_end:
            alpha = np.float32(1.0)
            for s in (sa, sb):
                alpha = alpha * (np.float32(1.0) if s is None else s[1])
            d = fma_array(alpha, d, np.float32(-0.0) if c3 is None else c3.astype(np.float32))
    d = _canonical_nan(d)
    if out_name != "fp32":
        d = _canonical_nan(_rounding.round(d, out_name))            # RNE, one rounding
    return d.reshape(shape)


def _chunk(ops, k0, k1, c, promote_every, sa, sb):
    """One split-K chunk [k0, k1) as (B, M, N) float32: the MMA chain from c (or +0), or, with
    promotion, MMA partials from +0 fused into an FP32 register that starts at c (or −0, so
    that the first partial enters it unchanged)."""
    if promote_every is None:
        acc = ops.new_acc(c)
        ops.chain(acc, k0, k1)
        return ops.values(acc)
    register = np.full((ops.batch_size, ops.m, ops.n), -0.0, np.float32) if c is None \
        else c.astype(np.float32)
    for g0 in range(k0, k1, promote_every):
        acc = ops.new_acc()
        ops.chain(acc, g0, min(g0 + promote_every, k1))
        s = _block_scale(sa, sb, g0 // promote_every, promote_every, ops.m, ops.n)
        register = fma_array(s, ops.values(acc), register)
    return register


def _block_scale(sa, sb, g, group, m, n):
    """The (M, N) float32 scale of K-block g: RN32(sa[i, g]·sb[g, j // group]), or 1."""
    if not any(s is not None and s[0] == "block" for s in (sa, sb)):
        return np.float32(1.0)
    rows = np.float32(1.0) if sa is None else (sa[1][:, g:g + 1] if sa[0] == "block" else sa[1])
    cols = np.float32(1.0) if sb is None else (
        np.repeat(sb[1][g], group)[:n][None, :] if sb[0] == "block" else sb[1])
    return np.broadcast_to(rows * cols, (m, n)).astype(np.float32)
