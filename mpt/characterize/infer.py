"""L5: reading the battery — what each family of probes says about the matrix unit.

Every reader takes the probe set and the adapter's result bits (P,) and returns a
:class:`Finding`: a name, a JSON-ready value and one line of text. Readings are exact
comparisons of bit patterns with the values each hypothesis predicts; a pattern that fits no
hypothesis is reported as such ("irregular"), never forced into one.

The block model's parameters come out of these readings: F from ``align_c``/``align_p``, L from
the summation tree (``fprev``, or ``pairs`` where the formats are too narrow), the output
rounding from ``round`` (its precision and direction) and e_zero from ``zero``
(:func:`read_zero`, which needs F and the rounding). :mod:`mpt.characterize.fit` then builds the
block model and checks it against every probe.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from mpt.characterize.probes import ProbeSet
from mpt.engines.operands import output_params, roundings
from mpt.formats import get_format

__all__ = ["Finding", "read_all", "read_zero", "read_nans", "read_long", "values"]


@dataclass(frozen=True)
class Finding:
    """One inferred property: ``value`` (JSON-ready) and ``text`` for the report."""

    name: str
    value: object
    text: str


def values(ps: ProbeSet, d: np.ndarray) -> np.ndarray:
    """The result bits as float64 values (exact: every output format is a subset of fp64)."""
    dtype = get_format(ps.out_format).dtype
    return np.ascontiguousarray(d).view(dtype).astype(np.float64)


def _rows(ps, family):
    """{args: row} of one family (args: the key without the family name)."""
    return {ps.keys[i][1:]: i for i in ps.rows(family)}


def _products(n: int) -> str:
    return "1 product" if n == 1 else f"{n} products"


def _length(ps, family) -> int:
    """The K of a family's rows (0 if it has none)."""
    rows = ps.rows(family)
    return int(ps.lengths[rows[0]]) if rows else 0


def _leading(flags: list[bool]) -> tuple[int, bool]:
    """(length of the leading run of True, whether the rest is all False)."""
    n = 0
    while n < len(flags) and flags[n]:
        n += 1
    return n, not any(flags[n:])


def read_alignment(ps, d) -> tuple[Finding, int | None]:
    """F from ``align_c`` (c survives j bits below the products' anchor iff j ≤ F) and
    ``align_p`` (a product survives iff j ≤ F). Returns the finding and F for the block model
    (None unless C and products are aligned alike)."""
    out = {}
    for family in ("align_c", "align_p"):
        rows = sorted(_rows(ps, family).items())
        if not rows:
            out[family] = (None, None, True)
            continue
        e = ps.params[family]["E"]
        want = [2.0**(e - j) for (j,), _ in rows]
        kept = list(ps.out_bits(want) == d[[i for _, i in rows]])
        n, regular = _leading(kept)
        out[family] = (n, rows[-1][0][0], regular)
    (fc, jc, rc), (fp, jp, rp) = out["align_c"], out["align_p"]
    value = {"c": None if fc is None or fc == jc else fc, "c_at_least": jc if fc == jc else None,
             "products": None if fp is None or fp == jp else fp,
             "products_at_least": jp if fp == jp else None, "regular": bool(rc and rp)}
    f = None
    # products never truncated within the j the input format can reach (jp) agree with any
    # F >= jp; C never truncated within jc agrees with any F >= jc
    if not (rc and rp):
        text = "irregular: c or a product survives past a bit where a larger one was lost"
    elif value["c"] is not None and (value["products"] == value["c"] or
                                     (value["products"] is None and
                                      (fp is None or jp <= value["c"]))):
        f = value["c"]
        text = f"F = {f}: C and products are truncated {f} bits below the largest exponent"
        if value["products"] is None:
            text += (f" (products seen to {jp} bits only: the input format's range)" if fp
                     else " (C's alignment; the input format cannot form the product probes)")
    elif value["products"] is not None and value["c"] is None and \
            (jc is None or jc <= value["products"]):
        f = value["products"]
        text = f"F = {f} (the products' alignment; the output format cannot show C's)"
    else:
        c_text = f"C kept to {value['c']} bits" if value["c"] is not None else \
            f"C never truncated (>= {jc} bits)" if jc else "C not probed"
        p_text = f"products kept to {value['products']} bits" if value["products"] is not None \
            else f"products never truncated (>= {jp} bits)" if jp else "products not probed"
        text = f"no single F: {c_text}, {p_text} below the largest exponent"
    return Finding("alignment", value, text), f


