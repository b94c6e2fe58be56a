"""L1: AWS Trainium (NeuronCore-v2 and later) — cFP8 formats, the MMA model ``trainium`` (the
matrix engine with FP32 PSUM) and ``trainium_autocast`` (the compiler's ``--auto-cast matmult``
around it): documented, with assumptions.

What the Neuron documentation fixes (aws-neuron-sdk, read at commit 1db4d74e and later):

* **Formats** (``about-neuron/arch/neuron-features/data-types.rst``, "NeuronCore v2 Data
  Types"): FP32, TF32, BF16, FP16, "8-bit Floating point with configurable range and precision
  (cFP8)" with the layouts FP8_e5m2 (1/5/2), FP8_e4m3 (1/4/3), FP8_e3m4 (1/3/4), and UINT8. The
  page gives no encoding of Inf, NaN or the largest value. NKI's type pages say
  ``nki.language.float8_e4m3`` is "8-bit floating-point number (1S,4E,3M)" while
  ``float8_e4m3fn`` is "no inf, NaN represented by 0bS111'1111, Extended range"; the compiler's
  error NCC_EVRF051 says F8E4M3FN is not supported on Trn1/Trn2 and converts it to F8E4M3 (XLA's
  IEEE-like type). :func:`cfp8_format` therefore defaults to the IEEE-like encoding, labelled.
* **Matmul** (``nki.isa.nc_matmul``; the mixed-precision app note "neuronx-cc-training-mixed-
  precision"): the matrix engine takes fp8/bf16/fp16/tf32/fp32 inputs; "the matmul accumulation
  and results are always in float32"; the contraction (partition) dimension of one instruction
  is at most 128 (a 128x128 systolic array); "if the contraction dimension exceeds 128, you may
  accumulate multiple nc_matmul instruction output tiles into the same PSUM tile".
* **Rounding** (``rounding-modes.rst``): RNE by default; ``NEURON_RT_STOCHASTIC_ROUNDING_EN=1``
  selects stochastic rounding ("round up or down using a proportional probability"). It is on by
  default when ``XLA_USE_BF16`` or ``XLA_DOWNCAST_BF16`` is set (libneuronxla sets the variable
  to 1 then; the "Migration from XLA_USE_BF16/XLA_DOWNCAST_BF16" page says so), off otherwise.
  Those two variables are deprecated since Neuron 2.23 (``model.to(torch.bfloat16)`` plus
  ``NEURON_RT_STOCHASTIC_ROUNDING_EN=1`` replaces them). ``NEURON_RT_STOCHASTIC_ROUNDING_SEED``
  seeds the generator, which is not documented.
* **Auto-cast** (the ``neuronx-cc`` CLI reference): ``--auto-cast`` = ``matmult`` ("only cast
  FP32 operations that use the Neuron matrix-multiplication engine"), ``all`` ("cast all FP32
  operations"), ``none`` ("leave all data types as defined in the model");
  ``--auto-cast-type`` = ``bf16`` (default), ``fp16``, ``tf32``, ``fp8_e4m3``. The default of
  ``--auto-cast`` was ``matmult`` up to Neuron 2.26 and is ``none`` since Neuron 2.27 (compiler
  2.15.54, Dec 2025), which also turned ``--enable-mixed-precision-accumulation`` on by
  default. The compiler never casts the model's input/output tensors.

Assumptions (each a parameter; choices listed where it is taken):

* cFP8 special values — :func:`cfp8_format` ``specials`` = "ieee" | "fn" | "none" (the names
  ``cfp8_{e5m2|e4m3|e3m4}[_fn|_none][_bias{b}]`` are found by ``mpt.get_format``).
* the order and internal precision inside one 128-deep pass — the models' assumption
  ``pass_order`` = "sequential_fma" | "sequential_mul_add" | "exact"
  (``get_mma_model("trainium").configure(pass_order="exact")``). FP32 operands are taken as
  exact values (whether the PE array decomposes FP32 is not documented).
* what auto-cast does to the matmul's FP32 result — ``trainium_autocast``'s assumption
  ``auto_cast_result`` = "fp32" | "cast".
* the random source of stochastic rounding, and which roundings it applies to — a conversion
  rule of the targets trn1/trn2 (``mpt.targets``): mpt's Philox stream, on every FP32 -> bf16
  result of an op.

``mpt.mma(a, b, c, model="trainium")`` is the engine: K in passes of ``tile_k`` (option,
default 128) into PSUM. ``mpt.gemm(a, b, c, model="trainium_autocast")`` takes fp32 operands and
casts them first, as the compiler does (software: ``mpt.mma`` refuses it). Oracle:
``mpt.reference.trainium`` (the tiling rule one element at a time on exact rationals); the
formats against ``mpt.reference.rounding`` and ml_dtypes.
"""
from __future__ import annotations

import re

import numpy as np

