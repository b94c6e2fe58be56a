"""Intel Gaudi 2 / Gaudi 3: the MME models, their FP8 formats, output conversion, INC scaling.

Evidence (each rule below carries one of these labels):

* **reference model** -- Habana's published bit-level model of the matrix engine
  (github HabanaAI/Intel_Gaudi3_Software, ``mme/mme_reference/chip_fma/{gaudi2,gaudi3}_fma.cpp``
  and the ``coral-sim`` FMA trees and converters they call). mpt restates its rules (see
  :mod:`mpt.reference.mme`) and was checked against that code compiled as an oracle.
* **documented** -- Intel Neural Compressor's FP8 scale methods (github intel/neural-compressor,
  ``neural_compressor/torch/algorithms/fp8_quant/_core/fp_utils.py`` and ``scale_methods/``).
* **assumption** -- what neither fixes; each is a parameter with its choices listed:
  ``lfsr_polynomial`` and ``lfsr_seeds`` (the hardware's are unpublished), ``log2_rounding`` of
  INC's scale rounding (:data:`LOG2_ROUNDINGS`), and the K walk of a whole GEMM (the reference
  walks K of one output from k = 0 in trees; how the hardware splits K across passes or engines,
  and any reduction in memory, are not modelled: mpt walks all of K at once).

**MME** (:func:`mme`): D = A·B + C in FP32, K walked in trees from k = 0, each tree's FP32 result
the next tree's C (:data:`MME_CONFIGS` holds each chip's tree width, alignment and rounding).
**FP8 formats** (:func:`fp8_format`): Gaudi 2 E4M3 (bias 3, 7, 11, 15) and E5M2 (bias 15), both
IEEE-like; Gaudi 3 E4M3/E5M2 with any bias 0..63 in three Inf/NaN modes. **Output conversion**
(:func:`convert`): the TPC/MME converters' seven rounding modes, stochastic rounding fed by a
Galois LFSR per lane (:func:`lfsr_words`). **Scaling** (:func:`maxabs_hw` and friends): INC's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt.formats import Format, custom_format, get_format
from mpt.kernels import mme as _mme
from mpt.kernels.mma import threads_for
from mpt.kernels.random import lfsr_fill
from mpt.mma import _batched, _canonical_nan
from mpt.rounding import decode as _decode
from mpt.rounding import round as _round

__all__ = [
    "CHIPS", "EVIDENCE", "FP8_MODES", "GAUDI2_FP8_BIASES", "fp8_format", "fp8_params",
    "MMEConfig", "MME_CONFIGS", "mme_config", "GaudiOperands", "mme",
    "CONVERSION_MODES", "DEFAULT_LFSR_POLYNOMIAL", "LFSR_LANES", "default_lfsr_seeds",
    "lfsr_words", "convert",
    "INC_BACKOFFS", "INC_SCALE_METHODS", "LOG2_ROUNDINGS", "fullscale", "hw_aligned_scales",
    "round_scale", "scale_from_maxabs", "maxabs", "maxabs_hw", "maxabs_pow2", "unit_scale",
    "describe",
]

CHIPS = ("gaudi2", "gaudi3")
#: Evidence label of each part, for mpt.mma_models() and the targets table.
EVIDENCE = {"mme": "reference model", "fp8_formats": "reference model",
            "conversion": "reference model", "lfsr_polynomial": "assumption",
            "lfsr_seeds": "assumption", "k_walk": "assumption", "scaling": "documented",
            "log2_rounding": "assumption"}


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


def _family(fmt: Format) -> str:
    if fmt.name in ("fp32", "tf32", "bf16", "fp16"):
        return fmt.name
    fp8_params(fmt)                                  # raises for anything else
    return "fp8"


def _operand_formats(chip, a, b, in_format):
    """(Format of a, Format of b, config), checked against the arrays and the chip's rules."""
    if in_format is None:
        try:
            fa, fb = get_format(a.dtype), get_format(b.dtype)
        except ValueError as exc:
            raise TypeError(f"a, b dtypes {a.dtype}, {b.dtype}: {exc}") from None
    elif isinstance(in_format, (tuple, list)) and len(in_format) == 2:
        fa, fb = get_format(in_format[0]), get_format(in_format[1])
    else:
        fa = fb = get_format(in_format)
    fam_a, fam_b = _family(fa), _family(fb)
    if fam_a != fam_b:
        raise ValueError(f"a ({fa.name}) and b ({fb.name}) must be of one operand family")
    for arg, x, f in (("a", a, fa), ("b", b, fb)):
        if x.dtype != f.dtype:
            raise TypeError(f"{arg} must hold {f.name} values as {np.dtype(f.dtype)}; "
                            f"got {x.dtype}")
    if fam_a == "fp8":
        (ka, ba, ma), (kb, bb, mb) = fp8_params(fa), fp8_params(fb)
        fp8_format(chip, ka, ba, ma), fp8_format(chip, kb, bb, mb)   # the chip's rules
        if chip == "gaudi2" and ka != kb:
            raise ValueError("Gaudi 2 does not mix E4M3 and E5M2 operands (Gaudi 3 does)")
    return fa, fb, mme_config(chip, fam_a)


