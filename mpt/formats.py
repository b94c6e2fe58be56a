"""L0: the format table.

One frozen :class:`Format` per number format mpt knows: its bit layout, its limits and the numpy /
ml_dtypes dtype that stores it. Every other module asks this table instead of hard-coding a
constant, and ``tests/test_formats.py`` checks every field against ``ml_dtypes.finfo``/``iinfo``.

Floating formats are described by ``exponent_bits``, ``mantissa_bits`` (stored fraction bits),
``bias`` and how they spend the all-ones exponent:

``nan="ieee"``  IEEE 754: all-ones exponent is Inf (zero fraction) or NaN (fp16, bf16, e5m2).
``nan="fn"``    "finite": no Inf, only S.1111.111 is NaN, the rest of the top binade is finite
                (fp8 e4m3fn).
``nan="fnuz"``  "finite, unsigned zero": no Inf, no −0; the pattern 1000…0 is the only NaN
                (e4m3fnuz, e5m2fnuz, bias 2^(e−1)).
``nan="none"``  every pattern is a finite number (fp6, fp4).
``nan="e8m0"``  unsigned exponent-only scale (OCP MX E8M0): 0xFF is NaN, no zero, no sign.

Integer formats have ``kind="int"`` and use ``exponent_bits = 0``. A *codebook* format
(``kind="codebook"``, NF4 of QLoRA) stores 4-bit indices into a table of levels in [−1, 1] that
multiply a per-block FP32 absmax; its ``levels`` are given as float32-exact numbers.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from mpt._checks import check_bool, check_int

__all__ = [
    "Format",
    "RoundingMode",
    "FORMATS",
    "get_format",
    "custom_format",
    "rounding_mode",
    "register_format_names",
]

#: The unsigned integer dtype of each storage width in bytes: the bit view of any format's values.
UNSIGNED = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
            8: np.dtype(np.uint64)}

_NAN_KINDS = ("ieee", "fn", "fnuz", "none", "e8m0")


class RoundingMode(str, enum.Enum):
    """Rounding modes of :func:`mpt.round` (names as in IEEE 754 / CPFloat)."""

    NEAREST_EVEN = "nearest_even"  # round to nearest, ties to even (IEEE default, RNE)
    NEAREST_AWAY = "nearest_away"  # round to nearest, ties away from zero (RNA)
    TOWARD_ZERO = "toward_zero"    # truncate (RZ)
    UP = "up"                      # toward +Inf (RU)
    DOWN = "down"                  # toward −Inf (RD)
    STOCHASTIC = "stochastic"      # up with probability proportional to the distance (SR)


def rounding_mode(mode) -> RoundingMode:
    """Parse a mode name (or :class:`RoundingMode`); raise ``ValueError`` listing the valid ones."""
    try:
        return RoundingMode(mode)
    except ValueError:
        valid = ", ".join(repr(m.value) for m in RoundingMode)
        raise ValueError(f"mode must be one of {valid}; got {mode!r}") from None


@dataclass(frozen=True)
class Format:
    """A number format: bit layout, limits and storage dtype.

    ``max``, ``min_normal``, ``min_subnormal`` and ``eps`` are exact Python floats (every value is a
    power of two or a short binary fraction, exact in float64). ``eps`` is the distance from 1 to
    the next larger number (``finfo.eps``); for integers it is 1.
    """

    name: str
    kind: str                       # "float" or "int"
    bits: int                       # bits of one encoded value
    exponent_bits: int
    mantissa_bits: int              # stored fraction bits (precision − 1)
    bias: int
    signed: bool
    has_inf: bool
    nan: str                        # one of _NAN_KINDS ("none" for integers)
    dtype: np.dtype = field(compare=False)  # storage dtype (float32 for tf32 and custom formats)
    aliases: tuple[str, ...] = ()
    custom: bool = False
    levels: tuple[float, ...] = ()  # codebook formats only: the values of codes 0, 1, ...

    # ---- derived limits -------------------------------------------------------------------
    @property
    def has_nan(self) -> bool:
        return self.nan != "none"

    @property
    def negative_zero(self) -> bool:
        """Whether −0 exists (IEEE-like signed floats; not fnuz, not e8m0, not integers)."""
        return self.kind == "float" and self.signed and self.nan != "fnuz"

    @property
    def has_zero(self) -> bool:
        return self.nan != "e8m0"

    @property
    def subnormals(self) -> bool:
        return self.kind == "float" and self.mantissa_bits > 0 and self.nan != "e8m0"

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number (1 − bias; e8m0: −bias)."""
        if self.nan == "e8m0":
            return -self.bias
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = (1 << self.exponent_bits) - 1 - self.bias  # exponent of the all-ones field
        if self.nan == "ieee":
            return top - 1
        if self.nan == "e8m0":
            return top - 1
        return top

    @property
    def max(self) -> float:
        """Largest finite value."""
        if self.kind == "codebook":
            return max(self.levels)
        if self.kind == "int":
            return float((1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1)
        m = self.mantissa_bits
        top_fraction = (1 << m) - 1
        if self.nan == "fn":  # S.1111.111 is NaN, so the top binade loses its last code
            top_fraction -= 1
        return float(2.0**self.emax * (1 + top_fraction / 2.0**m))

    @property
    def lowest(self) -> float:
        """Most negative finite value (e8m0: its smallest value, it has no sign)."""
        if self.kind == "codebook":
            return min(self.levels)
        if self.kind == "int":
            return float(-(1 << (self.bits - 1)) if self.signed else 0)
        if self.nan == "e8m0":
            return self.min_normal
        return -self.max

    @property
    def min_normal(self) -> float:
        if self.kind != "float":
            return 1.0
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        if self.kind != "float":
            return 1.0
        if not self.subnormals:
            return self.min_normal
        return 2.0 ** (self.emin - self.mantissa_bits)

    @property
    def eps(self) -> float:
        if self.kind != "float":
            return 1.0
        return 2.0**-self.mantissa_bits

    @property
    def precision(self) -> int:
        """Significant bits (mantissa_bits + 1 for floats, value bits for integers and codes)."""
        if self.kind == "codebook":
            return self.bits
        if self.kind == "int":
            return self.bits - 1 if self.signed else self.bits
        return self.mantissa_bits + 1

    def describe(self) -> dict:
        """The format as a JSON-ready dict (what ``mpt formats --json`` prints)."""
        return {
            "name": self.name,
            "aliases": list(self.aliases),
            "kind": self.kind,
            "bits": self.bits,
            "exponent_bits": self.exponent_bits,
            "mantissa_bits": self.mantissa_bits,
            "bias": self.bias,
            "signed": self.signed,
            "max": self.max,
            "lowest": self.lowest,
            "min_normal": self.min_normal,
            "min_subnormal": self.min_subnormal,
            "eps": self.eps,
            "has_inf": self.has_inf,
            "nan": self.nan,
            "negative_zero": self.negative_zero,
            "dtype": np.dtype(self.dtype).name,
            "custom": self.custom,
            "levels": list(self.levels),
        }

    def __str__(self) -> str:
        return self.name


def _float(name, e, m, bias, dtype, aliases, *, nan="ieee", signed=True, bits=None):
    return Format(
        name=name, kind="float", bits=bits or (int(signed) + e + m), exponent_bits=e,
        mantissa_bits=m, bias=bias, signed=signed, has_inf=(nan == "ieee"), nan=nan,
        dtype=np.dtype(dtype), aliases=tuple(aliases),
    )


def _int(name, bits, signed, dtype, aliases):
    return Format(
        name=name, kind="int", bits=bits, exponent_bits=0, mantissa_bits=0, bias=0,
        signed=signed, has_inf=False, nan="none", dtype=np.dtype(dtype), aliases=tuple(aliases),
    )


_TABLE = (
    _float("fp64", 11, 52, 1023, np.float64, ("float64", "double", "f64")),
    _float("fp32", 8, 23, 127, np.float32, ("float32", "float", "single", "f32", "full")),
    # TF32: FP32's range with FP16's precision; stored as float32 with the low 13 bits zero.
    _float("tf32", 8, 10, 127, np.float32, ("tensorfloat32", "tensorfloat-32"), bits=19),
    _float("fp16", 5, 10, 15, np.float16, ("float16", "half", "f16")),
    _float("bf16", 8, 7, 127, ml_dtypes.bfloat16, ("bfloat16",)),
    _float("fp8_e4m3fn", 4, 3, 7, ml_dtypes.float8_e4m3fn,
           ("e4m3", "e4m3fn", "float8_e4m3fn", "fp8_e4m3"), nan="fn"),
    _float("fp8_e5m2", 5, 2, 15, ml_dtypes.float8_e5m2, ("e5m2", "float8_e5m2")),
    _float("fp8_e4m3fnuz", 4, 3, 8, ml_dtypes.float8_e4m3fnuz,
           ("e4m3fnuz", "float8_e4m3fnuz"), nan="fnuz"),
    _float("fp8_e5m2fnuz", 5, 2, 16, ml_dtypes.float8_e5m2fnuz,
           ("e5m2fnuz", "float8_e5m2fnuz"), nan="fnuz"),
    _float("e8m0", 8, 0, 127, ml_dtypes.float8_e8m0fnu,
           ("e8m0fnu", "float8_e8m0fnu", "mx_scale"), nan="e8m0", signed=False),
    _float("fp6_e2m3fn", 2, 3, 1, ml_dtypes.float6_e2m3fn, ("e2m3", "float6_e2m3fn"), nan="none"),
    _float("fp6_e3m2fn", 3, 2, 3, ml_dtypes.float6_e3m2fn, ("e3m2", "float6_e3m2fn"), nan="none"),
    _float("fp4_e2m1fn", 2, 1, 1, ml_dtypes.float4_e2m1fn,
           ("e2m1", "fp4", "float4_e2m1fn"), nan="none"),
    _int("int8", 8, True, np.int8, ("i8", "qint8")),
    _int("uint8", 8, False, np.uint8, ("u8", "quint8")),
    _int("int4", 4, True, ml_dtypes.int4, ("i4", "qint4")),
)

# NF4 (QLoRA, Dettmers et al. 2023, docs/techniques.md §4): 16 quantiles of N(0, 1) scaled to
# [-1, 1].
_NF4_LEVELS = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
    0.7229568362236023, 1.0,
)
_TABLE += (
    Format(name="nf4", kind="codebook", bits=4, exponent_bits=0, mantissa_bits=0, bias=0,
           signed=True, has_inf=False, nan="none", dtype=np.dtype(np.uint8),
           aliases=("normalfloat4",), levels=_NF4_LEVELS),
)

