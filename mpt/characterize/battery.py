"""L5: the probe battery — every family of probes for one (input, output) format pair.

Each family is a batched directed search: one parameter's candidate values laid out as rows
(``j`` = 1, 2, ... bits below the anchor; a second large term at position ``j`` = 1 ... K−1), so
that the whole battery runs in one adapter call per row length and the reading
(:mod:`mpt.characterize.infer`) finds the threshold. Every family sizes itself to the formats:
the exponents it uses are the largest/smallest that both formats hold, and a family the formats
cannot express is left out (the reading then says "not observable with these formats").

======================  ==========================================================================
family                  rows (K = 64 unless noted)
======================  ==========================================================================
``align_c``             products ±2^E at k0, k1; c = 2^(E−j): c survives iff j ≤ F (C's
                        alignment; Fasi et al. 2021, MMA-Sim's ``probe_c_rounding``)
``align_p``             products ±2^E, 2^(E−j); c = 0: the product's alignment F
``far_c``               product 1, c = ±2^-j far below it: c truncated toward zero, toward −∞
                        (one ulp less), kept or dropped (CDNA3's FP8 rule drops a c more than 25
                        binades below)
``fprev``               +M at i (or in c), −M at j, y = M·2^-G at every other position: the result
                        counts the y outside the smallest subtree holding i and j — the summation
                        tree, hence L and the order of blocks (FPRev, Xie et al.; MMA-Sim's
                        ``is_fused_dot_add``)
``pairs``               c = 2^p, products 1 at i and j: 2^p + 2 iff i and j share a rounding
                        (block size where the formats are too narrow for ``fprev``)
``round``               c = ±(2^s − 1), products ±1, ±x: precision and direction of the output
                        rounding (sums at, above and below half an ulp)
``carry``               eight products 2^E and one 2^(E−j) (at the end of the row): the sum
                        2^(E+3) + 2^(E−j) keeps
                        its last bit iff j ≤ F and j + 4 ≤ p: the output precision where the
                        alignment hides it from ``round`` (FP8 on Ada/Hopper: F = 13, 14 bits)
``zero``                tiny terms 2q (or q + q/2) and −q·2^-s at the end, c = 0: where the zero
                        terms anchor the alignment (e_zero, D1–D5); ``zero_partner``: the same
                        with the zero products formed as 0·(large number)
``sign``                exact zero sums and tiny negative sums: the sign of a zero result
``subnormal``           subnormal a, b, c and results: kept or flushed
``special``             NaN, Inf, Inf·0, Inf − Inf: which NaN comes out
``nans``                several NaNs with distinct payloads (in a, b and c) in one dot product,
                        and each alone: whether the first or the last NaN in the order c, a_0,
                        b_0, a_1, ... comes out (AMD's ``several_nans``), or one canonical NaN
``product``             products beyond the output range, tiny products, products wider than the
                        output: exact or rounded products
``random``              seeded random vectors: the rest of the behaviour, as a fingerprint
``long``                K = 256: the FPRev rows with +M in c (where C joins the sum: passes or
                        instructions longer than 32 products) and random vectors
``spec``                V1–V9, F3–F15, D1–D5 (K = 16): :mod:`mpt.characterize.spec`
======================  ==========================================================================
"""
from __future__ import annotations

import functools
import math

import numpy as np

from mpt.characterize.probes import (ProbeBuilder, ProbeSet, Product, nan_patterns, pow2,
                                     pow2_range, value_bits)
from mpt.characterize.spec import LENGTH, add_spec_vectors
from mpt.engines.operands import output_params, roundings
from mpt.formats import get_format

__all__ = ["K", "LONG_K", "build_battery", "FAMILIES"]

#: products per probe row (covers blocks up to 32 twice over)
K = 64
#: products per row of the ``long`` family (passes up to 128 twice over: Trainium's PE rows)
LONG_K = 256


def build_battery(in_format: str, out_format: str, *, k_multiple: int = 1,
                  seed: int = 0) -> ProbeSet:
    """Every probe family for this format pair. Rows have K = 64 (the spec vectors 16), rounded
    up to a multiple of ``k_multiple`` (the adapter's instruction K). The same arguments give
    the same (read-only) probe set, built once."""
    return _battery(get_format(in_format).name, get_format(out_format).name, k_multiple, seed)