def _values32(x, fmt: Format) -> np.ndarray:
    """float32 values of an operand; a float32-stored format must hold exact values of it."""
    if np.dtype(fmt.dtype) != np.float32 or fmt.name in ("fp32", "tf32"):
        return np.ascontiguousarray(_decode(x) if x.dtype != np.float32 else x, np.float32)
    x = np.ascontiguousarray(x, np.float32)
    with np.errstate(invalid="ignore"):
        exact = _round(x, fmt)
    bad = (exact.view(np.uint32) != x.view(np.uint32)) & ~(np.isnan(x) & np.isnan(exact))
    if bad.any():
        raise ValueError(f"operand holds values that are not {fmt.name} numbers, e.g. "
                         f"{x[bad].ravel()[0]!r} (round it with mpt.round first)")
    return x


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


class GaudiOperands:
    """A and B of one product, decoded once for one chip's MME: ``chain(acc, k0, k1)`` runs it.

    The interface of ``mpt.mma``'s operands: ``new_acc(c)`` (an FP32 accumulator holding c or
    +0, shape (B, M, N)), ``chain(acc, k0, k1)`` (trees over k in [k0, k1), in place; k0 a
    multiple of ``block``), ``values(acc)`` (D as (B, M, N) float32: Gaudi 2's final RNE ``+ 0``
    and the canonical NaN 0x7FFFFFFF applied), ``block`` (the tree width), ``work``.
    """

    def __init__(self, chip, a32, b32, cfg: MMEConfig, batch):
        self.chip, self.cfg, self.block = chip, cfg, cfg.width
        self.m, self.k, self.n = a32.shape[-2], a32.shape[-1], b32.shape[-1]
        a3, self.ia = _batched(_prepared(a32, cfg), batch)
        b3, self.ib = _batched(_prepared(b32, cfg), batch)
        self.a, self.b = _decode_terms(a3, cfg), _decode_terms(b3, cfg)
        self.pair_a = np.array([p for p, _ in cfg.pairs], np.int64)
        self.pair_b = np.array([r for _, r in cfg.pairs], np.int64)

    @property
    def batch_size(self):
        return self.ia.size

    @property
    def work(self):
        """Products in the whole call (B·M·N·K)."""
        return self.batch_size * self.m * self.n * self.k

    def new_acc(self, c=None):
        acc = np.zeros((self.batch_size, self.m, self.n), np.float32)
        if c is not None:
            acc[...] = c
        return acc

    def chain(self, acc, k0, k1):
        if k0 % self.block:
            raise ValueError(f"k0 must be a multiple of the tree width {self.block}; got {k0}")
        (va, wa, na), (vb, wb, nb) = self.a, self.b
        args = (va, wa, na, vb, wb, nb, acc, self.ia, self.ib, k0, k1, self.block, self.pair_a,
                self.pair_b)
        with threads_for(self.work):
            if self.chip == "gaudi2":
                _mme.gaudi2_chain(*args, self.cfg.fraction_bits, self.cfg.normalised)
            else:
                _mme.gaudi3_chain(*args)

    def values(self, acc):
        d = acc + np.float32(0) if self.chip == "gaudi2" else acc.copy()   # H3-2134: -0 -> +0
        return _canonical_nan(d)