#: Every built-in format by canonical name, in the order a reader learns them.
FORMATS: dict[str, Format] = {f.name: f for f in _TABLE}

_LOOKUP: dict[str, Format] = {}
for _f in _TABLE:
    for _key in (_f.name, *_f.aliases):
        assert _key.lower() not in _LOOKUP, _key
        _LOOKUP[_key.lower()] = _f
_BY_DTYPE = {f.dtype: f for f in _TABLE if f.name != "tf32" and f.kind != "codebook"}


# Families of named custom formats (a chip's FP8 flavours), registered by the modules that define
# them: (resolve(name) -> Format or None, the pattern of their names for error messages).
_NAMED_FAMILIES: list = []


def register_format_names(resolve, pattern: str) -> None:
    """Let :func:`get_format` find a family of custom formats by name.

    ``resolve(name)`` gets a lower-case name that is no built-in format and returns the
    :func:`custom_format` of that name, or None if the name is not one of the family's;
    ``pattern`` describes the names (e.g. ``"gaudi_{e4m3|e5m2}_b{bias}_{full|none|minimal}"``)
    for error messages. The formats stay out of :data:`FORMATS` (the built-in table).
    """
    if not callable(resolve) or not isinstance(pattern, str):
        raise TypeError("register_format_names needs a callable resolve and a str pattern")
    _NAMED_FAMILIES.append((resolve, pattern))


