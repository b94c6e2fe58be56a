"""L1: the fused rules of CDNA3/CDNA4 (:mod:`mpt.kernels.mfma`), register-blocked in LLVM IR.

:func:`fused_chain_packed` runs the rules "fused" and "fused_fp8" of ``mpt.reference.mfma`` (the
oracle; tests/test_mfma.py and tests/test_mfma_fast.py check this kernel against it and against
the general kernel ``mpt.kernels.mfma.fused_chain`` bit for bit) without MX scales, on operands
whose products are all finite and, where not zero, within [2^-60, 2^60] (:func:`packed_tops`;
every other call takes the general kernel). Per group of products and per tile of ROWS x COLS
(4 x 32) outputs, in registers, one LLVM IR call covering up to 128 k:

1. **anchor**: E = max over the group of nominal(a)·nominal(b) — 2^(ea + eb) with the nominal
   exponents (a zero's is −126, a subnormal's the format's emin) —, raised
   to 2^-126, on uint8 codes (:func:`pack_codes`, :func:`_emit_codes`): u = ea + s and
   v = s − 126 − eb, clipped to [0, 255], s = 255 − max ea; the saturating difference u ⊖ v =
   max(0, ea + eb + 126) is the code of 2^max(ea + eb, −126);
2. **sum**: S = Σ int32(a·b·2^24/E), ``fptosi`` truncating toward zero;
3. **finish**: re-alignment of S·2^(E−24) and c to M = max(E, e(c)) rounding toward −∞ (31 and
   24 fraction bits), one RNE rounding to FP32 — as one int32 on 16 lanes, rounded to odd
   where c dominates, converted once (:func:`_finish_fast`) when every E of the tile is at
   least 2^-90 and the group has at most 8 products, else in float64 on 8 lanes
   (:func:`_finish_lanes`; always for the FP8 rule). A tile whose C are all finite when a call
   starts takes a finish without Inf/NaN tests (C stays finite: ``_FINITE_BITS``).

AVX-512 hosts (``mpt.kernels.block_gemm.X86_ROUNDING``) round the float32 finish's floors with
embedded rounding (one instruction each); other hosts run portable IR with the same results.

Why every step is exact. Inputs have at most 11 significant bits (fp16, bf16, TF32, fp8), so a
product a·b (at most 22 bits) is exact in float32 when it is normal, which every non-zero
product is here (>= 2^-60). A non-zero product has nominal E_p with 2^-62 < E_p <= 2^60
(|p| < 4·E_p), so a group with one has E in (2^-62, 2^60]: the scale 2^24/E is a normal power
of two and a·b·2^24/E is exact; its truncation is the oracle's term, an integer below 2^26 in
magnitude (|p| < 4E), and the 16 terms of the largest group sum exactly in int32 (< 2^30). In a
group of zero products every term is 0 whatever the scale, which is why the scale's E is
floored at 2^-64 (the scale stays finite: at most 2^88), and why E may be raised to 2^-126:
E < 2^-126 holds only zero products, and M = max(E, e(c)) is unchanged, e(c) >= 2^-126 (a zero
or subnormal c counts as 2^-126); the float32 path, whose E are at least 2^-90, takes
2^24/E unfloored (at most 2^114). The codes are exact where it matters: u <= 255 and v >= 0
as long as max ea + max eb <= 129 (:func:`pack_codes` checks it; non-zero products of the
packed range have ea + eb <= 60, a zero's −126 + eb <= 1); a u clipped to 0 (ea < max ea − 255)
or a v clipped to 255 (eb < −126 − max ea) belongs to a product with ea + eb < −126, whose
difference is 0 either way; a product of ea + eb >= −126 has both codes unclipped, and its
difference ea + eb + 126 <= 255. The finish is exact up to its one
rounding (:func:`_finish_fast` and :func:`_finish_lanes` state why). The FP8 rule's halves
merge by arithmetic shifts, the exact floors (:func:`_merge_halves`). The accumulator is
float32, as the outputs: each group's D is the next group's C.

Each output element sees the same operations in the same order whatever the tiling and the
thread count. The kernels emit portable LLVM IR (vectors of 16 float32/int32 or 8 float64/int64
lanes, generic intrinsics); LLVM picks the instructions for the host.
"""
from __future__ import annotations

import llvmlite.ir as ir
from numba import njit, prange, types
from numba.core.extending import intrinsic

