"""L5: probes — single output elements ``d = a·b + c`` of an MMA, built exactly in any formats.

A probe is one row: ``a`` and ``b`` are K-vectors of the input format, ``c`` a value of the
output format, and the adapter returns one value ``d``. Probes are written as the *products* they
need (``m·2^e``, :func:`pow2`) at chosen positions k; :class:`ProbeBuilder` factors each product
into two operands that the input format holds exactly (``a = m₁·2^i``, ``b = m₂·2^j``), or
reports that the format cannot form it (fp4 cannot form 2^-30), so that a family of probes adapts
to each format instead of assuming fp16. Every value stays exact: products as (m, e) integers,
operands and c as Python floats (exact for every format up to fp64), stored through
:func:`mpt.round` of exact values (no rounding happens).

A :class:`ProbeSet` holds the rows as arrays of the formats' storage dtypes — ``a``, ``b``:
(P, K), ``c``: (P,) — with each row's family, key (the family's arguments) and a short note.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from mpt.formats import UNSIGNED, get_format
from mpt.rounding import SPECIALISE_MIN
from mpt.rounding import round as _round

__all__ = ["Product", "pow2", "ProbeSet", "ProbeBuilder", "fits", "exact_in", "pow2_range",
           "factor", "bits_of", "probe_name", "nan_patterns", "value_bits"]


@dataclass(frozen=True)
class Product:
    """The product value ``m·2^e`` a probe needs at one position (m a non-zero integer)."""

    m: int
    e: int

    def __neg__(self) -> "Product":
        return Product(-self.m, self.e)

    def __str__(self) -> str:
        sign = "-" if self.m < 0 else ""
        return f"{sign}2^{self.e}" if abs(self.m) == 1 else f"{self.m}*2^{self.e}"


def pow2(e: int, m: int = 1) -> Product:
    """The product ``m·2^e``."""
    return Product(m, e)


def _odd(n: int, e: int) -> tuple[int, int]:
    """n·2^e with the trailing zero bits of n moved into e."""
    shift = (n & -n).bit_length() - 1
    return n >> shift, e + shift


def fits(n: int, e: int, fmt) -> bool:
    """Whether ``n·2^e`` (n ≥ 0) is a finite value of ``fmt`` (normal or subnormal)."""
    return _fits(n, e, get_format(fmt).name)


@functools.lru_cache(maxsize=1 << 16)
def _fits(n: int, e: int, name: str) -> bool:
    if n == 0:
        return True
    fmt = get_format(name)
    n, e = _odd(n, e)
    top = e + n.bit_length() - 1
    if top > fmt.emax or (top == fmt.emax and Fraction(n) * Fraction(2) ** e > Fraction(fmt.max)):
        return False
    if not fmt.subnormals and top < fmt.emin:
        return False
    return e >= max(top, fmt.emin) - fmt.mantissa_bits


def exact_in(x: float, fmt) -> bool:
    """Whether the float ``x`` is a value of ``fmt`` (±Inf and NaN where the format has them;
    −0 where it has a negative zero)."""
    name = fmt if isinstance(fmt, str) else get_format(fmt).name
    if math.isnan(x):
        return get_format(name).has_nan
    return _exact_in(x, name)


@functools.lru_cache(maxsize=1 << 16)
def _exact_in(x: float, name: str) -> bool:
    fmt = get_format(name)
    if math.isinf(x):
        return fmt.has_inf
    if x == 0:
        return math.copysign(1.0, x) > 0 or fmt.negative_zero
    if x < 0 and not fmt.signed:
        return False
    num, den = abs(x).as_integer_ratio()
    return _fits(num, -(den.bit_length() - 1), name)


def pow2_range(fmt) -> tuple[int, int]:
    """(smallest, largest) e such that 2^e is a value of ``fmt``."""
    fmt = get_format(fmt)
    low = fmt.emin - (fmt.mantissa_bits if fmt.subnormals else 0)
    return low, fmt.emax


@functools.lru_cache(maxsize=4096)
def factor(m: int, e: int, fmt_name: str):
    """(a, b): operands of ``fmt`` with a·b = m·2^e exactly, their exponents as close as
    possible (no needless subnormals or extremes); None if the format cannot form the
    product."""
    fmt = get_format(fmt_name)
    n, e = _odd(abs(m), e)
    bits = fmt.precision
    splits = [(n, 1)] if n.bit_length() <= bits else []
    splits += [(d, n // d) for d in range(3, math.isqrt(n) + 1, 2)
               if n % d == 0 and d.bit_length() <= bits and (n // d).bit_length() <= bits]
    low, high = pow2_range(fmt)
    best = None
    for n1, n2 in splits:
        # a = n1·2^ea, b = n2·2^(e − ea): start where their top bits meet, then step outwards
        middle = (e + n2.bit_length() - n1.bit_length()) // 2
        for step in range(0, 2 * (high - low) + 8):
            ea = middle + (step + 1) // 2 * (1 if step % 2 else -1)
            if _fits(n1, ea, fmt.name) and _fits(n2, e - ea, fmt.name):
                gap = abs((ea + n1.bit_length()) - (e - ea + n2.bit_length()))
                if best is None or gap < best[0]:
                    best = (gap, math.ldexp(n1, ea), math.ldexp(n2, e - ea))
                break
    if best is None:
        return None
    return (math.copysign(best[1], m), best[2])


@dataclass
class ProbeSet:
    """Probe rows for one (input format, output format) pair: ``a``, ``b`` (P, K) and ``c``
    (P,) in the formats' storage dtypes (float32 for tf32), and per row its ``family``, its key
    in ``keys`` (the family and its arguments) and ``note`` (what the row computes, for
    reports)."""

    in_format: str
    out_format: str
    a: np.ndarray          # (P, K)
    b: np.ndarray          # (P, K)
    c: np.ndarray          # (P,)
    lengths: np.ndarray    # (P,) the K of each row (a and b are zero beyond it)
    families: list[str]
    keys: list[tuple]
    notes: list[str]
    params: dict = field(default_factory=dict)
    #: what identifies a whole battery (``build_battery``'s arguments), None for any other set:
    #: results of a model on it can be kept and reused (:mod:`mpt.characterize.runner`)
    key: tuple | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def groups(self):
        """(K, row indices) for each distinct row length: one adapter call each."""
        for k in sorted(set(self.lengths.tolist())):
            yield k, np.flatnonzero(self.lengths == k)

    @property
    def names(self) -> list[str]:
        return [probe_name(key) for key in self.keys]

    def rows(self, family: str) -> list[int]:
        """Indices of the rows of one family, in the order they were added."""
        return [i for i, f in enumerate(self.families) if f == family]

    def out_bits(self, values) -> np.ndarray:
        """The output format's bit patterns of exact values (float64 array or list)."""
        return bits_of(_round(np.asarray(values, np.float64), self.out_format), self.out_format)

    def take(self, rows) -> "ProbeSet":
        """The probe set restricted to ``rows`` (indices)."""
        rows = list(rows)
        return ProbeSet(self.in_format, self.out_format, self.a[rows], self.b[rows], self.c[rows],
                        self.lengths[rows], [self.families[i] for i in rows],
                        [self.keys[i] for i in rows], [self.notes[i] for i in rows], self.params)