from mpt import rounding as _rounding
from mpt.engines.model import Assumption, MMAConfig, MMAModel, get_mma_model, register_model
from mpt.engines.operands import Operands, operands_class, register_kind
from mpt.formats import Format, custom_format, get_format, register_format_names

__all__ = ["CFP8_LAYOUTS", "CFP8_SPECIALS", "cfp8_format", "PE_ROWS", "PASS_ORDERS",
           "AUTO_CAST_TYPES", "TrainiumOperands", "MODELS"]

#: cFP8 layouts of the Neuron data-types page: name -> (exponent bits, mantissa bits).
CFP8_LAYOUTS = {"e5m2": (5, 2), "e4m3": (4, 3), "e3m4": (3, 4)}
#: Encodings of the top exponent field (not documented by Neuron; see :func:`cfp8_format`).
CFP8_SPECIALS = ("ieee", "fn", "none")


def cfp8_format(layout, *, specials="ieee", bias=None) -> Format:
    """One of Trainium's cFP8 formats as an mpt custom format (values stored as float32).

    layout: "e5m2", "e4m3" or "e3m4" (documented bit layouts). ``specials`` — **assumption**,
    Neuron does not document the encodings:

    * "ieee" (default): the all-ones exponent holds ±Inf and NaN, as XLA's F8E5M2 / F8E4M3 /
      F8E3M4 and ml_dtypes' float8_e5m2 / float8_e4m3 / float8_e3m4 (max 57344 / 240 / 15.5);
      inferred from NKI naming float8_e4m3 apart from the "no inf" float8_e4m3fn;
    * "fn": no Inf, only S.1…1.1…1 is NaN (ml_dtypes float8_e4m3fn for e4m3: max 448);
    * "none": every code is a finite number (no Inf, no NaN).

    ``bias``: "configurable range" — the exponent bias (default 2^(e−1) − 1); documented as
    configurable, its admissible values are not. The name, ``cfp8_{layout}[_{specials}]
    [_bias{bias}]`` (the default specials and bias are left out), is found by
    ``mpt.get_format``.
    """
    if layout not in CFP8_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, CFP8_LAYOUTS))}; "
                         f"got {layout!r}")
    if specials not in CFP8_SPECIALS:
        raise ValueError(f"specials must be one of {', '.join(map(repr, CFP8_SPECIALS))}; "
                         f"got {specials!r}")
    e, m = CFP8_LAYOUTS[layout]
    default_bias = (1 << (e - 1)) - 1
    bias = default_bias if bias is None else bias
    name = f"cfp8_{layout}" + ("" if specials == "ieee" else f"_{specials}") \
        + ("" if bias == default_bias else f"_bias{bias}")
    return custom_format(e, m, has_inf=specials == "ieee", nan=specials, bias=bias, name=name)


_NAME = re.compile(r"cfp8_(e5m2|e4m3|e3m4)(?:_(fn|none))?(?:_bias(0|[1-9][0-9]*))?")


def _resolve(name: str):
    """The cFP8 format of a name of :func:`cfp8_format`'s, or None."""
    found = _NAME.fullmatch(name)
    if found is None:
        return None
    layout, specials, bias = found.groups()
    try:
        fmt = cfp8_format(layout, specials=specials or "ieee",
                          bias=None if bias is None else int(bias))
    except ValueError:                    # a bias outside float32's range
        return None
    return fmt if fmt.name == name else None


register_format_names(_resolve, "Trainium cFP8: cfp8_{e5m2|e4m3|e3m4}[_fn|_none][_bias{b}]")


# ---- the matmul engine --------------------------------------------------------------------------

#: Contraction depth of one nc_matmul: the PE array's 128 rows (partition dimension <= 128).
PE_ROWS = 128
#: Inner order / precision of one pass (assumption ``pass_order``) -> the mpt MMA model that
#: computes it.
PASS_ORDERS = {
    "sequential_fma": "ieee_fma",          # IEEE FP32 FMA per k, increasing k, from +0
    "sequential_mul_add": "ieee_mul_add",  # FP32 product, then FP32 add, per k, from +0
    "exact": "exact",                      # exact dot of the pass, rounded once (RNE) to FP32
}
#: ``--auto-cast-type`` choices of neuronx-cc (the option ``auto_cast_type`` of
#: ``trainium_autocast``); fp8_e4m3 is ``cfp8_format("e4m3")``, unscaled.
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")


def _auto_cast_format(name) -> Format:
    if name not in AUTO_CAST_TYPES:
        raise ValueError(f"auto_cast_type must be one of {', '.join(map(repr, AUTO_CAST_TYPES))}"
                         f"; got {name!r}")
    return cfp8_format("e4m3") if name == "fp8_e4m3" else get_format(name)