@functools.lru_cache(maxsize=64)
def _battery(in_format: str, out_format: str, k_multiple: int, seed: int) -> ProbeSet:
    k = _round_up(K, k_multiple)
    builder = ProbeBuilder(in_format, out_format, k, _round_up(LONG_K, k_multiple))
    for family in FAMILIES:
        family(builder)
    _random(builder, seed)
    _long(builder, seed)
    add_spec_vectors(builder, min(k, _round_up(LENGTH, k_multiple)))
    ps = builder.build(key=(in_format, out_format, k_multiple, seed))
    for array in (ps.a, ps.b, ps.c, ps.lengths):
        array.flags.writeable = False
    return ps


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _ranges(bld: ProbeBuilder):
    """(lowest, highest) power-of-two exponent of products, and of the output format."""
    lo_in, hi_in = pow2_range(bld.fin)
    lo_out, hi_out = pow2_range(bld.fout)
    return 2 * lo_in, 2 * hi_in, lo_out, hi_out


def _align_c(bld: ProbeBuilder) -> None:
    _, p_hi, lo_out, hi_out = _ranges(bld)
    e = min(p_hi, hi_out - 1)
    bld.params["align_c"] = {"E": e}
    for j in range(1, 65):
        if e - j < lo_out:
            break
        bld.add("align_c", (j,), {0: pow2(e), 1: pow2(e, -1)}, 2.0**(e - j))


def _align_p(bld: ProbeBuilder) -> None:
    p_lo, p_hi, lo_out, hi_out = _ranges(bld)
    e = min(p_hi, hi_out)
    bld.params["align_p"] = {"E": e}
    for j in range(1, 65):
        if e - j < max(p_lo, lo_out):
            break
        bld.add("align_p", (j,), {0: pow2(e), 1: pow2(e, -1), 2: pow2(e - j)})


def _far_c(bld: ProbeBuilder) -> None:
    lo_out = pow2_range(bld.fout)[0]
    p = bld.fout.precision
    for j in sorted({p + 1, p + 3, 26, 30, 40, 60, 100, 140}):
        for sign in (1, -1):
            if -j >= lo_out:
                bld.add("far_c", (j, sign), {0: pow2(0)}, sign * 2.0**-j)


def _fprev(bld: ProbeBuilder) -> None:
    p_lo, p_hi, lo_out, hi_out = _ranges(bld)
    k = bld.k
    e_big = min(p_hi, hi_out - 2)
    # y: a multiple of the coarsest quantum of any output rounding of this format's range (a
    # sum of y's must be exact under RZ-E8M13 too), as far below M as the formats allow
    e_small = max(p_lo, _coarsest_quantum(bld.fout), e_big - 64)
    if e_big - e_small < 8:
        return
    bld.params["fprev"] = {"E_M": e_big, "E_y": e_small, "gap": e_big - e_small}
    for j in range(1, k):
        _fprev_row(bld, "fprev", 0, j, k)
    for j in range(2, k):
        _fprev_row(bld, "fprev", j - 1, j, k)
    for j in range(k):
        _fprev_row(bld, "fprev", "c", j, k)


def _fprev_row(bld: ProbeBuilder, family: str, i, j: int, k: int) -> None:
    """+M at k_i (or in c: i = "c"), −M at k_j, y at every other position of a row of K = k."""
    e_big, e_small = bld.params["fprev"]["E_M"], bld.params["fprev"]["E_y"]
    terms = {p: pow2(e_small) for p in range(k)}
    if i != "c":
        terms[i] = pow2(e_big)
    terms[j] = pow2(e_big, -1)
    note = f"+2^{e_big} at {'c' if i == 'c' else f'k{i}'}, -2^{e_big} at k{j}, 2^{e_small} " \
           f"elsewhere (K = {k})"
    bld.add(family, (i, j), terms, 2.0**e_big if i == "c" else 0.0, note, k)


def _coarsest_quantum(fout) -> int:
    """log2 of the largest smallest-subnormal among the output roundings of fout's range."""
    quanta = [emin - precision + 1 for precision, emin, _, _ in map(output_params, roundings())
              if emin == fout.emin]
    return max(quanta + [pow2_range(fout)[0]])


def _pairs(bld: ProbeBuilder) -> None:
    p = bld.fout.precision
    c = 2.0**p
    bld.params["pairs"] = {"C": c}
    one = pow2(0)
    for i, j in [(0, j) for j in range(1, bld.k)] + [(j - 1, j) for j in range(2, bld.k)]:
        bld.add("pairs", (i, j), {i: one, j: one}, c, f"k{i}: 1, k{j}: 1; c = 2^{p}")