# ---- the summation tree (FPRev) ---------------------------------------------------------------

def _chain(k, block, i, j):
    """Count of small leaves an FPRev probe keeps for blocks of ``block`` chained in increasing
    k with C in the first block: everything up to the end of the block of the later M is lost."""
    last = j if i == "c" else max(i, j)
    return k - min(k, block * (last // block + 1))


def _chain_down(k, block, i, j):
    """The same for blocks chained in decreasing k (C first): everything from the start of the
    block of the earlier M to the end is lost."""
    first = j if i == "c" else min(i, j)
    return block * (first // block)


def _pairwise(k, group, i, j):
    """The same for pairwise trees of ``group`` leaves, chained: the smallest aligned subtree."""
    if i != "c" and i // group == j // group:
        return k - (1 << (i ^ j).bit_length())
    return _chain(k, group, i, j)


def _exact(k, i, j):
    return k - 1 if i == "c" else k - 2


def _tree_hypotheses(k):
    yield "exact", None, lambda i, j: _exact(k, i, j)
    for block in range(1, k + 1):
        yield "chain", block, lambda i, j, b=block: _chain(k, b, i, j)
    for block in range(1, k):
        yield "chain_down", block, lambda i, j, b=block: _chain_down(k, b, i, j)
    g = 4
    while g <= k:
        yield "pairwise", g, lambda i, j, g=g: _pairwise(k, g, i, j)
        g *= 2


_TREE_TEXT = {
    "exact": "no rounding between the products: the whole sum is exact (one rounding)",
    "chain": "blocks of {b}, chained in increasing k (each block's result is the next "
             "block's C), C in the first block",
    "chain_down": "blocks of {b}, chained in decreasing k (the last block first), C in "
                  "the first block computed",
    "pairwise": "pairwise trees of {b}, each tree's sum added to a running accumulator "
                "in increasing k",
}


def read_tree(ps, d, fraction_bits) -> tuple[Finding, int | None]:
    """The summation tree from the FPRev probes (Xie et al.: the count of small leaves that
    survive tells the smallest subtree holding both large ones), or, where the formats cannot
    swamp (gap too small), the block size from the ``pairs`` probes. Returns the finding and L
    of a chain of blocks (None otherwise)."""
    k = _length(ps, "fprev") or _length(ps, "pairs")
    rows = _rows(ps, "fprev")
    params = ps.params.get("fprev")
    # every sum of up to K small leaves must lie below both the alignment grid and half an ulp
    # of M: K·y < 2^(E_M − max(F, p))
    need = max(fraction_bits or 0, get_format(ps.out_format).precision) + 1 + (k - 1).bit_length()
    if rows and params and params["gap"] >= need:
        y = 2.0 ** params["E_y"]
        got = {args: values(ps, d[[i]])[0] / y for args, i in rows.items()}
        for kind, size, predict in _tree_hypotheses(k):
            if all(got[args] == predict(*args) for args in got):
                value = {"tree": kind, "size": size, "source": "fprev", "c_first": True}
                return Finding("summation", value, _TREE_TEXT[kind].format(b=_products(size))), \
                    size if kind == "chain" else None
        ints = {a: v for a, v in got.items() if a[0] != "c"}
        for kind, size, predict in _tree_hypotheses(k):
            if all(v == predict(*a) for a, v in ints.items()):
                text = _TREE_TEXT[kind].format(b=_products(size))
                text = text.replace(", C in the first block", "")
                c_end = all(v == 0 for a, v in got.items() if a[0] == "c")
                text += "; C added after the products" if c_end else "; C joins irregularly"
                value = {"tree": kind, "size": size, "source": "fprev", "c_first": False}
                return Finding("summation", value, text), None
        return Finding("summation", {"tree": None, "source": "fprev"},
                       "irregular: the FPRev counts fit no chain of blocks or pairwise tree"), None
    return _read_pairs(ps, d, k)


def _read_pairs(ps, d, k) -> tuple[Finding, int | None]:
    rows = _rows(ps, "pairs")
    if not rows:
        return Finding("summation", None, "not observable with these formats"), None
    c = ps.params["pairs"]["C"]
    joined_bits, apart_bits = ps.out_bits([c + 2, c])
    joined = {}
    for args, i in rows.items():
        if d[i] not in (joined_bits, apart_bits):
            return Finding("summation", {"tree": None, "source": "pairs"},
                           "irregular: a pair of ones added to 2^p gave neither 2^p nor "
                           "2^p + 2"), None
        joined[args] = d[i] == joined_bits
    for size in range(1, k + 1):
        if all(v == (i // size == j // size) for (i, j), v in joined.items()):
            value = {"tree": "groups", "size": size, "source": "pairs"}
            if size == k:
                return Finding("summation", value, f"one rounding for all {k} products (the "
                               "formats are too narrow for the FPRev probes)"), None
            return Finding("summation", value, f"a rounding after every {_products(size)} (pair "
                           f"probes; the formats are too narrow to show the order)"), size
    return Finding("summation", {"tree": None, "source": "pairs"},
                   "irregular: the pair probes fit no fixed group size"), None


# ---- output rounding ----------------------------------------------------------------------------

#: (|d| − 2^s) for the fractions 1/4, 1/2, 3/4, 3/2 at s = p − 1 (ulp 1), positive then negative
_DIRECTIONS = {
    "toward zero": ((0, 0, 0, 1), (0, 0, 0, 1)),
    "nearest, ties to even": ((0, 0, 1, 2), (0, 0, 1, 2)),
    "nearest, ties away": ((0, 1, 1, 2), (0, 1, 1, 2)),
    "up": ((1, 1, 1, 2), (0, 0, 0, 1)),
    "down": ((0, 0, 0, 1), (1, 1, 1, 2)),
}


def read_rounding(ps, d, fraction_bits, block=None) -> Finding:
    """Precision p (c = 2^s − 1 plus 1 + 1 = 2^s + 1 is kept iff s ≤ p − 1, and the ones are
    not lost to the alignment: s − 1 ≤ F; where F hides p, the ``carry`` rows, when its nine
    terms share one block: ``block`` None or at least 9) and direction (MMA-Sim's table of sums
    a quarter, half, three quarters and one and a half ulp above 2^(p−1), both signs)."""
    rows = _rows(ps, "round")
    fout = get_format(ps.out_format)
    plus = sorted((s, i) for (s, x, sign), i in rows.items()
                  if x == "1" and sign == 1 and s < fout.precision)     # 2^s + 1 representable
    if not plus:
        return Finding("rounding", None, "not observable with these formats")
    kept = list(ps.out_bits([2.0**s + 1 for s, _ in plus]) == d[[i for _, i in plus]])
    n, regular = _leading(kept)
    precision = n + 1
    # the ones sit F bits below c's top bit in its own block, F + 1 below in a later one
    limited = fraction_bits is not None and n >= fraction_bits and precision < fout.precision
    carried = _carried(ps, d) if block is None or block >= 9 else None   # min(F, p − 4)
    if carried is not None and (fraction_bits is None or carried < fraction_bits) and \
            carried + 4 <= fout.precision:
        precision, limited = carried + 4, False
    value = {"precision": None if limited else precision,
             "precision_at_least": precision if limited else None, "direction": None}
    text = (f"at least {precision} bits (the alignment F = {fraction_bits} hides more)"
            if limited else f"{precision} significant bits")
    if not regular:
        return Finding("rounding", value, "irregular: 2^s + 1 kept after a smaller s was lost")
    s0 = precision - 1
    if not limited and (fraction_bits is None or fraction_bits >= precision):
        seen = []
        for sign in (1, -1):
            row = []
            for x in ("1/4", "1/2", "3/4", "3/2"):
                i = rows.get((s0, x, sign))
                if i is None:
                    break
                row.append(abs(values(ps, d[[i]])[0]) - 2.0**s0)
            seen.append(tuple(row))
        found = [name for name, want in _DIRECTIONS.items() if tuple(map(tuple, want)) ==
                 tuple(seen)]
        if found:
            value["direction"] = found[0]
            text += f", rounded {found[0]}"
    named = _named(value, fout)
    if named:
        value["named"] = named
        text += f" ({named})"
    return Finding("rounding", value, text)


def _carried(ps, d) -> int | None:
    """The last j whose ``carry`` row keeps 2^(E−j) beside 2^(E+3) (None without rows)."""
    rows = sorted(_rows(ps, "carry").items())
    if not rows:
        return None
    e = ps.params["carry"]["E"]
    want = ps.out_bits([2.0**(e + 3) + 2.0**(e - j) for (j,), _ in rows])
    n = _leading(list(want == d[[i for _, i in rows]]))[0]
    return None if n == len(rows) else n           # every row kept: the format's range ends


def _named(value, fout):
    """The output rounding of mpt's table with this precision and direction, if one."""
    if value["precision"] is None or value["direction"] not in ("toward zero",
                                                                "nearest, ties to even"):
        return None
    for name in roundings():
        precision, emin, _, nearest = output_params(name)
        if precision == value["precision"] and emin == fout.emin and \
                nearest == (value["direction"] != "toward zero"):
            return name
    return None


# ---- zero terms ----------------------------------------------------------------------------------

def read_zero(ps, d, fraction_bits, rounding) -> Finding:
    """e_zero: with only tiny terms A (2q, or q + q/2 under round-to-nearest) and
    B = −q·2^-s, B survives iff q·2^-s ≥ 2^(anchor − F), anchor = max(e(A), e_zero); the last
    surviving s gives the anchor. Also whether a zero product's exponent depends on its partner
    (``zero_partner``: 0·2^emax instead of 0·0 in the padding)."""
    if fraction_bits is None or rounding is None:
        return Finding("zeros", None, "needs F and the output rounding of a block model")
    precision, emin, _, nearest = output_params(rounding)
    qe = emin - precision + 1
    style = "rne" if nearest else "rz"
    rows = sorted((s, i) for (st, q, s), i in _rows(ps, "zero").items() if st == style and q == qe)
    partner = _rows(ps, "zero_partner")
    value = {"e_zero": None, "e_zero_at_most": None, "partner_matters": None}
    if not rows:
        return Finding("zeros", value, "e_zero not observable: the input format cannot form "
                                       "products as small as the output's quantum")
    q_bits = ps.out_bits([2.0**qe])[0]
    kept = [d[i] == q_bits for _, i in rows]
    n, regular = _leading(kept)
    value["partner_matters"] = bool(any(d[partner[(style, qe, s)]] != d[i] for s, i in rows
                                        if (style, qe, s) in partner))
    e_a = qe + 1 if style == "rz" else qe
    if not regular or n == 0:
        return Finding("zeros", value, "irregular: the tiny-term probes fit no e_zero")
    s_max = rows[n - 1][0]
    if n == len(rows):
        bound = qe + fraction_bits - s_max
        value["e_zero_at_most"] = bound
        text = f"e_zero <= {bound} (the input format cannot form smaller terms)"
    else:
        anchor = qe + fraction_bits - s_max
        if anchor > e_a:
            value["e_zero"] = anchor
            text = f"e_zero = {anchor}: a zero term aligns as 2^{anchor}"
        elif anchor == e_a:
            value["e_zero_at_most"] = e_a
            text = f"e_zero <= {e_a} (the tiny terms themselves anchor the alignment)"
        else:
            return Finding("zeros", value, "irregular: tiny terms lost beyond the block model's "
                                           "alignment")
    if value["partner_matters"]:
        text += "; a zero product's exponent depends on its partner (MMA-Sim's rule)"
    return Finding("zeros", value, text)


# ---- signs, subnormals, specials, products ---------------------------------------------------

def _sign_text(bits, ps):
    v = values(ps, np.array([bits], _bits_dtype(ps)))[0]
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "+0"
    return f"{v!r}"


def _bits_dtype(ps):
    return np.dtype(f"u{np.dtype(get_format(ps.out_format).dtype).itemsize}")


def read_sign(ps, d) -> Finding:
    """The sign of zero results: an exact zero sum of −0 terms and of 1 − 1 (+0 in a block model,
    −0 from IEEE additions of −0), and a negative sum below half the output's quantum (−0 when
    the sign is kept, +0 under MMA-Sim's rule)."""
    rows = _rows(ps, "sign")
    seen = {"_".join(map(str, args)): _sign_text(d[i], ps) for args, i in rows.items()}
    parts = []
    if "neg_zero" in seen:
        parts.append(f"(-0)*1 + ... + (-0)*1 + (-0) gives {seen['neg_zero']}")
    if "cancel" in seen:
        parts.append(f"1 - 1 gives {seen['cancel']}")
    tiny = [seen[k] for k in ("tiny_1", "tiny_2") if k in seen]
    if tiny:
        parts.append("a negative sum that rounds to zero gives " + "/".join(dict.fromkeys(tiny)))
    return Finding("signs", seen, "; ".join(parts) or "not observable")


def read_subnormal(ps, d) -> Finding:
    """Subnormal inputs, c and results: kept (the exact value) or flushed (0)."""
    rows = _rows(ps, "subnormal")
    got, status = values(ps, d), {}
    for (name,), i in rows.items():
        want = _exact_result(ps, i)
        status[name] = "kept" if _same(got[i], want) else "flushed" if got[i] == 0 else \
            f"{float(got[i])!r} (exact {float(want)!r})"
    words = {"inputs": [status[n] for n in ("a_min", "b_min", "a_max") if n in status],
             "c": [status[n] for n in ("c", "c3") if n in status],
             "results": [status["result"]] if "result" in status else []}
    text = ", ".join(f"{what} {'/'.join(dict.fromkeys(s))}" for what, s in words.items() if s)
    return Finding("subnormals", status, "subnormal " + text if text else "not observable")


def _exact_result(ps, i) -> Fraction:
    """The exact a·b + c of a probe row (finite operands)."""
    a, b = ps.a[i].astype(np.float64), ps.b[i].astype(np.float64)
    return sum((Fraction(x) * Fraction(y) for x, y in zip(a, b) if x and y),
               Fraction(float(ps.c[i])))


def _same(got: float, want: Fraction) -> bool:
    return math.isfinite(got) and Fraction(got) == want


def read_special(ps, d) -> Finding:
    """The bits of every special-value probe, and which NaN patterns come out."""
    rows = _rows(ps, "special")
    width = 2 * np.dtype(_bits_dtype(ps)).itemsize
    seen = {args[0]: f"{int(d[i]):0{width}x}" for args, i in rows.items()}
    got = values(ps, d)
    nans = sorted({seen[a[0]] for a, i in rows.items() if math.isnan(got[i])})
    text = "NaN results: " + (", ".join(nans) if nans else "none") if rows else "not observable"
    return Finding("specials", seen, text)


def read_nans(ps, d) -> Finding:
    """Which NaN comes out when several meet (the ``nans`` rows): for each row of several NaNs,
    "first" or "last" when it gives what the first or the last of them (in the order c, a_0,
    b_0, a_1, ...) gives alone, "same" when both alone give the same NaN (a canonical NaN)."""
    rows, params = _rows(ps, "nans"), ps.params.get("nans")
    if not rows or not params:
        return Finding("nans", None, "not observable with these formats")
    width = 2 * np.dtype(_bits_dtype(ps)).itemsize
    out = {}
    for name, (first, last) in params["pairs"].items():
        if (name,) not in rows:
            continue
        got, alone = d[rows[(name,)]], (d[rows[(first,)]], d[rows[(last,)]])
        out[name] = "same" if got == alone[0] == alone[1] else "first" if got == alone[0] else \
            "last" if got == alone[1] else f"{int(got):0{width}x}"
    kinds = set(out.values())
    if kinds == {"same"}:
        text = "one NaN, whatever the payloads met (a canonical NaN)"
    elif kinds <= {"first", "same"}:
        text = "the first NaN met comes out (order c, a_0, b_0, a_1, b_1, ...)"
    elif kinds <= {"last", "same"}:
        text = "the last NaN met comes out (order c, a_0, b_0, a_1, b_1, ...)"
    else:
        text = "several NaNs: " + ", ".join(f"{k}: {v}" for k, v in out.items())
    return Finding("nans", out, text)


def read_long(ps, d, fraction_bits) -> Finding:
    """Where C joins the sum over K = 256 (the ``long`` FPRev rows, +M in c and −M at k_j):
    every y up to the end of the block, instruction or pass holding k_j is lost, so the count
    of surviving y gives its length L (one product at a time: L = 1; no rounding: none lost)."""
    rows, params = _rows(ps, "long"), ps.params.get("fprev")
    if not rows or not params:
        return Finding("passes", None, "not observable with these formats")
    k = _length(ps, "long")
    need = max(fraction_bits or 0, get_format(ps.out_format).precision) + 1 + (k - 1).bit_length()
    if params["gap"] < need:
        return Finding("passes", None, "not observable with these formats")
    y = 2.0 ** params["E_y"]
    got = {j: values(ps, d[[i]])[0] / y for (_, j), i in rows.items()}
    if all(v == k - 1 for v in got.values()):
        return Finding("passes", {"size": None, "exact": True},
                       f"no rounding between C and {k} products")
    sizes = [size for size in range(1, k + 1)
             if all(v == k - min(k, size * (j // size + 1)) for j, v in got.items())]
    if not sizes:
        return Finding("passes", {"size": None, "exact": False},
                       f"irregular: C joins no fixed length of products (K = {k} probes)")
    text = f"C joins the sum after every {_products(sizes[0])} (K = {k} probes)"
    if len(sizes) > 1:
        text += f"; {', '.join(map(str, sizes[1:]))} fit the sampled rows too"
    return Finding("passes", {"size": sizes[0], "sizes": sizes, "exact": False}, text)


def read_product(ps, d) -> Finding:
    """Whether products beyond the output's range, below its quantum or wider than its
    precision enter the sum exactly (each row's exact result is a value of the output)."""
    rows = _rows(ps, "product")
    got, out = values(ps, d), {}
    for (name,), i in rows.items():
        want = _exact_result(ps, i)
        out[name] = "exact" if _same(got[i], want) else \
            f"rounded ({float(got[i])!r}, exact {float(want)!r})"
    text = ", ".join(f"{k}: {v}" for k, v in out.items())
    return Finding("products", out, text or "not observable")


def read_all(ps: ProbeSet, d: np.ndarray) -> tuple[dict[str, Finding], dict]:
    """Every reading; returns the findings by name and the block parameters they give
    (``fraction_bits``, ``block``; the rounding and e_zero are chosen by the fit)."""
    alignment, f = read_alignment(ps, d)
    tree, block = read_tree(ps, d, f)
    findings = [alignment, tree, read_long(ps, d, f), read_rounding(ps, d, f, block),
                read_sign(ps, d),
                read_subnormal(ps, d), read_special(ps, d), read_nans(ps, d),
                read_product(ps, d)]
    return {x.name: x for x in findings}, {"fraction_bits": f, "block": block}