def mme(a, b, c=None, *, chip, in_format=None):
    """D = A·B + C on a Gaudi MME, bit for bit as Habana's reference model (FP32 result).

    a: (..., M, K), b: (..., K, N): arrays of the operand format's dtype -- float16, bfloat16,
    float32 (fp32; or tf32 with ``in_format="tf32"``: the MME rounds fp32 to tf32, RNE), FP8 as
    ``float8_e4m3fn``/``float8_e5m2`` or as float32 values of a :func:`fp8_format`.
    ``in_format``: None (from the dtypes), a format, or a pair (format of a, format of b): Gaudi 3
    mixes E4M3 and E5M2 and any biases/modes; Gaudi 2 takes one kind, biases may differ.
    c: (..., M, N) float32 or None (+0); batch dimensions broadcast.

    Precision contract (:data:`MME_CONFIGS`, oracle :mod:`mpt.reference.mme`): per output, K in
    trees of the chip's width from k = 0, the last one zero-padded; an FP32 accumulator starts at
    C and each tree's FP32 result is the next tree's C. Gaudi 2: terms truncated 46 bits (fp8: 24)
    below the largest, C exact, one RNE rounding, subnormal results flushed, then every output +0
    (so -0 is +0). Gaudi 3: terms and C truncated 24 bits below the largest (at least 2^-132),
    RZ, ±Inf from 2^128, zeros +0. NaN is 0x7FFFFFFF. The K walk beyond one output's trees
    (passes, engines) is an assumption: this is all of K in one walk.
    """
    chip = _chip(chip)
    a, b = np.asarray(a), np.asarray(b)
    for arg, x, dims in (("a", a, "(..., M, K)"), ("b", b, "(..., K, N)")):
        if x.ndim < 2:
            raise ValueError(f"{arg} must have shape {dims}; got shape {x.shape}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"a (..., M, K) and b (..., K, N) disagree on K: {a.shape} and {b.shape}")
    fa, fb, cfg = _operand_formats(chip, a, b, in_format)
    m, n = a.shape[-2], b.shape[-1]
    dims = [a.shape[:-2], b.shape[:-2]]
    if c is not None:
        c = np.asarray(c)
        if c.dtype != np.float32:
            raise TypeError(f"c must be float32 (the FP32 accumulator); got {c.dtype}")
        dims.append(c.shape[:-2] if c.ndim >= 2 else ())
    try:
        batch = np.broadcast_shapes(*dims)
        c3 = None if c is None else np.broadcast_to(c, batch + (m, n)).reshape((-1, m, n))
    except ValueError:
        raise ValueError(f"batch dimensions of a {a.shape}, b {b.shape}"
                         + ("" if c is None else f", c {c.shape}") + " do not broadcast") from None
    ops = GaudiOperands(chip, _values32(a, fa), _values32(b, fb), cfg, batch)
    acc = ops.new_acc(c3)
    with np.errstate(over="ignore", invalid="ignore"):
        ops.chain(acc, 0, ops.k)
        return ops.values(acc).reshape(batch + (m, n))


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


# ---- scaling (documented: Intel Neural Compressor, fp8_quant) ---------------------------------

#: INC's backoffs of MAXABS_HW / MAXABS_POW2 (scale_method_config.py): weights 0.5, activations
#: 0.25 (so the largest value lands at half / a quarter of the FP8 range).
INC_BACKOFFS = {"weight": 0.5, "activation": 0.25}
#: INC's scale methods (scale_method_config.py) for weights and activations:
#: (granularity "tensor" | "channel", rounding, backoff).
INC_SCALE_METHODS = {
    "unit_scale": {"weight": ("tensor", "unit", 1.0), "activation": ("tensor", "unit", 1.0)},
    "maxabs_hw": {"weight": ("tensor", "hw_aligned", 0.5),
                  "activation": ("tensor", "hw_aligned", 0.25)},
    "maxabs_pow2": {"weight": ("tensor", "pow2", 0.5), "activation": ("tensor", "pow2", 0.25)},
    "maxabs_arbitrary": {"weight": ("tensor", "identity", 0.5),
                         "activation": ("tensor", "identity", 0.25)},
    "act_maxabs_hw_weights_pcs_maxabs_pow2": {"weight": ("channel", "pow2", 0.5),
                                              "activation": ("tensor", "hw_aligned", 0.25)},
    "act_maxabs_pow2_weights_pcs_maxabs_pow2": {"weight": ("channel", "pow2", 0.5),
                                                "activation": ("tensor", "pow2", 0.25)},
    "act_maxabs_pcs_pow2_weight_maxabs_pts_pow2_hw": {"weight": ("tensor", "hw_aligned", 0.5),
                                                      "activation": ("channel", "pow2", 1.0)},
}
# INC's EXP_BIAS_SETS (fp_utils.py): the biases whose scales are "hardware aligned". Gaudi 3's
# is range(0, 63), which stops at 62 although the bias field reaches 63.
_INC_BIAS_SETS = {"gaudi2": {"e4m3": (3, 7, 11, 15), "e5m2": (15,)},
                  "gaudi3": {"e4m3": tuple(range(0, 63)), "e5m2": tuple(range(0, 63))}}
_INC_SCALE_STEP = {"gaudi2": 4, "gaudi3": 1}   # DEVICES_SCALE_FACTORS: powers of 16 / of 2
_F32 = np.float32


def fullscale(chip, kind="e4m3", bias=None) -> float:
    """INC's ``get_fullscale``: the FP8 range a scale maps maxabs onto.

    Gaudi 2 E4M3: 240 (INC takes torch's float8_e4m3fnuz max, equal to Gaudi 2's IEEE-like E4M3
    at bias 7); Gaudi 3 E4M3: 448 (float8_e4m3fn); E5M2: 57344. At another exponent bias b the
    range is multiplied by 2^(default bias - b).
    """
    _chip(chip)
    base = {("gaudi2", "e4m3"): 240.0, ("gaudi3", "e4m3"): 448.0}.get((chip, kind), 57344.0)
    if kind not in _FP8_LAYOUTS:
        raise ValueError(f"kind must be 'e4m3' or 'e5m2'; got {kind!r}")
    default = _DEFAULT_BIAS[kind]
    return base * 2.0 ** (default - (default if bias is None else bias))


def hw_aligned_scales(chip, kind="e4m3") -> tuple[float, ...]:
    """INC's ``get_fp8_hw_alligned_scales``: fullscale(bias)/fullscale(default) = 2^(7 - bias)
    over the chip's bias set -- Gaudi 2 E4M3: 16, 1, 1/16, 1/256 (powers of 16 in [16^-2, 16]);
    Gaudi 3: 2^7 down to 2^-55 (biases 0..62)."""
    return tuple(fullscale(chip, kind, b) / fullscale(chip, kind)
                 for b in _INC_BIAS_SETS[_chip(chip)][kind])


#: Assumption ``log2_rounding`` of the scale rounding: INC evaluates torch.log2 in its hp_dtype;
#: "exact" takes ceil(log2 s) of the float32 scale exactly, "float32" rounds log2(s) to the
#: nearest float32 first (torch.log2 on float32, taken as correctly rounded), which gives one
#: power of two less when s lies just above a power of two (s = 16·(1 + 2^-23): 16, not 32).
LOG2_ROUNDINGS = ("exact", "float32")


def _pow2_ceil(s: np.ndarray, log2_rounding: str) -> np.ndarray:
    """2^ceil(log2 s) of float32 s (INC's ScaleToPow2: torch.exp2(torch.ceil(torch.log2(s))));
    0 gives 0, inf inf, NaN NaN."""
    if log2_rounding not in LOG2_ROUNDINGS:
        raise ValueError(f"log2_rounding must be one of {LOG2_ROUNDINGS}; got {log2_rounding!r}")
    s64 = s.astype(np.float64)
    m, e = np.frexp(s64)
    e = np.where(m == 0.5, e - 1, e)                          # exact ceil(log2 s)
    if log2_rounding == "float32":
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.ceil(np.log2(s64).astype(_F32)).astype(np.float64)
    finite = np.isfinite(s) & (s > 0)
    with np.errstate(over="ignore"):
        p = np.ldexp(1.0, np.where(finite, e, 0).astype(np.int64)).astype(_F32)
    return np.where(finite, p, s).astype(_F32)


def round_scale(scale, *, chip, method, kind="e4m3", log2_rounding="exact"):
    """INC's scale rounding (round_scales_function.py) of float32 scales (a float32 scalar for
    a scalar, else an array).

    "identity": unchanged. "pow2": 2^ceil(log2 s). "unit": 1. "hw_aligned": pow2, then up to a
    power of 2^step (step 4 on Gaudi 2: powers of 16; 1 on Gaudi 3), clamped to
    [min, max] of :func:`hw_aligned_scales` (INC uses the E4M3 set for every FP8 kind): 0 gives
    the minimum, inf the maximum, NaN stays NaN. ``log2_rounding``: :data:`LOG2_ROUNDINGS`.
    """
    s = np.asarray(scale, dtype=_F32)
    if method not in ("identity", "unit", "pow2", "hw_aligned"):
        raise ValueError("method must be 'identity', 'pow2', 'hw_aligned' or 'unit'; "
                         f"got {method!r}")
    if method == "identity":
        out = s
    elif method == "unit":
        out = np.ones_like(s)
    else:
        out = _pow2_ceil(s, log2_rounding)
    if method == "hw_aligned":
        step = _INC_SCALE_STEP[_chip(chip)]
        allowed = hw_aligned_scales(chip, "e4m3")
        finite = np.isfinite(out) & (out > 0)
        e = np.frexp(np.where(finite, out, 1).astype(np.float64))[1] - 1   # log2 of the power
        aligned = np.where(finite, np.ldexp(1.0, -(-e // step) * step), out)  # 2^(⌈e/step⌉·step)
        out = np.clip(aligned, min(allowed), max(allowed))
    return np.asarray(out, _F32)[()]


def maxabs(x, axis=None) -> np.ndarray:
    """max|x| in float32: of the tensor (axis None), or per channel along ``axis`` (the max over
    every other axis, shape (x.shape[axis],)). NaN propagates."""
    x = np.asarray(x)
    x = _decode(x) if x.dtype not in (np.float32, np.float64) else x.astype(_F32)
    a = np.abs(x)
    if axis is None:
        return _F32(a.max()) if a.size else _F32(0)
    axis = axis % x.ndim
    return np.moveaxis(a, axis, 0).reshape(x.shape[axis], -1).max(axis=1).astype(_F32)


def scale_from_maxabs(amax, *, chip, method="identity", backoff=1.0, kind="e4m3",
                      log2_rounding="exact"):
    """INC's ``calc_maxabs_scale`` then the rounding: s = f32(maxabs / f32(fullscale·backoff)),
    rounded by :func:`round_scale`. x quantizes as round_fp8(x / s) and dequantizes as q·s."""
    denom = _F32(fullscale(chip, kind) * backoff)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.asarray(amax, dtype=_F32) / denom
    return round_scale(s, chip=chip, method=method, kind=kind, log2_rounding=log2_rounding)


def _role(role):
    if role not in INC_BACKOFFS:
        raise ValueError(f"role must be 'weight' or 'activation'; got {role!r}")
    return INC_BACKOFFS[role]


def maxabs_hw(x, *, chip, role, axis=None, kind="e4m3", log2_rounding="exact"):
    """INC's MAXABS_HW scale (float32): maxabs/(fullscale·backoff), backoff 0.5 (weights) or 0.25
    (activations), rounded up to a power of two and then into the chip's hardware-aligned set
    (:func:`round_scale` "hw_aligned"). Per tensor; ``axis`` gives the per-channel variant."""
    return scale_from_maxabs(maxabs(x, axis), chip=chip, method="hw_aligned",
                             backoff=_role(role), kind=kind, log2_rounding=log2_rounding)


def maxabs_pow2(x, *, chip, role, axis=None, kind="e4m3", log2_rounding="exact"):
    """INC's MAXABS_POW2 scale (float32): as :func:`maxabs_hw` without the hardware alignment
    (scale_method_config.py; the PCS variants use ``axis``)."""
    return scale_from_maxabs(maxabs(x, axis), chip=chip, method="pow2", backoff=_role(role),
                             kind=kind, log2_rounding=log2_rounding)


def unit_scale(x, *, axis=None):
    """INC's UNIT_SCALE: 1.0 per tensor, or per channel along ``axis`` (float32)."""
    x = np.asarray(x)
    return _F32(1) if axis is None else np.ones(x.shape[axis % x.ndim], _F32)


def describe(chip) -> dict:
    """The chip's models, formats, conversion rules and assumptions as a JSON-ready dict."""
    chip = _chip(chip)
    return {
        "chip": chip, "evidence": dict(EVIDENCE),
        "mme": {f: {"width": c.width, "fraction_bits": c.fraction_bits, "rounding": c.rounding,
                    "note": c.note} for (ch, f), c in MME_CONFIGS.items() if ch == chip},
        "fp8": {"e4m3_biases": list(GAUDI2_FP8_BIASES["e4m3"]) if chip == "gaudi2" else "0..63",
                "modes": ["full"] if chip == "gaudi2" else list(FP8_MODES)},
        "conversion": {"modes": list(CONVERSION_MODES), "overflow": "ieee (mpt.round, no "
                       "saturate); clip=True saturates", "lfsr_lanes": dict(LFSR_LANES)},
        "assumptions": {"lfsr_polynomial": hex(DEFAULT_LFSR_POLYNOMIAL),
                        "lfsr_seeds": "lane i starts at i + 2",
                        "k_walk": "all of K in one walk of trees from k = 0",
                        "log2_rounding": "exact (INC: torch.log2 in its hp_dtype)"},
        "scaling": {"methods": list(INC_SCALE_METHODS), "hw_aligned_scales":
                    [min(hw_aligned_scales(chip)), max(hw_aligned_scales(chip))]},
    }
