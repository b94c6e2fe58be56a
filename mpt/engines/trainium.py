"""AWS Trainium (NeuronCore-v2 and later): cFP8 formats, the matmul engine with FP32 PSUM,
the compiler's auto-cast and the runtime's stochastic rounding — documented, with assumptions.

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

* cFP8 special values — :func:`cfp8_format` ``specials`` = "ieee" | "fn" | "none".
* the order and internal precision inside one 128-deep pass — :func:`trainium_matmul`
  ``pass_order`` = "sequential_fma" | "sequential_mul_add" | "exact". FP32 operands are taken as
  exact values (whether the PE array decomposes FP32 is not documented).
* which roundings stochastic rounding applies to, and its random source — mpt's Philox SR
  (:func:`neuron_round` ``stochastic_rounding``/``seed``/``stream``).
* what auto-cast does to the matmul's FP32 result — :func:`auto_cast_matmul` ``result``.

Oracle: ``mpt.reference.trainium`` (the tiling rule one element at a time on exact rationals);
the formats against ``mpt.reference.rounding`` and ml_dtypes.
"""
from __future__ import annotations

import numpy as np

from mpt import rounding as _rounding
from mpt.formats import Format, custom_format, get_format
from mpt.mma import _canonical_nan, _ieee_values, gemm

__all__ = ["CFP8_LAYOUTS", "CFP8_SPECIALS", "cfp8_format", "PE_ROWS", "PASS_ORDERS",
           "trainium_matmul", "AUTO_CAST_MODES", "AUTO_CAST_TYPES", "neuron_round",
           "auto_cast_matmul"]

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
    configurable, its admissible values are not.
    """
    if layout not in CFP8_LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(map(repr, CFP8_LAYOUTS))}; "
                         f"got {layout!r}")
    if specials not in CFP8_SPECIALS:
        raise ValueError(f"specials must be one of {', '.join(map(repr, CFP8_SPECIALS))}; "
                         f"got {specials!r}")
    e, m = CFP8_LAYOUTS[layout]
    name = f"cfp8_{layout}" + ("" if specials == "ieee" else f"_{specials}") \
        + ("" if bias is None else f"_bias{bias}")
    return custom_format(e, m, has_inf=specials == "ieee", nan=specials, bias=bias, name=name)


# ---- the matmul engine --------------------------------------------------------------------------

#: Contraction depth of one nc_matmul: the PE array's 128 rows (partition dimension <= 128).
PE_ROWS = 128
#: Inner order / precision of one pass (assumption) -> the mpt MMA model that computes it.
PASS_ORDERS = {
    "sequential_fma": "ieee_fma",          # IEEE FP32 FMA per k, increasing k, from +0
    "sequential_mul_add": "ieee_mul_add",  # FP32 product, then FP32 add, per k, from +0
    "exact": "exact",                      # exact dot of the pass, rounded once (RNE) to FP32
}


def _formats(in_format):
    """(format of a, format of b) from a name, a Format, or a pair of them."""
    pair = in_format if isinstance(in_format, (tuple, list)) else (in_format, in_format)
    if len(pair) != 2:
        raise TypeError(f"in_format must be a format or a pair of formats; got {in_format!r}")
    formats = tuple(get_format(f) for f in pair)
    for f in formats:
        if f.kind != "float" or f.bits > 32:
            raise ValueError(f"in_format must name float formats up to fp32; got {f.name}")
    return formats


def _values(x, fmt, arg):
    """The float32 values of operand x, which must hold values of fmt in fmt's dtype."""
    x = np.asarray(x)
    if x.dtype != np.dtype(fmt.dtype):
        raise TypeError(f"{arg} must hold {fmt.name} values as {np.dtype(fmt.dtype)}; "
                        f"got {x.dtype}")
    if x.dtype != np.float32:
        return _rounding.decode(x)
    if fmt.name != "fp32":                 # tf32 and cFP8: float32 values on the format's grid
        on_grid = _rounding.round(x, fmt).view(np.uint32) == x.view(np.uint32)
        if not np.all(on_grid | np.isnan(x)):
            raise ValueError(f"{arg} holds values that are not {fmt.name} numbers; round them "
                             f"first (mpt.round(x, fmt))")
    return x