#: fractional second terms x of the ``round`` family: (name, m, e) with x = m·2^e
_FRACTIONS = (("1", 1, 0), ("1/2", 1, -1), ("1/4", 1, -2), ("3/4", 3, -2), ("3/2", 3, -1))


def _round(bld: ProbeBuilder) -> None:
    p = bld.fout.precision
    fractional = {p - 1, p - 2, p - 3} | set(range(10, 16))
    for s in range(1, p + 1):
        for name, m, e in _FRACTIONS:
            if name != "1" and s not in fractional:
                continue
            for sign in (1, -1):
                c = sign * (2.0**s - 1)
                bld.add("round", (s, name, sign), {0: pow2(0, sign), 1: Product(sign * m, e)}, c)


def _carry(bld: ProbeBuilder) -> None:
    """The terms at the end of the row (a later block would truncate the carried sum again)."""
    p_lo, p_hi, lo_out, hi_out = _ranges(bld)
    e, k = min(p_hi, hi_out - 4), bld.k
    bld.params["carry"] = {"E": e}
    for j in range(1, 41):
        terms = {**{k - 9 + i: pow2(e) for i in range(8)}, k - 1: pow2(e - j)}
        if e - j < max(p_lo, lo_out) or not bld.add("carry", (j,), terms):
            break


def _zero(bld: ProbeBuilder) -> None:
    """Tiny terms at the end of the row (so that no later block can change the sign or the
    value), c = 0: A = 2q or q + q/2 (q the output's quantum 2^qe), B = −q·2^-s."""
    _, hi_in = pow2_range(bld.fin)
    k = bld.k
    quanta = sorted({emin - precision + 1 for precision, emin, _, _ in
                     map(output_params, roundings()) if emin == bld.fout.emin} |
                    {pow2_range(bld.fout)[0]})   # every output rounding's quantum
    bld.params["zero"] = {"quanta": quanta}
    partner = {p: (0.0, 2.0**hi_in) for p in range(k - 3)}
    for qe in quanta:
        for s in range(0, 65):
            rz = {k - 2: pow2(qe + 1), k - 1: pow2(qe - s, -1)}
            rne = {k - 3: pow2(qe), k - 2: pow2(qe - 1), k - 1: pow2(qe - s, -1)}
            added = False
            for style, terms in (("rz", rz), ("rne", rne)):
                if style == "rne" and s == 0:
                    continue
                added |= bld.add("zero", (style, qe, s), terms)
                bld.add("zero_partner", (style, qe, s), {**partner, **terms})
            if not added and s > 0:
                break


def _sign(bld: ProbeBuilder) -> None:
    k = bld.k
    qe = pow2_range(bld.fout)[0]
    if bld.fin.negative_zero:
        bld.add("sign", ("neg_zero",), {p: (-0.0, 1.0) for p in range(k)}, -0.0,
                "(-0)*1 at every k; c = -0")
    bld.add("sign", ("cancel",), {0: pow2(0), 1: pow2(0, -1)}, 0.0)
    bld.add("sign", ("cancel_neg_c",), {0: pow2(0), 1: pow2(0, -1)}, -0.0)
    for t in (1, 2):
        bld.add("sign", ("tiny", t), {k - 1: pow2(qe - t, -1)})


def _subnormal(bld: ProbeBuilder) -> None:
    k = bld.k
    fin = bld.fin
    lo_in, hi_in = pow2_range(fin)
    lo_out, hi_out = pow2_range(bld.fout)
    if fin.subnormals:
        largest = fin.min_normal - fin.min_subnormal
        scale = 2.0 ** min(hi_in, max(0, lo_out + 12 - lo_in))
        for name, a, b in (("a_min", fin.min_subnormal, scale), ("b_min", scale, fin.min_subnormal),
                           ("a_max", largest, scale), ("a_half", fin.min_normal / 2, scale)):
            bld.add("subnormal", (name,), {k - 1: (a, b)}, 0.0)
    bld.add("subnormal", ("c",), {}, 2.0**lo_out)
    bld.add("subnormal", ("c3",), {}, 3 * 2.0**lo_out)
    bld.add("subnormal", ("result",), {k - 2: pow2(lo_out + 1), k - 1: pow2(lo_out)})