def get_format(fmt) -> Format:
    """Look up a format by name or alias (case-insensitive), numpy dtype, or pass a Format through.
    Names of registered families of custom formats (:func:`register_format_names`: Gaudi's FP8
    flavours, Trainium's cFP8) resolve too.

    Raises ``ValueError`` listing the valid names for an unknown one, ``TypeError`` for
    anything else (``None`` included, although ``np.dtype(None)`` is float64).
    """
    if isinstance(fmt, Format):
        return fmt
    if fmt is None:  # np.dtype(None) is float64: a missing format must not silently mean fp64
        raise TypeError("format must be a Format, a format name or a numpy dtype; got None")
    if isinstance(fmt, str):
        found = _LOOKUP.get(fmt.lower())
        if found is not None:
            return found
        for resolve, _ in _NAMED_FAMILIES:
            found = resolve(fmt.lower())
            if found is not None:
                return found
        valid = ", ".join(f"{f.name} ({'/'.join(f.aliases)})" for f in _TABLE)
        families = "".join(f"; {pattern}" for _, pattern in _NAMED_FAMILIES)
        raise ValueError(f"unknown format {fmt!r}; valid formats: {valid}{families}")
    try:
        dtype = np.dtype(fmt)
    except TypeError:
        raise TypeError(
            f"format must be a Format, a format name or a numpy dtype; got {type(fmt).__name__}"
        ) from None
    if dtype in _BY_DTYPE:
        return _BY_DTYPE[dtype]
    raise ValueError(f"no mpt format stores dtype {dtype}; valid dtypes: "
                     + ", ".join(str(d) for d in _BY_DTYPE))