def probe_name(key: tuple) -> str:
    """A probe's name from its key: ``("align_c", 12)`` -> ``align_c[12]``; a spec vector is
    called by its own name (``("spec", "V1")`` -> ``V1``)."""
    family, *args = key
    if family == "spec":
        return args[0]
    return family if not args else f"{family}[{','.join(map(str, args))}]"


def bits_of(x: np.ndarray, fmt) -> np.ndarray:
    """The unsigned bit patterns of an array of ``fmt``'s storage dtype (tf32: float32)."""
    x = np.ascontiguousarray(x)
    return x.view(UNSIGNED[x.dtype.itemsize])


def value_bits(x: float, fmt) -> int:
    """The storage bit pattern of an exact value (or ±Inf) of ``fmt``."""
    name = get_format(fmt).name
    return int(bits_of(_store(np.array([x], np.float64), name), name)[0])


def nan_patterns(fmt) -> list[int]:
    """Distinct NaN storage patterns of ``fmt``, for probes that meet several NaNs: the two
    largest positive ones (quiet NaNs with different payloads where the format has them) and the
    largest negative one, as many as exist; [] for a format without NaN. A format stored in 32
    or 64 bits (tf32 and the custom formats included) gets IEEE quiet NaNs of that width whose
    payloads differ above tf32's 13 dropped bits."""
    fmt = get_format(fmt)
    if not fmt.has_nan:
        return []
    size = np.dtype(fmt.dtype).itemsize
    sign = 1 << (8 * size - 1)
    if size >= 4:
        top = sign - 1                           # 0x7FFF...: exponent, quiet bit, payload all set
        return [top, top - (1 << 13), sign | top]
    codes = np.arange(1 << (8 * size), dtype=UNSIGNED[size])                       # (2^bits,)
    with np.errstate(invalid="ignore", over="ignore"):
        nan = codes[np.isnan(codes.view(fmt.dtype).astype(np.float32))]
    positive = [int(c) for c in nan if not int(c) & (1 << (fmt.bits - 1))]
    negative = [int(c) for c in nan if int(c) & (1 << (fmt.bits - 1))]
    return positive[::-1][:2] + negative[-1:]