@_ieee_values
def trainium_matmul(a, b, c=None, *, in_format, pass_order="sequential_fma", tile_k=PE_ROWS):
    """D = A·B (+ C) as Trainium's matrix engine computes it into an FP32 PSUM tile.

    a: (..., M, K), b: (..., K, N) arrays of ``in_format`` (a name, a Format such as
    :func:`cfp8_format`'s, or a pair for (a, b)): bf16/fp16 in their dtypes, fp32 / tf32 / cFP8
    as float32 values on the format's grid. c: (..., M, N) float32, the PSUM tile's content
    before the first pass, or None. Batch dimensions broadcast.

    Precision contract (documented): K is cut into passes of ``tile_k`` (default 128, the PE
    array's rows, the most one nc_matmul contracts) in increasing k; each pass's FP32 result is
    added into PSUM with an IEEE FP32 add (RNE); the first pass overwrites PSUM when c is None.
    Inside one pass (**assumption**, parameter ``pass_order``): "sequential_fma" (default) — an
    IEEE FP32 FMA per k in increasing k from +0; "sequential_mul_add" — each product rounded to
    FP32, then added; "exact" — the exact dot product of the pass rounded once (RNE) to FP32.
    Returns float32 (..., M, N) with the canonical NaN. Oracle:
    ``mpt.reference.trainium.trainium_matmul_reference``.
    """
    if pass_order not in PASS_ORDERS:
        raise ValueError(f"pass_order must be one of {', '.join(map(repr, PASS_ORDERS))}; "
                         f"got {pass_order!r}")
    if not isinstance(tile_k, (int, np.integer)) or isinstance(tile_k, bool) \
            or not 1 <= tile_k <= PE_ROWS:
        raise ValueError(f"tile_k must be an int in [1, {PE_ROWS}]; got {tile_k!r}")
    fa, fb = _formats(in_format)
    a32, b32 = _values(a, fa, "a"), _values(b, fb, "b")
    if a32.ndim < 2 or b32.ndim < 2:
        raise ValueError(f"a and b must have shapes (..., M, K) and (..., K, N); got "
                         f"{a32.shape} and {b32.shape}")
    if c is not None and np.asarray(c).dtype != np.float32:
        raise TypeError(f"c must be float32 (the PSUM tile); got {np.asarray(c).dtype}")
    k = a32.shape[-1]
    psum = c
    for k0 in range(0, max(k, 1), tile_k):
        part = gemm(a32[..., k0:k0 + tile_k], b32[..., k0:k0 + tile_k, :],
                    model=PASS_ORDERS[pass_order], in_format="fp32")  # from +0
        psum = part if psum is None else psum + part                 # PSUM += pass (FP32, RNE)
    return _canonical_nan(np.array(psum, dtype=np.float32))


# ---- rounding, auto-cast ------------------------------------------------------------------------

def neuron_round(x, fmt="bf16", *, stochastic_rounding=False, seed=None, stream=None):
    """Round float32 x to ``fmt`` as a NeuronCore-v2 does: RNE (documented default), or
    stochastic rounding when ``NEURON_RT_STOCHASTIC_ROUNDING_EN=1`` (``stochastic_rounding=True``;
    on by default under XLA_USE_BF16 / XLA_DOWNCAST_BF16).

    The SR random source is an **assumption**: mpt's Philox SR (``mpt.round(x, fmt,
    "stochastic", seed=seed, stream=stream)``: 32 random bits per element, element i uses word i
    of ``stream``; rounds up iff floor(frac·2^32) + word >= 2^32). Neuron documents neither the
    generator nor how many bits it compares (``NEURON_RT_STOCHASTIC_ROUNDING_SEED`` seeds it).
    Returns fmt's dtype (float32 values for tf32 and cFP8).
    """
    if stochastic_rounding:
        if seed is None:
            raise ValueError("stochastic_rounding=True needs seed (the Philox key)")
        return _rounding.round(x, fmt, "stochastic", seed=seed, stream=stream)
    if seed is not None or stream is not None:
        raise ValueError("seed and stream are only used with stochastic_rounding=True")
    return _rounding.round(x, fmt)