def _special(bld: ProbeBuilder) -> None:
    fin, fout = bld.fin, bld.fout
    inf, nan = math.inf, math.nan
    if fin.has_nan:
        bld.add("special", ("nan_a",), {0: (nan, 1.0)}, 0.0, "NaN*1")
    if fin.has_inf:
        bld.add("special", ("inf",), {0: (inf, 1.0)}, 0.0, "Inf*1")
        bld.add("special", ("inf_times_zero",), {0: (inf, 0.0)}, 0.0, "Inf*0")
        bld.add("special", ("inf_minus_inf",), {0: (inf, 1.0), 1: (-inf, 1.0)}, 0.0,
                "Inf*1 + (-Inf)*1")
        bld.add("special", ("inf_c_minus_inf",), {0: (-inf, 1.0)}, inf, "(-Inf)*1; c = Inf")
    bld.add("special", ("nan_c",), {}, nan, "c = NaN")
    bld.add("special", ("inf_c",), {0: pow2(0)}, inf, "1*1; c = Inf")
    m, e = fout.mantissa_bits, fout.exponent_bits
    payload = (1 << (m + e)) | (((1 << e) - 1) << m) | (1 << (m - 1)) | 1   # -NaN, payload 1
    bld.add_bits("special", ("nan_c_payload",), [], [], payload, "c = a negative NaN with a "
                 "payload", bld.k)


def _product(bld: ProbeBuilder) -> None:
    """Rows whose exact result the output holds, so that a product rounded before the sum
    shows: beyond the output's range (2^(emax+1) − 2^(emax+1) = 0, else Inf − Inf), below its
    quantum (1.5q + 1.5q = 3q), wider than its precision ((1 + 2^(1−p))² − (1 + 2^(2−p)) =
    2^(2−2p)) and the square of the largest input below 1."""
    k = bld.k
    p_lo, p_hi, lo_out, hi_out = _ranges(bld)
    if p_hi >= hi_out + 1:
        e = hi_out + 1
        bld.add("product", ("overflow",), {0: pow2(e), 1: pow2(e, -1)})
    if bld.out_holds(3 * 2.0**lo_out):
        bld.add("product", ("tiny",), {k - 2: pow2(lo_out - 1, 3), k - 1: pow2(lo_out - 1, 3)})
    p_in = bld.fin.precision
    if bld.out_holds(2.0 ** (2 - 2 * p_in)):
        wide = 1 + 2.0 ** (1 - p_in)
        bld.add("product", ("wide",), {0: (wide, wide)}, -(1 + 2.0 ** (2 - p_in)))
    below = 1 - 2.0 ** -p_in
    if bld.out_holds(below * below):
        bld.add("product", ("square",), {0: (below, below)})


def _nans(bld: ProbeBuilder) -> None:
    """Several NaNs with distinct payloads in one dot product, and each alone (K = k; b = 1
    beside a NaN in a): rows ``(several, first alone, last alone)`` in the order c, a_0, b_0,
    a_1, b_1, ... tell whether the first or the last NaN comes out, or one canonical NaN."""
    fin, fout, k = bld.fin, bld.fout, bld.k
    nans = nan_patterns(fin)
    if not fout.has_nan or not (nans or fin.has_inf):
        return
    one = value_bits(1.0, fin)
    m = fout.mantissa_bits
    c_nan = (((1 << fout.exponent_bits) - 1) << m) | (1 << (m - 1)) | 3   # quiet, payload 3
    first = (nans[0], one) if nans else (value_bits(math.inf, fin), 0)   # or Inf*0 (a new NaN)
    rows = {"c": ({}, c_nan), "a0": ({0: first}, 0), "c_a0": ({0: first}, c_nan)}
    if len(nans) > 1:
        rows.update({"a1": ({1: (nans[1], one)}, 0), "b0": ({0: (one, nans[1])}, 0),
                     "alast": ({k - 1: (nans[1], one)}, 0),
                     "a0_a1": ({0: first, 1: (nans[1], one)}, 0),
                     "a0_b0": ({0: (nans[0], nans[1])}, 0),
                     "a0_alast": ({0: first, k - 1: (nans[1], one)}, 0)})
    bld.params["nans"] = {"pairs": {"c_a0": ("c", "a0"), "a0_a1": ("a0", "a1"),
                                    "a0_b0": ("a0", "b0"), "a0_alast": ("a0", "alast")}}
    for name, (terms, c) in rows.items():
        a, b = [0] * k, [0] * k
        for pos, (x, y) in terms.items():
            a[pos], b[pos] = x, y
        note = ", ".join(f"k{p}: a = {x:#x}, b = {y:#x}" for p, (x, y) in terms.items())
        bld.add_bits("nans", (name,), a, b, c, (note or "no NaN in a, b") + f"; c = {c:#x}", k)