@register_kind("psum")
class TrainiumOperands(Operands):
    """The Trainium matrix engine: K in passes of ``tile_k`` products (option, 1..128, default
    the PE array's 128 rows) in increasing k; each pass is the inner model of the assumption
    ``pass_order`` from +0 over the operands' exact values, and is added into the FP32 PSUM
    accumulator with one IEEE FP32 add (RNE). PSUM starts at C, or at +0: the first nc_matmul
    writes PSUM, and ``+0 + t = t`` for every pass t (a pass from +0 is never -0 under round to
    nearest). ``trainium_autocast`` rounds fp32
    operands (RNE) to ``auto_cast_type`` first, and with ``auto_cast_result="cast"`` rounds the
    result to it too (returned as float32 values)."""

    acc_dtype = np.float32
    OPTIONS = ("tile_k", "auto_cast_type")

    @classmethod
    def check_config(cls, cfg):
        if cfg.block != PE_ROWS or [o[0] for o in cfg.outputs] != ["fp32"]:
            raise ValueError(f"a Trainium configuration has block {PE_ROWS} (the PE rows) and one "
                             f"fp32 output; got block {cfg.block}, outputs {cfg.outputs!r}")

    @classmethod
    def accepts(cls, cfg, fmt):
        """A cFP8 configuration takes every cFP8 flavour (specials, bias) of its layouts."""
        if fmt in cfg.inputs or not any(f.startswith("cfp8_") for f in cfg.inputs):
            return fmt in cfg.inputs
        return isinstance(fmt, str) and _NAME.fullmatch(fmt) is not None

    def prepare(self):
        tile_k = self.options.get("tile_k", PE_ROWS)
        if isinstance(tile_k, bool) or not isinstance(tile_k, (int, np.integer)) or \
                not 1 <= tile_k <= PE_ROWS:
            raise ValueError(f"tile_k must be an int in [1, {PE_ROWS}]; got {tile_k!r}")
        self.tile_k = int(tile_k)
        self.cast = None
        if self.cfg.param("auto_cast"):
            self.cast = _auto_cast_format(self.options.get("auto_cast_type", "bf16"))
            self.a, self.b = (self._cast(x) for x in (self.a, self.b))
        elif "auto_cast_type" in self.options:
            raise TypeError(f"auto_cast_type is an option of trainium_autocast (fp32 operands "
                            f"cast by the compiler); model {self.model.name!r} takes none")
        inner = get_mma_model(PASS_ORDERS[self.model.choice("pass_order")])
        self.inner = operands_class(inner.kind)(
            inner, inner.config("fp32", "fp32"), self.a[self.ia], self.b[self.ib],
            ("fp32", "fp32"), "fp32", (self.batch_size,))      # (B, M, K), (B, K, N) exact

    def _cast(self, x):
        """RNE to the auto-cast format, as float32 values."""
        return _rounding.decode(np.asarray(_rounding.round(x, self.cast)))

    @property
    def unit(self) -> int:
        return self.tile_k

    def chain(self, acc, k0, k1):
        for t0 in range(k0, k1, self.tile_k):
            part = self.inner.chain_from(None, t0, min(t0 + self.tile_k, k1))  # a pass from +0
            acc += self.inner.values(part)                               # PSUM += pass (RNE)

    def values(self, acc):
        if self.cast is not None and self.model.choice("auto_cast_result") == "cast":
            return self._cast(acc)
        return acc.copy()


_OUT = (("fp32", "rne_fp32", None),)
_PASSES = "nc_matmul passes of 128 products (the PE array's rows) added into an FP32 PSUM tile"
_PASS_ORDER = Assumption("pass_order", tuple(PASS_ORDERS), "the order and precision inside one "
                         "128-deep pass (undocumented): sequential IEEE FP32 FMA, FP32 multiply "
                         "then add, or the exact dot rounded once")

#: The registered MMA models ``trainium`` (aliases trn1, trn2) and ``trainium_autocast``.
MODELS = tuple(register_model(m) for m in (
    MMAModel("trainium", "psum", "AWS Trainium matrix engine (NeuronCore-v2/v3): " + _PASSES, (
        MMAConfig(("cfp8_e5m2", "cfp8_e4m3", "cfp8_e3m4"), _PASSES + " (cFP8)", PE_ROWS, None,
                  _OUT, evidence="documented"),
        *(MMAConfig((f,), _PASSES, PE_ROWS, None, _OUT, evidence="documented")
          for f in ("bf16", "fp16", "tf32", "fp32")),
    ), ("trn1", "trn2"), (_PASS_ORDER,)),
    MMAModel("trainium_autocast", "psum", "Trainium FP32 matmuls under neuronx-cc --auto-cast "
             "matmult: operands rounded (RNE) to --auto-cast-type, then the matrix engine", (
        MMAConfig(("fp32",), "--auto-cast matmult: fp32 operands RNE to auto_cast_type (default "
                  "bf16), then " + _PASSES + " - software, mpt.gemm", PE_ROWS, None, _OUT,
                  evidence="documented", params=(("software", True), ("auto_cast", True))),
    ), (), (_PASS_ORDER, Assumption(
        "auto_cast_result", ("fp32", "cast"), "what the auto-cast matmul returns: the FP32 PSUM "
        "result (as the model declared the op), or the result rounded to the cast type too")))))