#: ``--auto-cast`` modes of neuronx-cc.
AUTO_CAST_MODES = ("matmult", "all", "none")
#: ``--auto-cast-type`` choices of neuronx-cc.
AUTO_CAST_TYPES = ("bf16", "fp16", "tf32", "fp8_e4m3")


def _cast_format(auto_cast_type, fp8_specials):
    if auto_cast_type not in AUTO_CAST_TYPES:
        raise ValueError(f"auto_cast_type must be one of {', '.join(map(repr, AUTO_CAST_TYPES))}"
                         f"; got {auto_cast_type!r}")
    if auto_cast_type == "fp8_e4m3":
        return cfp8_format("e4m3", specials=fp8_specials)
    return get_format(auto_cast_type)


def auto_cast_matmul(a, b, c=None, *, auto_cast="matmult", auto_cast_type="bf16",
                     result="fp32", pass_order="sequential_fma", stochastic_rounding=False,
                     seed=None, stream=0, fp8_specials="ieee"):
    """An FP32 matmul (a, b float32) as neuronx-cc compiles it under ``--auto-cast``.

    ``auto_cast`` "matmult" or "all": both FP32 operands are cast to ``auto_cast_type`` (bf16,
    fp16, tf32, or fp8_e4m3 = ``cfp8_format("e4m3", specials=fp8_specials)``, unscaled) with
    :func:`neuron_round` — RNE, or SR when ``stochastic_rounding`` (assumption: the runtime's
    SR applies to these casts; Philox streams 3·stream for a, 3·stream + 1 for b, 3·stream + 2
    for a cast result) — then
    :func:`trainium_matmul` accumulates in FP32 PSUM. "none": the FP32 operands go to the
    engine as they are. ("all" casts every other FP32 op too; for the matmul it is the same.)

    ``result`` — **assumption**, what the cast op returns: "fp32" (default: the FP32 PSUM
    result, as the model declared the op) or "cast" (the result rounded to ``auto_cast_type``
    too, with the same rounding, returned as float32 values). Returns float32 (..., M, N).
    """
    if auto_cast not in AUTO_CAST_MODES:
        raise ValueError(f"auto_cast must be one of {', '.join(map(repr, AUTO_CAST_MODES))}; "
                         f"got {auto_cast!r}")
    if result not in ("fp32", "cast"):
        raise ValueError(f"result must be 'fp32' or 'cast'; got {result!r}")
    fmt = _cast_format(auto_cast_type, fp8_specials)
    a, b = (np.asarray(x) for x in (a, b))
    for arg, x in (("a", a), ("b", b)):
        if x.dtype != np.float32:
            raise TypeError(f"{arg} must be float32 (auto-cast applies to FP32 ops); got {x.dtype}")
    if auto_cast == "none":
        return trainium_matmul(a, b, c, in_format="fp32", pass_order=pass_order)

    def cast(x, s):
        return neuron_round(x, fmt, stochastic_rounding=stochastic_rounding,
                            seed=seed if stochastic_rounding else None,
                            stream=s if stochastic_rounding else None)
    d = trainium_matmul(cast(a, 3 * stream), cast(b, 3 * stream + 1), c, in_format=fmt,
                        pass_order=pass_order)
    if result == "cast":
        d = cast(d, 3 * stream + 2)
        d = d if d.dtype == np.float32 else _rounding.decode(d)
    return d