def _random(bld: ProbeBuilder, seed: int) -> None:
    """48 rows of moderate random values (exponents within ±4 of 1) and 16 rows over the whole
    normal range of both formats, all K positions filled; about 10 % zeros."""
    _random_rows(bld, "random", np.random.default_rng(seed), 64, 48, bld.k)


def _long(bld: ProbeBuilder, seed: int) -> None:
    """K = LONG_K: FPRev rows with +M in c and −M at k_j, j at and around every multiple of 16
    (C joins the sum at the end of each pass: the count of surviving y gives passes up to 128),
    and 16 random rows (8 moderate, 8 wide)."""
    k = bld.width
    if "fprev" in bld.params:
        for j in sorted({0, 1, 2, 3} | {j for m in range(1, k // 16 + 1)
                                        for j in (16 * m - 1, 16 * m) if j < k}):
            _fprev_row(bld, "long", "c", j, k)
    _swamp(bld, k)
    _random_rows(bld, "long_random", np.random.default_rng(seed + 1), 16, 8, k)


def _swamp(bld: ProbeBuilder, k: int) -> None:
    """n equal products P = 2^e (the largest the formats hold), then two q = half an ulp of
    n·P (and the same with the q first): one rounding of the whole sum keeps 2q = one ulp, a
    rounding after every product loses each q (a tie to even) — the order and the number of
    roundings where the formats are too narrow for the FPRev rows (n is as small as the smallest
    product the input format forms allows: 64 for Trainium's cfp8_e3m4)."""
    p_lo, p_hi, lo_out, hi_out = _ranges(bld)
    precision = bld.fout.precision
    e = min(p_hi, hi_out - 8)
    n = 1 << max(0, p_lo + precision - e)             # q = 2^(e + log2 n − p) >= 2^p_lo
    if n > k - 2:
        return
    q = e + n.bit_length() - 1 - precision
    big = {i: pow2(e) for i in range(n)}
    bld.add("swamp", (n, "q_last"), {**big, n: pow2(q), n + 1: pow2(q)},
            note=f"2^{e} at k0..k{n - 1}, 2^{q} at k{n}, k{n + 1}; c = 0 (K = {k})", length=k)
    bld.add("swamp", (n, "q_first"), {0: pow2(q), 1: pow2(q), **{i + 2: pow2(e) for i in range(n)}},
            note=f"2^{q} at k0, k1, 2^{e} at k2..k{n + 1}; c = 0 (K = {k})", length=k)


def _random_rows(bld: ProbeBuilder, family: str, rng, rows: int, moderate: int, k: int):
    """``rows`` rows of K = k random values, the first ``moderate`` of them moderate."""
    fin, fout = bld.fin, bld.fout
    for i in range(rows):
        wide = i >= moderate
        span_in = (fin.emin, fin.emax) if wide else (max(fin.emin, -4), min(fin.emax, 4))
        span_c = (fout.emin, fout.emax) if wide else (max(fout.emin, -4), min(fout.emax, 8))
        a, b = _random_values(rng, fin, span_in, k), _random_values(rng, fin, span_in, k)
        bld.add_values(family, (i,), a, b, _random_values(rng, fout, span_c, 1)[0],
                       f"random normal values, exponents in [{span_in[0]}, {span_in[1]}], "
                       f"K = {k}")


def _random_values(rng, fmt, span, n) -> list[float]:
    """n random normal values of ``fmt`` with exponents in ``span`` (about 1 in 10 zero)."""
    m = fmt.mantissa_bits
    mant = rng.integers(1 << m, 1 << (m + 1), n)                                    # (n,)
    exps = rng.integers(span[0], span[1] + 1, n)                                    # (n,)
    signs = rng.choice((-1.0, 1.0), n) if fmt.signed else np.ones(n)
    values = signs * np.ldexp(mant.astype(np.float64), exps - m)
    values = np.clip(values, -fmt.max, fmt.max)           # the top binade of e4m3fn ends early
    values[rng.random(n) < 0.1] = 0.0
    return values.tolist()


FAMILIES = (_align_c, _align_p, _far_c, _fprev, _pairs, _round, _carry, _zero, _sign,
            _subnormal, _special, _nans, _product)