class ProbeBuilder:
    """Collects probes for one (input, output) format pair and K, then builds a
    :class:`ProbeSet`.

    ``add(family, args, terms, c)``: ``terms`` maps a position k to a :class:`Product` (factored
    into operands by the builder) or to an explicit (a, b) pair of input values; c is an exact
    output value. It returns False, adding nothing, when the formats cannot hold the probe.
    ``add_bits`` takes raw storage bit patterns (the spec vectors given in hex). ``k``: the
    usual row length; a row may be shorter or longer (``length``, at most ``width``).
    """

    def __init__(self, in_format: str, out_format: str, k: int = 64, width: int | None = None):
        self.fin, self.fout, self.k = get_format(in_format), get_format(out_format), k
        self.width = max(k, width or k)
        self._a, self._b, self._c, self._len = [], [], [], []
        self._raw: dict[int, tuple] = {}
        self.families, self.keys, self.notes = [], [], []
        self.params: dict = {}

    def out_holds(self, *values: float) -> bool:
        return all(exact_in(v, self.fout.name) for v in values)

    def add(self, family: str, args: tuple, terms: dict, c: float = 0.0, note: str = "",
            length: int | None = None) -> bool:
        """One probe with key ``(family, *args)``: the products or (a, b) pairs of ``terms`` at
        their positions, zeros elsewhere, and c; ``length``: its K (default the builder's).
        False (nothing added) if the formats cannot hold it."""
        row_a, row_b = [0.0] * self.width, [0.0] * self.width
        fin = self.fin.name
        for pos, term in terms.items():
            if isinstance(term, Product):
                pair = factor(term.m, term.e, fin)
                if pair is None:
                    return False
            else:
                pair = term
                if not (exact_in(pair[0], fin) and exact_in(pair[1], fin)):
                    return False
            row_a[pos], row_b[pos] = pair
        if not self.out_holds(c):
            return False
        return self._append(family, args, row_a, row_b, c, note or _note(terms, c), length)

    def add_values(self, family: str, args: tuple, a: list, b: list, c: float, note: str) -> bool:
        """A probe of values a and b (its K: their length) and c that the caller made exact in
        the formats."""
        pad = [0.0] * (self.width - len(a))
        return self._append(family, args, list(a) + pad, list(b) + pad, c, note, len(a))

    def _append(self, family, args, row_a, row_b, c, note, length) -> bool:
        self._a.append(row_a)
        self._b.append(row_b)
        self._c.append(c)
        self._len.append(length or self.k)
        self.families.append(family)
        self.keys.append((family,) + tuple(args))
        self.notes.append(note)
        return True

    def add_bits(self, family: str, args: tuple, a_bits, b_bits, c_bits: int, note: str,
                 length: int) -> bool:
        """A probe given as storage bit patterns (a, b: up to ``length`` each, zero-padded)."""
        if max(len(a_bits), len(b_bits)) > length or length > self.width:
            return False
        self._raw[len(self._a)] = (list(a_bits), list(b_bits), int(c_bits))
        self._a.append([0.0] * self.width)
        self._b.append([0.0] * self.width)
        self._c.append(0.0)
        self._len.append(length)
        self.families.append(family)
        self.keys.append((family,) + tuple(args))
        self.notes.append(note)
        return True

    def build(self, key: tuple | None = None) -> ProbeSet:
        """The probe set (``key``: what identifies it, :attr:`ProbeSet.key`)."""
        a = _store(np.array(self._a, np.float64).reshape(-1, self.width), self.fin.name)  # (P, K)
        b = _store(np.array(self._b, np.float64).reshape(-1, self.width), self.fin.name)  # (P, K)
        c = _store(np.array(self._c, np.float64), self.fout.name)                       # (P,)
        ab, bb, cb = bits_of(a, self.fin), bits_of(b, self.fin), bits_of(c, self.fout)
        for row, (ra, rb, rc) in self._raw.items():
            ab[row, :len(ra)], bb[row, :len(rb)], cb[row] = ra, rb, rc
        return ProbeSet(self.fin.name, self.fout.name, a, b, c, np.array(self._len, np.int64),
                        self.families, self.keys, self.notes, self.params, key)


def _store(values: np.ndarray, fmt: str) -> np.ndarray:
    """Exact values as an array of ``fmt``'s storage dtype (:func:`mpt.round`, which changes
    nothing here), in pieces short enough for its generic kernel: no per-format compilation."""
    flat = values.ravel()
    step = SPECIALISE_MIN - 1
    parts = [_round(flat[i:i + step], fmt) for i in range(0, flat.size, step)] or \
        [_round(flat, fmt)]
    return np.concatenate(parts).reshape(values.shape)


def _note(terms: dict, c: float) -> str:
    """``k0: 2^30, k1: -2^30; c = 2^5``-style text (the first terms of a long row)."""
    positions = sorted(terms)
    parts = []
    for pos in positions[:6] if len(positions) <= 6 else positions[:3]:
        term = terms[pos]
        text = str(term) if isinstance(term, Product) else f"{_show(term[0])}*{_show(term[1])}"
        parts.append(f"k{pos}: {text}")
    if len(positions) > 6:
        parts.append(f"... ({len(positions)} terms)")
    return ", ".join(parts) + f"; c = {_show(c)}"


def _show(x: float) -> str:
    """A value as ±2^e when it is a power of two, else its shortest repr."""
    if x != 0 and math.isfinite(x):
        mant, exp = math.frexp(abs(x))
        if mant == 0.5:
            return ("-" if x < 0 else "") + f"2^{exp - 1}"
    return repr(x)
