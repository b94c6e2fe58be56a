"""L1: Intel Gaudi 2 / Gaudi 3 — the MME models, their FP8 formats, output conversion, INC scaling.

Evidence (each rule below carries one of these labels):

* **reference model** -- Habana's published bit-level model of the matrix engine
  (github HabanaAI/Intel_Gaudi3_Software, ``mme/mme_reference/chip_fma/{gaudi2,gaudi3}_fma.cpp``
  and the ``coral-sim`` FMA trees and converters they call). mpt restates its rules (see
  :mod:`mpt.reference.mme`) and was checked against that code compiled as an oracle
  (docs/gaudi.md).
* **assumption** -- what the reference does not fix; each is a parameter with its choices
  listed: ``polynomial`` and ``seeds`` of the stochastic-rounding LFSR (the hardware's are
  unpublished).

**MME** (the MMA models ``gaudi2`` and ``gaudi3``: ``mpt.mma(a, b, c, model="gaudi3")``): D =
A·B + C in FP32, K walked in trees from k = 0, each tree's FP32 result the next tree's C
(:data:`MME_CONFIGS` holds each chip's tree width, alignment and rounding). How the hardware
splits K across passes or engines is software around the trees (``mpt.gemm(..., split_k=)``).
**FP8 formats** (:func:`fp8_format`, names ``gaudi_{e4m3|e5m2}_b{bias}_{full|none|minimal}``
found by ``mpt.get_format``): Gaudi 2 E4M3 (bias 3, 7, 11, 15) and E5M2 (bias 15), both
IEEE-like; Gaudi 3 E4M3/E5M2 with any bias 0..63 in three Inf/NaN modes. **Output conversion**
(:func:`convert`): the TPC/MME converters' seven rounding modes, stochastic rounding fed by a
Galois LFSR per lane (:func:`lfsr_words`). Intel Neural Compressor's FP8 scale methods, which
Gaudi's FP8 recipes use, are software: :mod:`mpt.amp.inc`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from mpt.engines.model import MMAConfig, MMAModel, register_model
from mpt.engines.operands import Operands, register_kind, values32
from mpt.formats import Format, custom_format, get_format, register_format_names
from mpt.kernels import mme as _mme
from mpt.kernels.random import lfsr_fill
from mpt.rounding import round as _round

__all__ = [
    "CHIPS", "FP8_MODES", "GAUDI2_FP8_BIASES", "fp8_format", "fp8_params",
    "MMEConfig", "MME_CONFIGS", "mme_config", "GaudiOperands", "MODELS",
    "CONVERSION_MODES", "DEFAULT_LFSR_POLYNOMIAL", "LFSR_LANES", "default_lfsr_seeds",
    "lfsr_words", "convert",
]

CHIPS = ("gaudi2", "gaudi3")


def _chip(chip) -> str:
    if chip not in CHIPS:
        raise ValueError(f"chip must be one of {', '.join(map(repr, CHIPS))}; got {chip!r}")
    return chip


# ---- FP8 formats (reference model: fp8_to_fp32 / fp32_to_fp8 and the MME descriptor) ----------

_FP8_LAYOUTS = {"e4m3": (4, 3), "e5m2": (5, 2)}
#: Gaudi's Inf/NaN modes -> mpt's ``nan`` kinds: "full" IEEE-like (top exponent is Inf/NaN),
#: "none" (every code finite), "minimal" (only S.1111111 is NaN: OCP E4M3FN at bias 7).
FP8_MODES = {"full": "ieee", "none": "none", "minimal": "fn"}
#: The biases the Gaudi 2 MME descriptor offers (its FMA accepts any; the descriptor does not).
GAUDI2_FP8_BIASES = {"e4m3": (3, 7, 11, 15), "e5m2": (15,)}
_GAUDI3_BIASES = range(0, 64)                     # a 6-bit bias field
_DEFAULT_BIAS = {"e4m3": 7, "e5m2": 15}


def fp8_format(chip, kind="e4m3", bias=None, mode="full") -> Format:
    """The Gaudi FP8 format ``kind`` ("e4m3", "e5m2") with exponent ``bias`` in Inf/NaN ``mode``.

    Gaudi 2: E4M3 with bias 3, 7, 11 or 15 and E5M2 with bias 15, both "full" (IEEE-like: E4M3
    at bias 7 has max 240). Gaudi 3: any bias in 0..63, modes "full", "none" (E4M3 max 480 at bias
    7) or "minimal" (max 448: float8_e4m3fn). Defaults: bias 7 (E4M3) / 15 (E5M2).
    The format is a ``mpt.custom_format`` (float32 storage). Storage refuses none of these
    biases: the extremes, E5M2 at bias 0 (max 1.75·2^31) and E4M3 at bias 63 (smallest
    subnormal 2^-65), are float32 numbers; biases are refused by the chip only. The name is
    chip-independent (``gaudi_e4m3_b7_full``): Gaudi 2's formats are Gaudi 3 "full" formats.
    """
    _chip(chip)
    if kind not in _FP8_LAYOUTS:
        raise ValueError(f"kind must be 'e4m3' or 'e5m2'; got {kind!r}")
    if mode not in FP8_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, FP8_MODES))}; got {mode!r}")
    bias = _DEFAULT_BIAS[kind] if bias is None else bias
    if not isinstance(bias, (int, np.integer)) or isinstance(bias, bool):
        raise TypeError(f"bias must be an int; got {type(bias).__name__}")
    if chip == "gaudi2" and (mode != "full" or bias not in GAUDI2_FP8_BIASES[kind]):
        raise ValueError(f"Gaudi 2 {kind} takes mode='full' and bias in "
                         f"{GAUDI2_FP8_BIASES[kind]}; got mode={mode!r}, bias={bias}")
    if chip == "gaudi3" and bias not in _GAUDI3_BIASES:
        raise ValueError(f"Gaudi 3 FP8 bias must be in 0..63 (a 6-bit field); got {bias}")
    e, m = _FP8_LAYOUTS[kind]
    return custom_format(e, m, has_inf=mode == "full", nan=FP8_MODES[mode], bias=int(bias),
                         name=f"gaudi_{kind}_b{int(bias)}_{mode}")


def fp8_params(fmt) -> tuple[str, int, str]:
    """(kind, bias, mode) of an FP8 format Gaudi knows: any E4M3/E5M2 layout whose Inf/NaN
    encoding is one of :data:`FP8_MODES` (``fp8_e4m3fn`` is ("e4m3", 7, "minimal"))."""
    fmt = get_format(fmt)
    for kind, layout in _FP8_LAYOUTS.items():
        if (fmt.kind, fmt.bits, (fmt.exponent_bits, fmt.mantissa_bits)) == ("float", 8, layout):
            for mode, nan in FP8_MODES.items():
                if fmt.nan == nan:
                    return kind, fmt.bias, mode
    raise ValueError(f"format {fmt.name} is not a Gaudi FP8 format (E4M3/E5M2 with Inf/NaN mode "
                     "full, none or minimal)")


_NAME = re.compile(r"gaudi_(e4m3|e5m2)_b(0|[1-9][0-9]?)_(full|none|minimal)")


def _resolve(name: str):
    """The Gaudi FP8 format of a name ``gaudi_{kind}_b{bias}_{mode}`` (bias 0..63), or None."""
    found = _NAME.fullmatch(name)
    if found is None or int(found.group(2)) not in _GAUDI3_BIASES:
        return None
    return fp8_format("gaudi3", found.group(1), int(found.group(2)), found.group(3))


register_format_names(_resolve, "Gaudi FP8: gaudi_{e4m3|e5m2}_b{0..63}_{full|none|minimal}")


# ---- the MME (reference model) ----------------------------------------------------------------

@dataclass(frozen=True)
class MMEConfig:
    """How one chip multiplies one operand family (reference model).

    ``width``: products per tree (the reference's ``c_fma_tree_addr_width``); ``fraction_bits``:
    F, bits kept below the anchor; ``fields``/``pairs``: significand bit fields of the pieces of
    an operand (bit 23 = the hidden bit of its FP32 view) and the (a, b) pieces multiplied -- the
    partial products, each truncated on its own; ``normalised``: a product's exponent is its
    own (Gaudi 2 bf16/fp16/tf32) rather than e_a + e_b; ``rounding``: "rne_flush" (Gaudi 2: C
    added exactly, RNE, subnormal results flushed) or "rz" (Gaudi 3: C is a truncated term, RZ,
    ±Inf from 2^128); ``flush``: subnormal operands become zero; ``note``: in words.
    """

    chip: str
    family: str
    width: int
    fraction_bits: int
    fields: tuple[tuple[int, int], ...]
    pairs: tuple[tuple[int, int], ...]
    normalised: bool
    rounding: str
    flush: bool
    note: str


_WHOLE = (((23, 0),), ((0, 0),))
_SPLIT_12 = (((23, 12), (11, 0)), ((0, 0), (0, 1), (1, 0), (1, 1)))
_SPLIT_3_8 = (((23, 21), (20, 13)), ((0, 0), (0, 1), (1, 0), (1, 1)))
_SPLIT_BYTES = (((23, 16), (15, 8), (7, 0)),
                ((2, 1), (2, 0), (1, 2), (1, 1), (1, 0), (0, 2), (0, 1), (0, 0)))   # no lo·lo


def _config(chip, family, width, f, split, normalised, flush, note):
    rounding = "rne_flush" if chip == "gaudi2" else "rz"
    return MMEConfig(chip, family, width, f, split[0], split[1], normalised, rounding, flush, note)


#: (chip, family) -> MMEConfig. Families: "fp8", "fp16", "bf16", "tf32", "fp32".
MME_CONFIGS = {(c.chip, c.family): c for c in (
    _config("gaudi2", "fp8", 16, 24, _WHOLE, False, False,
            "fp8 widened to fp16 (RNE), 16 products aligned at 24 bits to the largest "
            "max(e_a,-14)+max(e_b,-14), C added exactly, RNE"),
    _config("gaudi2", "fp16", 8, 46, _WHOLE, True, False,
            "8 exact products truncated 46 bits below the largest, C exact, RNE"),
    _config("gaudi2", "bf16", 8, 46, _WHOLE, True, True,
            "as fp16; bf16 subnormal operands, a subnormal C and subnormal results flushed"),
    _config("gaudi2", "tf32", 4, 46, _WHOLE, True, True,
            "fp32 rounded to tf32 (RNE), then 4 products as bf16"),
    _config("gaudi2", "fp32", 2, 46, _SPLIT_12, False, True,
            "2 products, each as 4 partial products of a 12+12-bit split, truncated each"),
    _config("gaudi3", "fp8", 8, 24, _WHOLE, False, False,
            "9-term step: 8 products (E4M3/E5M2 mixable) + C at 24 bits below e_a+e_b, RZ"),
    _config("gaudi3", "bf16", 8, 24, _WHOLE, False, False,
            "9-term step as fp8; subnormals kept"),
    _config("gaudi3", "fp16", 2, 24, _SPLIT_3_8, False, False,
            "2 products, each as 4 partial products of a 3+8-bit split, truncated each; + C; RZ"),
    _config("gaudi3", "tf32", 2, 24, _SPLIT_3_8, False, False,
            "fp32 rounded to tf32 (RNE), then as fp16"),
    _config("gaudi3", "fp32", 1, 24, _SPLIT_BYTES, False, False,
            "1 product as 8 byte-wise partial products (lo·lo dropped), truncated each; + C"),
)}


def mme_config(chip, family) -> MMEConfig:
    """The :class:`MMEConfig` of a chip and an operand family; ValueError listing the valid."""
    cfg = MME_CONFIGS.get((_chip(chip), family))
    if cfg is None:
        valid = ", ".join(f for c, f in MME_CONFIGS if c == chip)
        raise ValueError(f"{chip} MME takes {valid} operands; got {family!r}")
    return cfg


def _prepared(x32, cfg: MMEConfig) -> np.ndarray:
    """The values the MME multiplies (float32): fp8 widened to fp16 on Gaudi 2, tf32 rounded to
    nearest even, subnormals flushed where the chip flushes them."""
    if cfg.chip == "gaudi2" and cfg.family == "fp8":
        x32 = _round(x32, "fp16").astype(np.float32)                   # exact widening
    if cfg.family == "tf32":
        x32 = _round(x32, "tf32")                                      # RNE, float32 values
    if cfg.flush:
        x32 = np.where(np.abs(x32) < np.float32(2.0**-126), np.copysign(np.float32(0), x32),
                       x32)
    return x32


def _decode_terms(x32, cfg: MMEConfig):
    """(pieces (P, ...), values, nominal powers of two) float64 of prepared operand values."""
    bits = x32.view(np.uint32).astype(np.int64)
    field = (bits >> 23) & 0xFF
    special = field == 0xFF
    sig = (bits & 0x7FFFFF) | (np.int64(1) << 23) * (field != 0)
    last = np.maximum(field, 1) - 150                            # x = ±sig·2^last
    sign = np.where(bits >> 31, -1.0, 1.0)
    pieces = np.stack([np.where(special, 0.0, sign * np.ldexp(
        ((sig >> lo) & ((1 << (hi - lo + 1)) - 1)).astype(np.float64), lo + last))
        for hi, lo in cfg.fields])
    emin = -14 if (cfg.chip, cfg.family) == ("gaudi2", "fp8") else -126
    with np.errstate(invalid="ignore"):               # a signalling NaN stays a NaN
        values = x32.astype(np.float64)
        e = np.frexp(values)[1] - 1
    nominal = np.where(special | (values == 0), 0.0, np.ldexp(1.0, np.maximum(e, emin)))
    return pieces, values, nominal


@register_kind("mme")
class GaudiOperands(Operands):
    """A and B of one product decoded once for one chip's MME (the kind of ``gaudi2`` and
    ``gaudi3``): the chip's input conversion (fp8 widened to fp16 on Gaudi 2, tf32 rounded RNE,
    subnormal flushes) and each operand's pieces, values and nominal powers of two for
    :mod:`mpt.kernels.mme`. The accumulator is FP32; Gaudi 2 returns every output ``+ 0``
    (the reference's final RNE add: -0 becomes +0); NaN is 0x7FFFFFFF."""

    acc_dtype = np.float32

    @classmethod
    def check_config(cls, cfg):
        """``params`` name a chip and family of :data:`MME_CONFIGS`, whose width and F the
        configuration repeats — except that Gaudi 2's kernel takes any F from 0 to the MME's
        (fewer bits keep every sum exact: a fault-injected copy, ``mpt.characterize.
        with_fraction_bits``); one fp32 output."""
        mme = mme_config(cfg.param("chip"), cfg.param("family"))
        f_ok = cfg.fraction_bits == mme.fraction_bits or (
            mme.chip == "gaudi2" and isinstance(cfg.fraction_bits, int)
            and 0 <= cfg.fraction_bits < mme.fraction_bits)
        if cfg.block != mme.width or not f_ok:
            raise ValueError(f"block and fraction_bits must be the MME's {mme.width} and "
                             f"{mme.fraction_bits} (Gaudi 2: F at most that); got {cfg.block} "
                             f"and {cfg.fraction_bits}")
        if [o[0] for o in cfg.outputs] != ["fp32"]:
            raise ValueError(f"the MME has one fp32 output; got {cfg.outputs!r}")

    @classmethod
    def accepts(cls, cfg, fmt):
        """The fp8 family takes every Gaudi FP8 format the chip allows (:func:`fp8_format`)."""
        if cfg.param("family") != "fp8" or fmt in cfg.inputs:
            return fmt in cfg.inputs
        try:
            fp8_format(cfg.param("chip"), *fp8_params(fmt))
        except ValueError:
            return False
        return True

    def decode(self, x, fmt):
        """Float32 values; tf32 operands keep their fp32 pattern (the MME rounds it RNE)."""
        return values32(x, "fp32") if fmt == "tf32" else super().decode(x, fmt)

    def prepare(self):
        mme = self.mme = mme_config(self.cfg.param("chip"), self.cfg.param("family"))
        if mme.chip == "gaudi2" and mme.family == "fp8" and \
                fp8_params(self.formats[0])[0] != fp8_params(self.formats[1])[0]:
            raise ValueError(f"Gaudi 2 does not mix E4M3 and E5M2 operands (Gaudi 3 does); got "
                             f"{self.formats[0]} and {self.formats[1]}")
        self.a = _decode_terms(_prepared(self.a, mme), mme)     # (P, Ba, M, K), (Ba, M, K) x2
        self.b = _decode_terms(_prepared(self.b, mme), mme)     # (P, Bb, K, N), (Bb, K, N) x2
        self.pair_a = np.array([p for p, _ in mme.pairs], np.int64)
        self.pair_b = np.array([r for _, r in mme.pairs], np.int64)

    def chain(self, acc, k0, k1):
        (va, wa, na), (vb, wb, nb) = self.a, self.b
        args = (va, wa, na, vb, wb, nb, acc, self.ia, self.ib, k0, k1, self.mme.width,
                self.pair_a, self.pair_b)
        if self.mme.chip == "gaudi2":
            _mme.gaudi2_chain(*args, self.cfg.fraction_bits, self.mme.normalised)
        else:
            _mme.gaudi3_chain(*args)

    def values(self, acc):
        return acc + np.float32(0) if self.mme.chip == "gaudi2" else acc.copy()  # H3-2134


#: The usual FP8 formats of each chip's fp8 configuration (any other Gaudi FP8 format the chip
#: allows is accepted too: :meth:`GaudiOperands.accepts`).
_FP8_INPUTS = {"gaudi2": ("gaudi_e4m3_b7_full", "fp8_e5m2"),
               "gaudi3": ("fp8_e4m3fn", "gaudi_e4m3_b7_full", "gaudi_e4m3_b7_none", "fp8_e5m2")}


def _mma_config(mme: MMEConfig) -> MMAConfig:
    inputs = _FP8_INPUTS[mme.chip] if mme.family == "fp8" else (mme.family,)
    rounding = "rne_fp32" if mme.rounding == "rne_flush" else "rz_fp32"
    return MMAConfig(inputs, f"MME {mme.family} tree: {mme.note}", mme.width, mme.fraction_bits,
                     (("fp32", rounding, None),), evidence="reference model",
                     params=(("chip", mme.chip), ("family", mme.family)))


#: The registered MMA models ``gaudi2`` and ``gaudi3`` (Habana's reference model).
MODELS = tuple(register_model(MMAModel(
    chip, "mme", description, tuple(_mma_config(c) for (ch, _), c in MME_CONFIGS.items()
                                    if ch == chip)))
    for chip, description in (
        ("gaudi2", "Intel Gaudi 2 matrix engine (MME): trees of products truncated 46 bits (fp8: "
         "24) below the largest, C exact, RNE, subnormal results flushed"),
        ("gaudi3", "Intel Gaudi 3 matrix engine (MME): the 9-term step, products and C truncated "
         "24 bits below the largest, RZ")))


# ---- output conversion (reference model: fp32_to_bf16 / fp32_to_cfp16 / fp32_to_fp8) ----------

#: mpt's mode names -> Gaudi's RoundingMode codes (RNE, RZ, RU, RD, SR, RHAZ, SR with RNE for
#: subnormal results).
CONVERSION_MODES = {"nearest_even": 0, "toward_zero": 1, "up": 2, "down": 3, "stochastic": 4,
                    "nearest_away": 6, "stochastic_rne_subnormals": 7}
#: Assumption ``lfsr_polynomial``: the hardware's tap mask is unpublished (the reference draws one
#: at random from 25..63, which is no maximal-length polynomial). Default: x^32+x^22+x^2+x+1
#: (taps 32, 22, 2, 1; Xilinx XAPP052), maximal: every non-zero state once per 2^32-1 steps.
DEFAULT_LFSR_POLYNOMIAL = 0x80200003
#: LFSR lanes of the output converter in the reference (element i uses lane i % lanes).
LFSR_LANES = {"bf16": 64, "fp16": 64, "fp8": 128}


def default_lfsr_seeds(lanes: int) -> np.ndarray:
    """Assumption ``lfsr_seeds``: the reference's default lane states, lane i starts at i + 2."""
    return np.arange(2, lanes + 2, dtype=np.uint32)


def lfsr_words(n, *, lanes=64, seeds=None, polynomial=DEFAULT_LFSR_POLYNOMIAL):
    """(words, states): n LFSR values for n converted elements, and the lanes' next states.

    Element i takes lane i % lanes at its (i // lanes)-th step; each lane is a 32-bit Galois
    LFSR (``s = (s >> 1) ^ (polynomial if s & 1 else 0)``, :func:`mpt.kernels.random.lfsr_fill`).
    seeds: (lanes,) uint32 states (default :func:`default_lfsr_seeds`), non-zero (zero is a
    fixed point). Pass the returned states as the next call's seeds to continue the streams.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int; got {n!r}")
    states = default_lfsr_seeds(lanes) if seeds is None else \
        np.array(seeds, dtype=np.uint32, copy=True).reshape(-1)
    if states.size == 0 or not states.all():
        raise ValueError("seeds must be non-zero uint32 states (zero is an LFSR fixed point)")
    if not 0 < int(polynomial) < 1 << 32:
        raise ValueError(f"polynomial must be a non-zero 32-bit tap mask; got {polynomial!r}")
    words = np.empty(int(n), np.uint32)                                   # (n,)
    lfsr_fill(words, states, np.uint32(polynomial))
    return words, states


def _target(fmt) -> Format:
    fmt = get_format(fmt)
    if fmt.name not in ("bf16", "fp16"):
        fp8_params(fmt)
    return fmt


def convert(x, fmt, mode="nearest_even", *, lfsr=None, clip=False):
    """The Gaudi output conversion of FP32 values to ``fmt`` (bf16, fp16 or a Gaudi FP8 format).

    mode: one of :data:`CONVERSION_MODES`. Rounding as :func:`mpt.round` (IEEE overflow: ±Inf for
    nearest, stochastic, RU of positives and RD of negatives; ±max otherwise -- in "none" FP8 mode
    always ±max, in "minimal" mode NaN for Inf), which is what the reference's converters do,
    with these rules of the chip on top:

    * stochastic: round up iff the discarded bits, left-aligned in 32 bits, are >= the lane's LFSR
      value L (``lfsr``, a uint32 array of x's shape, non-zero: :func:`lfsr_words`) -- which is
      mpt.round's comparison fed ``random_bits = 2^32 - L``; but into fp16/fp8, magnitudes below
      half the smallest subnormal round to zero (the converter's tiny-value path).
    * stochastic_rne_subnormals: RNE where |x| is below the format's smallest normal, else as
      stochastic. (The reference's bf16 converter lacks this mode and truncates; fp16/fp8 have it.)
    * NaN: bf16/fp16 give 0x7FFF; FP8 "full" gives +NaN (0x7F), "minimal" a NaN of x's sign,
      "none" +max (its 0x7F).
    * clip: the descriptor's clip_fp: overflow and Inf give ±max (``saturate`` of mpt.round).
    """
    fmt = _target(fmt)
    if mode not in CONVERSION_MODES:
        raise ValueError(f"mode must be one of {', '.join(map(repr, CONVERSION_MODES))}; "
                         f"got {mode!r}")
    x = np.asarray(x)
    if x.dtype != np.float32:
        raise TypeError(f"x must be float32 (the FP32 accumulator); got {x.dtype}")
    stochastic = mode.startswith("stochastic")
    if stochastic != (lfsr is not None):
        raise ValueError("lfsr (uint32 LFSR values of x's shape) is needed by, and only by, the "
                         "stochastic modes")
    if not stochastic:
        out = _round(x, fmt, mode, saturate=clip)
    else:
        if not isinstance(lfsr, np.ndarray) or lfsr.dtype != np.uint32 or lfsr.shape != x.shape:
            raise TypeError(f"lfsr must be a uint32 array of x's shape {x.shape}")
        if not lfsr.all():
            raise ValueError("lfsr values must be non-zero (an LFSR never holds 0)")
        words = np.uint32(0) - lfsr                                    # 2^32 - L, mod 2^32
        out = _round(x, fmt, "stochastic", saturate=clip, random_bits=words)
        if fmt.name != "bf16":                                        # tiny-value path
            tiny = np.abs(x) < np.float32(fmt.min_subnormal / 2)
            out = np.where(tiny, np.copysign(np.zeros((), out.dtype), x).astype(out.dtype), out)
        if mode == "stochastic_rne_subnormals":
            rne = _round(x, fmt, "nearest_even", saturate=clip)
            out = np.where(np.abs(x) < np.float32(fmt.min_normal), rne, out)
    return _gaudi_nan(np.asarray(out), x, fmt)


def _gaudi_nan(out, x, fmt):
    """Write the converter's NaN over NaN results."""
    nan = np.isnan(x)
    if not nan.any():
        return out
    if fmt.name in ("bf16", "fp16"):
        out = out.copy()
        out.view(np.uint16)[nan] = 0x7FFF
    else:                                    # FP8 codes: "none" 0x7F (+max), "full" 0x7F (+NaN)
        mode = fp8_params(fmt)[2]
        if mode != "minimal":                # ("minimal" keeps the sign: 0x7F / 0xFF)
            out = np.where(nan, np.float32(fmt.max if mode == "none" else np.nan), out)
    return out