from mpt.kernels import gemm as _gemm
from mpt.kernels.block_gemm import X86_ROUNDING
# the operands' range check and anchor codes (re-exported: the engine's and the tests' names)
from mpt.kernels.mfma_codes import ROWS, code_lane, pack_codes, packed_tops

__all__ = ["ROWS", "packed_tops", "pack_codes", "fused_chain_packed", "finish_fast"]

_KC = 128                     # k per tile call: B's panels of one call stay in L1
_WIDE = 8                     # float64 lanes of one AVX-512 register (the finish)
# 2^24/E for a float32 power of two E = 2^e is the pattern (151 - e + 127) << 23, i.e.
# _SCALE_BITS - bits(E); E is floored at 2^-64 on the float64 path, so the scale is at most
# 2^88 (finite); the float32 path's E >= 2^-90 give at most 2^114.
_SCALE_BITS = 278 << 23
_ANCHOR_FLOOR_BITS = 63 << 23
_ROUND_DOWN = 9               # AVX-512 embedded rounding: toward −∞, exceptions suppressed


_F32, _I32 = ir.FloatType(), ir.IntType(32)
_F64, _I64 = ir.DoubleType(), ir.IntType(64)
_VF64, _VI64 = ir.VectorType(_F64, _WIDE), ir.VectorType(_I64, _WIDE)
_VF32, _VI32 = ir.VectorType(_F32, 2 * _WIDE), ir.VectorType(_I32, 2 * _WIDE)
_VF32x8 = ir.VectorType(_F32, _WIDE)
_VI8 = ir.VectorType(ir.IntType(8), 64)


def _splat(value, vtype):
    return ir.Constant(vtype, [value] * vtype.count)


def _pow2_bits(e):
    """The float64 pattern of 2^e (an int, for constants of :func:`_finish_lanes`)."""
    return (e + 1023) << 52


def _finish_lanes(builder, c_ptr, e, s, drop_far_c):
    """``mpt.kernels.mfma._finish`` on 8 lanes: c (8 float32 at c_ptr, in: C, out: D), e (<8 x
    double> E, at least 2^-126), s (<8 x double> S). An Inf or NaN C stays (the products are
    finite here).

    Exact up to the last rounding: powers of two are made on their float64 patterns: M = the
    unsigned max of the patterns of E and of 2^e(c) (c's exponent field, raised to 2^-126's),
    2^(E−M+7) = E − M + 2^7, 2^(24−M) and 2^(M−31) by integer adds to the exponent field, all
    normal for a finite c (2^-126 <= M <= 2^127). s31 = floor(S·2^(E−M+7)) and t24 =
    floor(c·2^(24−M)) are exact products (an integer below 2^30 or c, times a power of two) and
    exact floors; (s31 + 2^7·t24)·2^(M−31) is one fma and one product, exact (below 2^38 units of
    2^(M−31)); the conversion to float32 is the one RNE rounding. An exact zero is +0: s31 is +0
    (floor(+0)) or not zero, and s31 + 2^7·t24 is +0 when it is 0 (IEEE: x + (−x) = +0,
    +0 + −0 = +0). FP8 (``drop_far_c``): t24 = 0 when 2^e(c)·2^25 < M."""
    vfloor = _gemm.vector_intrinsic(builder, "llvm.floor.v8f64", _VF64, 1)
    vfma = _gemm.vector_intrinsic(builder, "llvm.fma.v8f64", _VF64, 3)
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v8i64", _VI64, 2)
    c32 = builder.load(c_ptr, align=4)
    c = builder.fpext(c32, _VF64)
    field = builder.and_(builder.bitcast(c, _VI64), _splat(0x7FF0000000000000, _VI64))
    ec = builder.call(vumax, [field, _splat(_pow2_bits(-126), _VI64)])
    e = builder.bitcast(e, _VI64)
    m = builder.call(vumax, [e, ec])
    scale_s = builder.bitcast(builder.add(builder.sub(e, m), _splat(_pow2_bits(7), _VI64)),
                              _VF64)
    scale_c = builder.bitcast(builder.sub(_splat(_pow2_bits(24) + _pow2_bits(0), _VI64), m),
                              _VF64)
    grid = builder.bitcast(builder.sub(m, _splat(_pow2_bits(31) - _pow2_bits(0), _VI64)),
                           _VF64)
    s31 = builder.call(vfloor, [builder.fmul(s, scale_s)])
    t24 = builder.call(vfloor, [builder.fmul(c, scale_c)])
    if drop_far_c:
        far = builder.icmp_unsigned("<", builder.add(ec, _splat(25 << 52, _VI64)), m)
        t24 = builder.select(far, _splat(0.0, _VF64), t24)
    v = builder.fmul(builder.call(vfma, [t24, _splat(2.0**7, _VF64), s31]), grid)
    finite = builder.icmp_unsigned("!=", field, _splat(0x7FF0000000000000, _VI64))
    builder.store(builder.select(finite, builder.fptrunc(v, _VF32x8), c32), c_ptr, align=4)