def custom_format(exponent_bits: int, mantissa_bits: int, *, has_inf: bool = True,
                  nan: str | None = None, bias: int | None = None,
                  name: str | None = None) -> Format:
    """A user-defined binary floating-point format whose values are stored as float32.

    Any precision up to fp32: ``1 <= exponent_bits <= 8``, ``0 <= mantissa_bits <= 23``, with
    every value (including subnormals) representable in float32. ``nan`` defaults to ``"ieee"``
    when ``has_inf`` and to ``"fn"`` (only S.1…1.1…1 is NaN, as e4m3fn) otherwise; ``bias``
    defaults to ``2**(exponent_bits-1) - 1`` (``2**(exponent_bits-1)`` for ``nan="fnuz"``).
    """
    exponent_bits = check_int("exponent_bits", exponent_bits)
    mantissa_bits = check_int("mantissa_bits", mantissa_bits)
    has_inf = check_bool("has_inf", has_inf)
    bias = check_int("bias", bias, optional=True)
    if not 1 <= exponent_bits <= 8:
        raise ValueError(f"exponent_bits must be in [1, 8] (float32 storage); got {exponent_bits}")
    if not 0 <= mantissa_bits <= 23:
        raise ValueError(f"mantissa_bits must be in [0, 23] (float32 storage); got {mantissa_bits}")
    if nan is None:
        nan = "ieee" if has_inf else "fn"
    if nan not in ("ieee", "fn", "fnuz", "none"):
        raise ValueError(f"nan must be one of 'ieee', 'fn', 'fnuz', 'none'; got {nan!r}")
    if has_inf != (nan == "ieee"):
        raise ValueError(f"has_inf={has_inf} contradicts nan={nan!r} (only 'ieee' has Inf)")
    if nan == "fn" and mantissa_bits == 0 and exponent_bits == 1:
        raise ValueError("a 1-bit exponent with no mantissa and nan='fn' has no finite non-zero "
                         "value")
    if bias is None:
        bias = (1 << (exponent_bits - 1)) - (0 if nan == "fnuz" else 1)
    fmt = Format(
        name=name or f"e{exponent_bits}m{mantissa_bits}" + ("" if nan == "ieee" else nan),
        kind="float", bits=1 + exponent_bits + mantissa_bits, exponent_bits=exponent_bits,
        mantissa_bits=mantissa_bits, bias=int(bias), signed=True, has_inf=has_inf, nan=nan,
        dtype=np.dtype(np.float32), custom=True,
    )
    if fmt.emax < fmt.emin:
        raise ValueError(f"format {fmt.name} has no normal binade (bias={bias})")
    if fmt.max >= 2.0**128 or fmt.min_subnormal < 2.0**-149:
        raise ValueError(
            f"bias={bias} puts the range of {fmt.name} [{fmt.min_subnormal!r}, {fmt.max!r}] "
            "outside float32 (values must be exact float32 numbers)"
        )
    return fmt