def _emit_codes(builder, ca_addr, cb_addr, k0, nk):
    """The anchor codes of products k0 .. k0+nk-1 for the ROWS x COLS tile: ROWS/2 vectors of 64
    uint8, two rows per register (groups of 4 bytes alternate between the rows of a pair, as in
    B's interleaved panel: :func:`code_lane`): per k, the pair's two A codes broadcast as one
    64-bit word, code = max(code, u ⊖ v) (saturating). E = 2^(code − 126), code 0 standing for
    every anchor <= 2^-126 (module docstring)."""
    usub = _gemm.vector_intrinsic(builder, "llvm.usub.sat.v64i8", _VI8, 2)
    umax = _gemm.vector_intrinsic(builder, "llvm.umax.v64i8", _VI8, 2)
    vi64 = ir.VectorType(_I64, 8)
    a_base = builder.inttoptr(ca_addr, _I64.as_pointer())
    b_base = builder.inttoptr(cb_addr, _VI8.as_pointer())

    def step(k, codes):
        k = builder.add(k, k0)
        b = builder.load(builder.gep(b_base, [k]), align=1)
        out = []
        for p in range(ROWS // 2):
            word = builder.load(builder.gep(a_base, [builder.add(
                builder.mul(k, _gemm.const(ROWS // 2)), _gemm.const(p))]), align=4)
            a = builder.bitcast(builder.insert_element(ir.Constant(vi64, ir.Undefined), word,
                                                       ir.Constant(_I32, 0)), vi64)
            a = builder.bitcast(builder.shuffle_vector(a, ir.Constant(vi64, ir.Undefined),
                                                       ir.Constant(ir.VectorType(_I32, 8),
                                                                   [0] * 8)), _VI8)
            out.append(builder.call(umax, [codes[p], builder.call(usub, [a, b])]))
        return out
    return _k_steps(builder, nk, [ir.Constant(_VI8, [0] * 64)] * (ROWS // 2), step)


def _code_fields(builder, pairs):
    """Bytes laid out as :func:`_emit_codes`'s codes (or a function of them, byte by byte) as
    float32 exponent fields, byte·2^23: 8 int32 vectors, row r, columns 16h .. 16h+15 in vector
    2r + h (each row's bytes picked out and zero-extended by one in-lane byte shuffle, vpshufb:
    :func:`code_lane`; then shifted). E's pattern is code·2^23 + 2^23."""
    zero = ir.Constant(_VI8, [0] * 64)
    out = []
    for r in range(ROWS):
        for h in range(2):
            mask = []
            for t in range(16):
                j = 16 * h + t
                mask += [code_lane(j) + 4 * (r % 2), 64, 64, 64]
            code = builder.bitcast(builder.shuffle_vector(
                pairs[r // 2], zero, ir.Constant(ir.VectorType(_I32, 64), mask)), _VI32)
            out.append(builder.shl(code, _splat(23, _VI32)))
    return out


def _floored_scales(builder, fields):
    """2^24/E as float32 vectors from :func:`_code_fields` (the pattern (151 − e + 127)·2^23 of
    E = 2^e), E raised to 2^-64 first (the scale stays finite for every code, 2^88 at most; a
    group with E < 2^-64 holds only zero products, whose terms are 0 whatever the scale)."""
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v16i32", _VI32, 2)
    return [builder.bitcast(builder.sub(_splat(_SCALE_BITS - (1 << 23), _VI32), builder.call(
        vumax, [x, _splat(_ANCHOR_FLOOR_BITS - (1 << 23), _VI32)])), _VF32) for x in fields]


def _emit_sum(builder, va_addr, vb_addr, k0, nk, scale):
    """S of products k0 .. k0+nk-1 for the ROWS x COLS tile, in registers (8 int32 vectors, as
    :func:`_code_fields`): S = Σ int32(va·vb·scale) (``fptosi`` truncating toward zero) with the
    scales 2^24/E of :func:`_scales`."""
    rows, tiles = ROWS, ROWS * _gemm.COLS // (2 * _WIDE)

    def sum_step(k, total):
        k = builder.add(k, k0)
        b = _gemm.panel_vectors(builder, vb_addr, k)
        a = _gemm.panel_splats(builder, va_addr, k, rows)
        return [builder.add(total[i], builder.fptosi(
            builder.fmul(builder.fmul(a[i // 2], b[i % 2]), scale[i]), _VI32))
            for i in range(tiles)]
    return _k_steps(builder, nk, [_splat(0, _VI32)] * tiles, sum_step)


def _anchors_and_sums(builder, va_addr, ca_addr, vb_addr, cb_addr, k0, nk):
    """(E, S) of products k0 .. k0+nk-1 for the tile, for the float64 finish: E as float32
    vectors (at least 2^-126), S by :func:`_emit_sum` (E floored at 2^-64 in the scales)."""
    fields = _code_fields(builder, _emit_codes(builder, ca_addr, cb_addr, k0, nk))
    total = _emit_sum(builder, va_addr, vb_addr, k0, nk, _floored_scales(builder, fields))
    return [builder.bitcast(builder.add(x, _splat(1 << 23, _VI32)), _VF32)
            for x in fields], total


def _k_steps(builder, nk, state, body):
    """``_gemm.k_loop``, unrolled when nk is an int (a group size known when compiling)."""
    if isinstance(nk, int):
        for k in range(nk):
            state = body(_gemm.const(k), state)
        return state
    return _gemm.k_loop(builder, nk, state, body)


def _merge_halves(builder, even, odd):
    """The FP8 rule's step 2b on (E, S) of the even and the odd half: E = max(E0, E1) and
    S = floor(S0·2^(E0-E)) + floor(S1·2^(E1-E)), as arithmetic right shifts (floor) of int32 by
    the exponent difference, capped at 31 (|S_h| < 2^29, so a shift of 31 or more gives the
    same floor, 0 or -1). A half whose E is the codes' floor 2^-126 holds only zero products
    (a non-zero one has E > 2^-62): S_h = 0 and any shift leaves it 0."""
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v16i32", _VI32, 2)
    vumin = _gemm.vector_intrinsic(builder, "llvm.umin.v16i32", _VI32, 2)
    anchor, total = [], []
    for e0, s0, e1, s1 in zip(*even, *odd):
        e = builder.bitcast(builder.call(vumax, [builder.bitcast(e0, _VI32),
                                                 builder.bitcast(e1, _VI32)]), _VF32)

        def field(x):
            return builder.lshr(builder.bitcast(x, _VI32), _splat(23, _VI32))

        def shifted(e_h, s_h):
            d = builder.call(vumin, [builder.sub(field(e), field(e_h)), _splat(31, _VI32)])
            return builder.ashr(s_h, d)
        anchor.append(e)
        total.append(builder.add(shifted(e0, s0), shifted(e1, s1)))
    return anchor, total


def _product_down(builder, x, y, x86):
    """x·y (y a power of two): with ``x86`` rounded toward −∞ (AVX-512 embedded rounding: a
    product that underflows keeps its sign, −2^-149 at most for a negative one), portably
    rounded to nearest. Exact where it does not underflow."""
    if x86:
        return _x86_call(builder, "llvm.x86.avx512.mul.ps.512", _VF32,
                         [x, y, ir.Constant(_I32, _ROUND_DOWN)])
    return builder.fmul(x, y)


def _floor_to_int(builder, product, x, x86):
    """floor(x·y) as int32 from product = :func:`_product_down` (x, y) (x·y exact or below 1 in
    magnitude, its floor an int32): with ``x86``, one conversion rounding toward −∞; portably,
    ``llvm.floor``, and −1 for a negative x whose product underflowed to −0."""
    if x86:
        return _x86_call(builder, "llvm.x86.avx512.mask.cvtps2dq.512", _VI32,
                         [product, _splat(0, _VI32), ir.Constant(ir.IntType(16), 0xFFFF),
                          ir.Constant(_I32, _ROUND_DOWN)])
    vfloor = _gemm.vector_intrinsic(builder, "llvm.floor.v16f32", _VF32, 1)
    vminnum = _gemm.vector_intrinsic(builder, "llvm.minnum.v16f32", _VF32, 2)
    floor = builder.call(vfloor, [product])
    negative = builder.fcmp_ordered("<", x, _splat(0.0, _VF32))
    floor = builder.select(negative, builder.call(vminnum, [floor, _splat(-1.0, _VF32)]), floor)
    return builder.fptosi(floor, _VI32)


def _ashr_any(builder, x, count, x86):
    """x >> count (arithmetic, int32 lanes) for any count >= 0: a count of 32 or more gives
    x's sign (``llvm.x86.avx512.psrav.d.512``; portably, the count capped at 31)."""
    if x86:
        return _x86_call(builder, "llvm.x86.avx512.psrav.d.512", _VI32, [x, count])
    vumin = _gemm.vector_intrinsic(builder, "llvm.umin.v16i32", _VI32, 2)
    return builder.ashr(x, builder.call(vumin, [count, _splat(31, _VI32)]))


def _x86_call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name)
    return builder.call(fn, args)


def _finish_fast(builder, c_ptr, scale, s, x86, finite_c=False):
    """The fused rule's finish (``mpt.kernels.mfma._finish``) on 16 lanes in int32 and float32,
    for 2^-90 <= E <= 2^60 and |S| < 2^29 (groups of at most 8: the caller's tests): c (16
    float32 at c_ptr, in: C, out: D), scale (the float32 pattern of 2^(24−E), as int32), s (S,
    int32). An Inf or NaN C stays, unless ``finite_c`` (the caller knows every C finite: no test).
    ``x86``: AVX-512 embedded rounding (:func:`_floor_to_int`, :func:`_ashr_any`).

    The rule: D = RNE(x), x = X0 + A, X0 = floor(c·2^(24−M))·2^(M−24), A =
    floor(S·2^(E−M+7))·2^(M−31), M = max(E, e(c)) (e(c) >= 2^-126). With d = log2(e(c)/E)
    (d <= 0 for a zero or subnormal c: its exponent field is 0), the kernel computes x in units
    of 2^u = max(2^(E−24), 2^(e(c)−29)), i.e. u = E − 24 + v with v = max(d − 5, 0), as the
    int32 N = floor(c·2^-u) + RO(A·2^-u) (RO: round to odd, floor(y) | (y not an integer)),
    then D = float32(N)·2^u: the int32 → float32 conversion (RNE) is the one rounding.

    * d <= 5 (v = 0): A = S·2^(E−24) exactly (E − M + 7 >= 2, so S·2^(E−M+7) is an
      integer): A·2^-u = S. X0 = floor(c·2^(24−E))·2^(E−24) for d <= 0 (M = E), and X0 = c for
      1 <= d <= 5 (c lies on its grid 2^(M−23), so c·2^-u is an integer, its own floor). N is
      x·2^-u exactly, |N| < 2^30 + 2^29 (|c| < 2^(M+1) <= 2^(E+6), |S| < 2^29), and
      D = RNE(N)·2^u = RNE(x): the scaling is exact (|D| >= 2^u >= 2^-114, or D = +0: an exact
      zero is +0, as the rule's).
    * d >= 6 (v = d − 5): M = e(c), X0 = c, u = M − 29, and A = s31·2^(M−31) with the rule's
      s31 = floor(S·2^(7−d)) = (4S) >> v (an arithmetic shift: the floor), so A·2^-u = s31/4,
      whose RO is s31 >> 2 with bit 0 set where s31's last two bits are not 0 (bit 2 of
      (s31 + 3) ^ s31). c·2^-u is even (c's grid 2^(M−23)), so N = c·2^-u +
      RO(A·2^-u) = RO(x·2^-u), |N| < 2^30 + 2^28. And |A| < 2^(E+5) <= 2^(M−1) <= |c|/2, so
      |x·2^-u| > 2^28: the conversion rounds at a multiple of 2^5 units, its grid points and
      midpoints are even integers, and N, odd where x·2^-u is not an integer, lies on the same
      side of every even integer as x·2^-u: RNE(N) = RNE(x·2^-u). D overflows to Inf where
      RNE(x) does (|N·2^u| < 2^(M+2)).

    The powers of two are float32 patterns (integer adds to the exponent field): 2^u within
    [2^-114, 2^98], 2^-u at most 2^114: normal. A shift of 32 or more in (4S) >> v gives S's
    sign, the floor for |4S| < 2^31."""
    def const(x):
        return _splat(x, _VI32)
    vumin = _gemm.vector_intrinsic(builder, "llvm.umin.v16i32", _VI32, 2)
    c = builder.load(c_ptr, align=4)
    field = builder.and_(builder.bitcast(c, _VI32), const(0x7F800000))
    # 2^-u = min(2^(24−E), 2^(29−e(c))): (283 − c's biased exponent)·2^23, unsigned
    inv = builder.call(vumin, [scale, builder.sub(const((254 + 29) << 23), field)])
    n_c = _floor_to_int(builder, _product_down(builder, c, builder.bitcast(inv, _VF32), x86),
                        c, x86)
    u = builder.sub(const(254 << 23), inv)                          # the pattern of 2^u
    v = builder.lshr(builder.sub(scale, inv), const(23))
    q = _ashr_any(builder, builder.shl(s, const(2)), v, x86)
    # q + 3 carries into bit 2 exactly where q's last two bits are not 0: bit 2 of (q + 3) ^ q
    n_a = builder.ashr(builder.or_(q, builder.and_(builder.xor(builder.add(q, const(3)), q),
                                                   const(4))), const(2))
    d = builder.fmul(builder.sitofp(builder.add(n_c, n_a), _VF32), builder.bitcast(u, _VF32))
    if not finite_c:
        d = builder.select(builder.icmp_unsigned("!=", field, const(0x7F800000)), d, c)
    builder.store(d, c_ptr, align=4)


_FAST_CODE = 126 - 90             # E >= 2^-90 (code >= 36): _finish_fast's range
_FAST_GROUP = 8                   # products per group (|S| < 2^29): _finish_fast's range


def _emit_group(builder, tile_addr, ldc, va_addr, ca_addr, vb_addr, cb_addr, k0, nk, halves,
                finite_c=False):
    """One group of nk products (an int: unrolled, or an i64 value), k0 .. k0+nk-1, for the
    ROWS x COLS float32 tile at tile_addr (row stride ldc floats), in registers: the anchor
    codes (:func:`_emit_codes`); where every E of the tile is at least 2^-90 and nk <= 8, S
    with unfloored scales (:func:`_emit_sum`) and :func:`_finish_fast`, else (E, S) by
    :func:`_anchors_and_sums` (FP8, ``halves``: of the first and the second nk/2 products, the
    even-k and odd-k ones after ``mpt.engines.amd.MFMAOperands`` reordered K, merged by
    :func:`_merge_halves`) and :func:`_finish_lanes` (FP8: dropping a far C)."""
    base = builder.inttoptr(tile_addr, _F32.as_pointer())
    sums = (va_addr, ca_addr, vb_addr, cb_addr)
    if halves:
        half = nk // 2 if isinstance(nk, int) else builder.lshr(nk, _gemm.const(1))
        second = builder.add(k0, _gemm.const(half) if isinstance(half, int) else half)
        anchor, total = _merge_halves(builder, _anchors_and_sums(builder, *sums, k0, half),
                                      _anchors_and_sums(builder, *sums, second, half))
        _finish_wide(builder, base, ldc, anchor, total, halves)
        return
    if isinstance(nk, int) and nk > _FAST_GROUP:
        _finish_wide(builder, base, ldc, *_anchors_and_sums(builder, *sums, k0, nk), halves)
        return
    pairs = _emit_codes(builder, ca_addr, cb_addr, k0, nk)
    umin = _gemm.vector_intrinsic(builder, "llvm.umin.v64i8", _VI8, 2)
    low = pairs[0]
    for x in pairs[1:]:
        low = builder.call(umin, [low, x])
    lanes = builder.icmp_unsigned(">=", low, ir.Constant(_VI8, [_FAST_CODE] * 64))
    fast = builder.icmp_unsigned("==", builder.bitcast(lanes, _I64), ir.Constant(_I64, -1))
    if not isinstance(nk, int):
        fast = builder.and_(fast, builder.icmp_signed("<=", nk, _gemm.const(_FAST_GROUP)))
    with builder.if_else(fast) as (then, otherwise):
        with then:
            # 277 − code (mod 256; in [22, 241] for code >= 36): the field of 2^24/E
            scale = _code_fields(builder, [builder.sub(ir.Constant(_VI8, [277 - 256] * 64), x)
                                           for x in pairs])
            total = _emit_sum(builder, va_addr, vb_addr, k0, nk,
                              [builder.bitcast(x, _VF32) for x in scale])
            for i, (x, total_i) in enumerate(zip(scale, total)):
                offset = builder.add(builder.mul(_gemm.const(i // 2), ldc),
                                     _gemm.const(i % 2 * 2 * _WIDE))
                _finish_fast(builder, builder.bitcast(builder.gep(base, [offset]),
                                                      _VF32.as_pointer()),
                             x, total_i, X86_ROUNDING, finite_c)
        with otherwise:
            _finish_wide(builder, base, ldc, *_anchors_and_sums(builder, *sums, k0, nk),
                         halves)


def _finish_wide(builder, base, ldc, anchor, total, halves):
    """:func:`_finish_lanes` on each half of each (E, S) vector of the tile at base (E >= 2^-126:
    the anchor codes' floor)."""
    for i, (e, total_i) in enumerate(zip(anchor, total)):
        row = builder.mul(_gemm.const(i // 2), ldc)
        for part in range(2):
            lanes = ir.Constant(ir.VectorType(_I32, _WIDE),
                                list(range(part * _WIDE, (part + 1) * _WIDE)))
            col = _gemm.const((i % 2 * 2 + part) * _WIDE)
            c_ptr = builder.bitcast(builder.gep(base, [builder.add(row, col)]),
                                    _VF32x8.as_pointer())
            _finish_lanes(builder, c_ptr, builder.fpext(builder.shuffle_vector(e, e, lanes),
                                                        _VF64),
                          builder.sitofp(builder.shuffle_vector(total_i, total_i, lanes),
                                         _VF64), halves)


# every C of a tile finite when a tile call starts: every C of the call stays finite (a group
# adds |A| < 2^66 to |c|, and RNE(x) overflows only from FLT_MAX + 2^103), so the float32
# finish needs no test for Inf or NaN
_FINITE_BITS = 0x7F800000


def _tile_below(builder, tile_addr, ldc, bits):
    """Whether every |C| of the ROWS x COLS tile at tile_addr is below the float32 pattern
    ``bits`` (an i1): the unsigned max of the magnitude patterns (an Inf or NaN is above every
    finite pattern)."""
    vumax = _gemm.vector_intrinsic(builder, "llvm.umax.v16i32", _VI32, 2)
    base = builder.inttoptr(tile_addr, _I32.as_pointer())
    top = None
    for i in range(ROWS * 2):
        offset = builder.add(builder.mul(_gemm.const(i // 2), ldc), _gemm.const(i % 2 * 2 * _WIDE))
        x = builder.and_(builder.load(builder.bitcast(builder.gep(base, [offset]),
                                                      _VI32.as_pointer()), align=4),
                         _splat(0x7FFFFFFF, _VI32))
        top = x if top is None else builder.call(vumax, [top, x])
    below = builder.icmp_unsigned("<", top, _splat(bits, _VI32))
    return builder.icmp_unsigned("==", builder.bitcast(below, ir.IntType(16)),
                                 ir.Constant(ir.IntType(16), 0xFFFF))


def _tile_kernel(group, halves):
    """A tile kernel ``(tile_addr, ldc, va_addr, ca_addr, vb_addr, cb_addr, nk, ngroups)``
    (intp arguments): ngroups groups of nk products (of ``group``, an int, when not 0: nk is
    ignored and each group unrolled) one after the other onto the tile (:func:`_emit_group`); with
    a finish without Inf/NaN tests when every C of the tile is finite (``_FINITE_BITS``)."""
    def emit(builder, tile_addr, ldc, va_addr, ca_addr, vb_addr, cb_addr, nk, ngroups):
        size = _gemm.const(group) if group else nk

        def groups(finite_c):
            def one_group(g, state):
                _emit_group(builder, tile_addr, ldc, va_addr, ca_addr, vb_addr, cb_addr,
                            builder.mul(g, size), group or nk, halves, finite_c)
                return state
            _gemm.k_loop(builder, ngroups, [], one_group)
        if halves:
            groups(False)
            return
        with builder.if_else(_tile_below(builder, tile_addr, ldc, _FINITE_BITS)) as (then, other):
            with then:
                groups(True)
            with other:
                groups(False)

    @intrinsic
    def tile(typingctx, tile_addr, ldc, va, pa, vb, pb, nk, ngroups):
        def codegen(context, builder, signature, args):
            emit(builder, *args)
            return context.get_dummy_value()
        return types.void(*([types.intp] * 8)), codegen
    return tile


#: The tile kernels (:func:`_tile_kernel`): groups of 8 (CDNA3's f16/bf16), of any size, and
#: of the FP8 rule.
_groups_of_8 = _tile_kernel(8, False)
_groups = _tile_kernel(0, False)
_groups_fp8 = _tile_kernel(0, True)


@njit(cache=True, parallel=True)
def fused_chain_packed(vap, cap, vbp, cbp, acc, ia, ib, k0, k1, group, halves):
    """The fused rules (unscaled) over k in [k0, k1) for :func:`packed_tops` operands (module
    docstring), in groups of ``group`` (``halves``: the FP8 rule, on operands whose K was
    reordered within each group: even k first, then odd k).

    vap: (Ba, Mt, K, ROWS) float32 values of A packed by ``gemm.pack_rows``, cap its anchor
    codes (:func:`pack_codes`); vbp: (Bb, Nt, K, COLS) of B by ``gemm.pack_cols``, cbp: (Bb,
    Nt, K, 2·COLS) its codes; acc: (B, Mt·ROWS, Nt·COLS) float32, in: C, out: D; every array
    C-contiguous (ValueError otherwise). Tasks are (batch, column panel, ``gemm.ROW_TILES`` row
    tiles); each calls a tile kernel per row tile and k-slice of _KC.
    """
    if not (vap.flags.c_contiguous and cap.flags.c_contiguous and vbp.flags.c_contiguous
            and cbp.flags.c_contiguous and acc.flags.c_contiguous):
        raise ValueError("fused_chain_packed takes C-contiguous packed operands and accumulator")
    nb, ldc = acc.shape[0], acc.shape[2]
    mt, nt, nk, cols = vap.shape[1], vbp.shape[1], vap.shape[2], _gemm.COLS
    groups = (mt + _gemm.ROW_TILES - 1) // _gemm.ROW_TILES
    step = max(_KC // group, 1) * group
    for t in prange(nb * nt * groups):
        z = t // (nt * groups)
        jt = t // groups % nt
        g = t % groups
        # byte addresses (every array C-contiguous): no array views per tile call
        va, ca = vap[ia[z]].ctypes.data, cap[ia[z]].ctypes.data
        vb, cb = vbp[ib[z], jt].ctypes.data, cbp[ib[z], jt].ctypes.data
        tile = acc[z].ctypes.data + 4 * jt * cols
        for kc in range(k0, k1, step):
            ngroups = min(step, k1 - kc) // group
            for it in range(g * _gemm.ROW_TILES, min(mt, (g + 1) * _gemm.ROW_TILES)):
                a_off = 4 * (it * nk + kc) * ROWS
                args = (tile + 4 * it * ROWS * ldc, ldc, va + a_off, ca + a_off,
                        vb + 4 * kc * cols, cb + 2 * kc * cols, group, ngroups)
                if halves:
                    _groups_fp8(*args)
                elif group == 8:
                    _groups_of_8(*args)
                else:
                    _groups(*args)


def _finish_kernel(x86):
    """An intrinsic ``(c_addr, e_addr, s_addr)``: :func:`_finish_fast` on 16 lanes in memory."""
    @intrinsic
    def finish(typingctx, c_addr, e_addr, s_addr):
        def codegen(context, builder, signature, args):
            c_ptr, e_ptr, s_ptr = (builder.inttoptr(x, t.as_pointer())
                                   for x, t in zip(args, (_VF32, _VI32, _VI32)))
            scale = builder.sub(_splat(_SCALE_BITS, _VI32), builder.load(e_ptr, align=4))
            _finish_fast(builder, c_ptr, scale, builder.load(s_ptr, align=4), x86)
            return context.get_dummy_value()
        return types.void(types.intp, types.intp, types.intp), codegen
    return finish


_finish16, _finish16_portable = _finish_kernel(X86_ROUNDING), _finish_kernel(False)


@njit(cache=True)
def finish_fast(c, e, s, portable):
    """:func:`_finish_fast` over arrays, 16 lanes at a time (tests check it against
    ``mpt.kernels.mfma``'s finish): c ((16n,) float32, in: C, out: D), e ((16n,) int32 float32
    patterns of E, 2^-90 <= E <= 2^60), s ((16n,) int32, |S| < 2^29); ``portable``: the IR
    without AVX-512 intrinsics (what other hosts run)."""
    for i in range(0, c.size, 16):
        if portable:
            _finish16_portable(c[i:].ctypes.data, e[i:].ctypes.data, s[i:].ctypes.data)
        else:
            _finish16(c[i:].ctypes.data, e[i:].ctypes.data, s[i:].ctypes.data)
