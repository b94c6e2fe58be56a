"""L1: the Tensor Core block model (:mod:`mpt.kernels.mma`), register-blocked in LLVM IR.

``block_chain_packed`` runs the block model's chain over a k-range on packed operands, one
BLOCK_ROWS x BLOCK_COLS (8 x 64) float32 output tile at a time; ``block_chain_lanes`` runs the
same arithmetic with one independent dot product per lane (many small products), and
``chain_tiles`` one small product tile by tile (the flash-attention kernels). Every block of L
products takes three passes over registers:

1. **anchor**: E_p = max(floor, max_k (ea + eb)) over the block — the nominal exponents of a
   and b, not the product's own (Hopper's products are not renormalised) —, on 64 uint8 lanes:
   A's exponents are stored as codes u = ea + s_a, B's as v = s_b − eb with s_b − s_a = floor, so
   that the saturating difference u ⊖ v = max(0, ea + eb − floor); zeros are coded 0 in A and
   255 in B, which makes the difference 0. With s_a = 255 − max ea, no code of a non-zero value
   exceeds 255 or falls below 0 when max ea + max eb <= floor + 255 (the caller checks it); a
   clipped code (a's below 0, b's above 255) belongs to products below the floor, whose
   difference is 0 either way.
2. **start** (16 lanes, float32 bit patterns, exponents as biased fields shifted to bit 23):
   E = max(E_p, nominal(c)); s = 2^(F−E), q = 2^(E−F); c's term trunc(c·s).
3. **sum**: total = Σ_k int32(fl(fl(a·b)·s)) (``fptosi`` truncates toward zero), then
   **finish**: D = round_out((total + c's term)·q).

Why every step is exact (F = fraction bits, L = block, P = output precision), given the caller's
checks (all operands finite; every non-zero product's nominal exponent ea + eb in [F − 125,
E_MAX] for RZ outputs, at most E_MAX for RNE-FP16; c finite and never past 2^E_MAX):

* E lies in [F − 125, E_MAX] (RZ: the floor is max(e_zero, F − 125); FP16: e_zero, which
  ``tile_params`` requires to be >= F − 125: −21 or −20 with F <= 25 in every preset), so s and
  q are normal float32 powers of two;
* a product that can give a non-zero term is >= 2^(E−F) >= 2^-125: a normal float32, and a·b
  (at most 22 significant bits) and a·b·s are exact; a smaller product rounds to at most
  2^-126, and times s <= 2^125 to at most 1/2, whose truncation is 0, as its true term's;
* a term is below 2^(F+2) in magnitude (|a·b| < 4·2^(ea+eb) <= 4E), so L terms sum exactly in
  int32 when L·2^(F+2) <= 2^31 (:func:`block_fits`); c's term (|c| < 2·nominal(c) <= 2E) is
  below 2^(F+1), and where L·2^(F+2) + 2^(F+1) > 2^31 the kernel checks their sum for overflow;
* RZ to P bits: the int32 sum converted toward zero to float32 (AVX-512's embedded rounding, or
  portably: the magnitude cut to its top 24 bits by a mask from its leading zeros, then
  converted exactly) and, for P < 24, its low 24 − P significand bits cleared; times q: exact,
  normal (>= q >= 2^-125) and below 2^(E−F+32) <= 2^120. A non-zero c below 2^(F−125) —
  reachable only by cancellation inside the chain — has no exact scale: the kernel flags it
  where the operands allow it (``check_tiny``);
* RNE-FP16: in float64 (exact product, magic-number rounding to the FP16 grid); a result past
  65504 (Inf, which the next block could not take) raises the flag.

A raised flag voids the call: the caller reruns it on the general kernel. Each output element
sees the same operations in the same order whatever the tiling and the thread count. Oracle:
``mpt.reference.mma`` and the hardware samples (tests/test_mma*.py).
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from numba import njit, prange

from mpt.kernels.gemm import (_I32, _I64, _LANES, _VF32, _VI32, AVX512, COLS, ROW_TILES, _pointer,
                              _tile_intrinsic, const, k_loop, panel_splats, panel_vectors)

__all__ = ["BLOCK_ROWS", "BLOCK_COLS", "E_MAX", "SCRATCH_WORDS", "X86_ROUNDING", "RNE16",
           "VARIANTS", "block_fits", "tile_params", "block_chain_packed", "block_chain_lanes",
           "chain_tiles"]

BLOCK_ROWS = 8              # tile rows (the sum pass keeps 16 int32 totals in registers)
BLOCK_COLS = 2 * COLS       # tile columns: 64 uint8 anchor lanes; the sum pass runs two halves
E_MAX = 100                 # the largest anchor exponent the fast path takes (module docstring)
_KC = 128                   # k-slice per tile call (a multiple of every block): B stays in L1

#: Whether the RZ conversion uses AVX-512's embedded rounding (Numba compiling for this host).
X86_ROUNDING = AVX512

# the int32 parameter vector (tile_params): exponents are biased fields shifted to bit 23
P_BLOCK, P_KEEP, P_FLOOR, P_TINY, P_EMIN_C, P_S, P_Q = range(7)
_N_PARAMS = 7
# kernel variants (bits): check for a tiny c, for an int32 overflow; RZ to fewer than 24 bits;
# the RNE-FP16 output
_CHECK_TINY, _CHECK_SUM, _SHORT, RNE16 = 1, 2, 4, 8

_I8 = ir.IntType(8)
_VI8 = ir.VectorType(_I8, BLOCK_COLS)
_VF64 = ir.VectorType(ir.DoubleType(), _LANES)
_VI64 = ir.VectorType(_I64, _LANES)
_TILE = BLOCK_ROWS * BLOCK_COLS
SCRATCH_WORDS = _TILE // 4 + 3 * _TILE   # anchors (uint8), then s, q and c's terms (32-bit)


# ---- LLVM IR ---------------------------------------------------------------------------------

def _vconst(vtype, x):
    return ir.Constant(vtype, [x] * vtype.count)


def _splat(builder, x, vtype):
    """x (a scalar of vtype's element type) broadcast to a vector."""
    v = builder.insert_element(ir.Constant(vtype, ir.Undefined), x, ir.Constant(_I32, 0))
    zeros = ir.Constant(ir.VectorType(_I32, vtype.count), [0] * vtype.count)
    return builder.shuffle_vector(v, ir.Constant(vtype, ir.Undefined), zeros)


def _call(builder, name, ret, args):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name)
    return builder.call(fn, args)


def _at(builder, addr, offset, vtype):
    """A pointer to the vtype at element ``offset`` (an int or an i64 value) of the array of
    vtype's elements (vtype itself, for a scalar) at addr."""
    base = _pointer(builder, addr, getattr(vtype, "element", vtype))
    off = const(offset) if isinstance(offset, int) else offset
    return builder.bitcast(builder.gep(base, [off]), vtype.as_pointer())


def _smax(builder, x, y):
    return _call(builder, "llvm.smax.v16i32", _VI32, [x, y])


def _emit_anchor(builder, ea_addr, eb_addr, n, anchor_addr, rows, lanes):
    """anchor[r, j] = max over k < n of u[k, r] ⊖ v[k, j] (uint8 codes, module docstring) for
    ``rows`` rows of A's codes (uint32 words) — or, with ``lanes``, per lane j: A's codes u[k, j]
    (uint8, a BLOCK_COLS-wide panel like B's; rows = 1)."""
    def step(k, anchor):
        b = builder.load(_at(builder, eb_addr, builder.mul(k, const(BLOCK_COLS)), _VI8), align=1)
        out = []
        for r in range(rows):
            if lanes:
                a = builder.load(_at(builder, ea_addr, builder.mul(k, const(BLOCK_COLS)), _VI8),
                                 align=1)
            else:
                word = builder.load(_at(builder, ea_addr,
                                        builder.add(builder.mul(k, const(rows)), const(r)),
                                        _I32), align=4)
                a = builder.bitcast(_splat(builder, word, _VI32), _VI8)
            diff = _call(builder, "llvm.usub.sat.v64i8", _VI8, [a, b])
            out.append(_call(builder, "llvm.umax.v64i8", _VI8, [anchor[r], diff]))
        return out
    anchor = k_loop(builder, n, [_vconst(_VI8, 0)] * rows, step)
    for r, value in enumerate(anchor):
        builder.store(value, _at(builder, anchor_addr, r * BLOCK_COLS, _VI8), align=1)


def _emit_sum(builder, va_addr, vb_addr, n, s_addr, rows, lanes, start):
    """One half (COLS columns) of the tile: total[r, j] = start[r, j] + Σ_k<n int32(va[k, r]·
    vb[k, j]·s[r, j]) (start: int32 vectors); vb_addr (and va_addr with ``lanes``: per-lane A
    values, rows = 1) point at the half's first column of a BLOCK_COLS-wide panel."""
    scale = [builder.load(_at(builder, s_addr, i * _LANES, _VF32), align=4)
             for i in range(2 * rows)]

    def step(k, total):
        b = panel_vectors(builder, vb_addr, k, BLOCK_COLS)
        if lanes:
            a = panel_vectors(builder, va_addr, k, BLOCK_COLS)
        else:
            a = panel_splats(builder, va_addr, k, rows)
        out = []
        for i in range(len(total)):   # one term after the other: no product waits in a register
            product = builder.fmul(a[i] if lanes else a[i // 2], b[i % 2])
            term = builder.fptosi(builder.fmul(product, scale[i]), _VI32)
            out.append(builder.add(total[i], term))
        return out
    return k_loop(builder, n, start, step)


def _emit_start(builder, c, code, prm, variant, flag):
    """The block's start for 16 outputs: (s, q, c's term, flag); c: float32 accumulator values,
    code: the products' anchor codes (int32)."""
    field = builder.and_(builder.bitcast(c, _VI32), _vconst(_VI32, 0x7F800000))
    if variant & RNE16:        # nominal(c) = max(floor(log2|c|), emin of FP16) for c != 0
        nonzero = builder.icmp_unsigned("!=", field, _vconst(_VI32, 0))
        field = builder.select(nonzero, _smax(builder, field, prm[P_EMIN_C]), field)
    if variant & _CHECK_TINY:  # a non-zero c below 2^(F−125)
        tiny = builder.icmp_unsigned("<", builder.sub(field, _vconst(_VI32, 1 << 23)),
                                     prm[P_TINY])
        flag = builder.or_(flag, builder.sext(tiny, _VI32))
    e = _smax(builder, builder.add(builder.shl(code, _vconst(_VI32, 23)), prm[P_FLOOR]), field)
    s = builder.bitcast(builder.sub(prm[P_S], e), _VF32)
    q = builder.bitcast(builder.sub(e, prm[P_Q]), _VF32)
    return s, q, builder.fptosi(builder.fmul(c, s), _VI32), flag


def _emit_finish(builder, total, c_term, q, prm, variant, flag):
    """The block's result for 16 outputs: D = round_out((total + c_term)·q) as float32 (c_term
    None: total holds it already); with _CHECK_SUM, an int32 overflow of the sum sets the flag's
    sign bit."""
    s = total if c_term is None else builder.add(total, c_term)
    if variant & _CHECK_SUM:   # sign bit: total and c's term agree in sign, their sum does not
        if X86_ROUNDING:
            wrapped = _call(builder, "llvm.x86.avx512.pternlog.d.512", _VI32,
                            [total, c_term, s, ir.Constant(_I32, 0x42)])
        else:
            wrapped = builder.and_(builder.xor(total, s), builder.xor(c_term, s))
        flag = builder.or_(flag, wrapped)
    if variant & RNE16:
        return _emit_round_fp16(builder, s, q, flag)
    if X86_ROUNDING:   # vcvtdq2ps {rz-sae}: RZ to 24 bits in one instruction
        value = _call(builder, "llvm.x86.avx512.sitofp.round.v16f32.v16i32", _VF32,
                      [s, ir.Constant(_I32, 11)])
        if variant & _SHORT:
            value = builder.bitcast(builder.and_(builder.bitcast(value, _VI32), prm[P_KEEP]),
                                    _VF32)
    else:
        mag = _call(builder, "llvm.abs.v16i32", _VI32, [s, ir.Constant(ir.IntType(1), 0)])
        lz = _call(builder, "llvm.ctlz.v16i32", _VI32,
                   [builder.or_(mag, _vconst(_VI32, 1)), ir.Constant(ir.IntType(1), 1)])
        kept = builder.and_(mag, builder.not_(builder.lshr(prm[P_KEEP], lz)))
        value = builder.bitcast(builder.or_(builder.bitcast(builder.uitofp(kept, _VF32), _VI32),
                                            builder.and_(s, _vconst(_VI32, -0x80000000))),
                                _VF32)
    return builder.fmul(value, q), flag


def _emit_round_fp16(builder, s, q, flag):
    """RNE-FP16 of s·q (s an int32), in float64: exact product, then the nearest value of the
    FP16 grid max(2^floor(log2|v|), 2^-14)·2^-10, ties to even (add and subtract 1.5·2^52 grid
    units); a non-zero s that rounds to zero keeps its sign. Past 65504 it flags."""
    v = builder.fmul(builder.sitofp(s, _VF64), builder.fpext(q, _VF64))
    top = builder.bitcast(builder.and_(builder.bitcast(v, _VI64),
                                       _vconst(_VI64, 0x7FF0000000000000)), _VF64)
    grid = builder.fmul(_call(builder, "llvm.maxnum.v16f64", _VF64,
                              [top, _vconst(_VF64, 2.0 ** -14)]), _vconst(_VF64, 2.0 ** -10))
    magic = builder.fmul(grid, _vconst(_VF64, 1.5 * 2.0 ** 52))
    r = _call(builder, "llvm.copysign.v16f64", _VF64,
              [builder.fsub(builder.fadd(v, magic), magic), v])
    big = builder.fcmp_ordered(">", _call(builder, "llvm.fabs.v16f64", _VF64, [r]),
                               _vconst(_VF64, 65504.0))
    return builder.fptrunc(r, _VF32), builder.or_(flag, builder.sext(big, _VI32))


def _emit_tile(variant, lanes=False):
    """The body of a tile kernel: BLOCK_ROWS x BLOCK_COLS outputs from a row panel of A and a
    column panel of B, or, with ``lanes``, BLOCK_COLS independent dot products (one output per
    lane, A's panel like B's)."""
    rows = 1 if lanes else BLOCK_ROWS
    a_width = BLOCK_COLS if lanes else BLOCK_ROWS          # A's values per k

    def emit(builder, acc_addr, ldc, va_addr, ea_addr, vb_addr, eb_addr, nk, prm_addr,
             scratch_addr, flag_addr):
        """The block chain over k < nk for the tile at acc_addr (row stride ldc floats); ORs 1
        into the int32 at flag_addr if the tile raised the flag."""
        prm = [_splat(builder, builder.load(_at(builder, prm_addr, i, _I32), align=4), _VI32)
               for i in range(_N_PARAMS)]
        block = builder.sext(builder.load(_at(builder, prm_addr, P_BLOCK, _I32)), _I64)
        anchor_addr = scratch_addr
        s_addr = builder.add(scratch_addr, const(_TILE))
        q_addr = builder.add(s_addr, const(4 * _TILE))
        cterm_addr = builder.add(q_addr, const(4 * _TILE))
        row_bytes = builder.mul(ldc, const(4))
        codes = ir.VectorType(_I8, _LANES)

        def vectors(half):
            """(index, accumulator pointer) of the 2·rows vectors of one half of the tile."""
            for r in range(rows):
                row = builder.add(acc_addr, builder.mul(row_bytes, const(r)))
                for v in range(2):
                    i = r * 2 + v
                    yield half * 2 * rows + i, _at(builder, row, (2 * half + v) * _LANES, _VF32)

        def one_block(ib, state):
            flag, = state
            kb = builder.mul(ib, block)
            n = builder.sub(nk, kb)
            n = builder.select(builder.icmp_signed("<", n, block), n, block)
            va = builder.add(va_addr, builder.mul(kb, const(4 * a_width)))
            vb = builder.add(vb_addr, builder.mul(kb, const(4 * BLOCK_COLS)))
            ea = builder.add(ea_addr, builder.mul(kb, const(BLOCK_COLS if lanes else 4 * rows)))
            _emit_anchor(builder, ea, builder.add(eb_addr, builder.mul(kb, const(BLOCK_COLS))),
                         n, anchor_addr, rows, lanes)
            for half in range(2):
                for i, c_ptr in vectors(half):
                    r, v = divmod(i % (2 * rows), 2)
                    code = builder.zext(builder.load(_at(
                        builder, anchor_addr, r * BLOCK_COLS + (2 * half + v) * _LANES, codes),
                        align=1), _VI32)
                    s, q, c_term, flag = _emit_start(builder, builder.load(c_ptr, align=4),
                                                     code, prm, variant, flag)
                    builder.store(s, _at(builder, s_addr, i * _LANES, _VF32), align=4)
                    builder.store(q, _at(builder, q_addr, i * _LANES, _VF32), align=4)
                    builder.store(c_term, _at(builder, cterm_addr, i * _LANES, _VI32), align=4)
            for half in range(2):
                first = half * 2 * rows
                c_terms = [builder.load(_at(builder, cterm_addr, i * _LANES, _VI32), align=4)
                           for i, _ in vectors(half)]
                # c's term starts the sum, unless the overflow check needs the two apart
                separate = variant & _CHECK_SUM
                total = _emit_sum(builder, builder.add(va, const(4 * COLS * half)) if lanes
                                  else va, builder.add(vb, const(4 * COLS * half)), n,
                                  builder.add(s_addr, const(4 * _LANES * first)), rows, lanes,
                                  [_vconst(_VI32, 0)] * len(c_terms) if separate else c_terms)
                for i, c_ptr in vectors(half):
                    c_term = c_terms[i - first] if separate else None
                    q = builder.load(_at(builder, q_addr, i * _LANES, _VF32), align=4)
                    d, flag = _emit_finish(builder, total[i - first], c_term, q, prm, variant,
                                           flag)
                    builder.store(d, c_ptr, align=4)
            return [flag]
        nblocks = builder.sdiv(builder.sub(builder.add(nk, block), const(1)), block)
        flag, = k_loop(builder, nblocks, [_vconst(_VI32, 0)], one_block)
        raised = _call(builder, "llvm.vector.reduce.or.v16i1", ir.IntType(1),
                       [builder.icmp_signed("<", flag, _vconst(_VI32, 0))])
        flag_ptr = _pointer(builder, flag_addr, _I32)
        builder.store(builder.or_(builder.load(flag_ptr, align=4), builder.zext(raised, _I32)),
                      flag_ptr, align=4)
    return emit


#: The variants tile_params chooses from (the others are never needed: an RZ output of fewer
#: than 24 bits comes with F = 13, whose sums never overflow).
VARIANTS = (0, _CHECK_TINY, _CHECK_SUM, _CHECK_TINY | _CHECK_SUM, _SHORT, _SHORT | _CHECK_TINY,
            RNE16 | _CHECK_SUM)


def _dispatcher(lanes):
    """An inline njit ``run(variant, args)`` that calls the tile kernel of that variant (one
    intrinsic per variant: the variant's checks are compiled in, not tested per block)."""
    k0, k1, k2, k3, k4, k5, k6 = (_tile_intrinsic(_emit_tile(v, lanes), 10) for v in VARIANTS)

    @njit(inline="always")
    def run(variant, args):
        if variant == VARIANTS[0]:
            k0(*args)
        elif variant == VARIANTS[1]:
            k1(*args)
        elif variant == VARIANTS[2]:
            k2(*args)
        elif variant == VARIANTS[3]:
            k3(*args)
        elif variant == VARIANTS[4]:
            k4(*args)
        elif variant == VARIANTS[5]:
            k5(*args)
        else:
            k6(*args)
    return run


_tile = _dispatcher(lanes=False)
_lanes = _dispatcher(lanes=True)


@njit(cache=True, parallel=True)
def block_chain_packed(vap, eap, vbp, ebp, acc, ia, ib, k0, k1, prm, variant):
    """The block model's chain over k in [k0, k1) (``mpt.kernels.mma.block_chain``), fast path.

    vap, eap: (Ba, Mt, K, BLOCK_ROWS) float32 values / uint32 anchor codes of A from
    ``mpt.kernels.block_pack.pack_block_values`` and ``block_codes``; vbp, ebp: (Bb, Nt, K,
    BLOCK_COLS) float32 / uint8 of B from the same; acc: (B, Mt·BLOCK_ROWS, Nt·BLOCK_COLS)
    float32, C-contiguous, in: c, out: D; prm, variant: from :func:`tile_params`. Returns
    whether a tile raised the flag (the call's bits are then void). Tasks are (batch, column
    panel, 8 row tiles).
    """
    nb, ldc = acc.shape[0], acc.shape[2]
    mt, nt = vap.shape[1], vbp.shape[1]
    groups = (mt + ROW_TILES - 1) // ROW_TILES
    step = _KC // prm[P_BLOCK] * prm[P_BLOCK]
    flags = np.zeros(nb * nt * groups, np.int32)
    for t in prange(nb * nt * groups):
        z = t // (nt * groups)
        jt = t // groups % nt
        g = t % groups
        scratch = np.empty(SCRATCH_WORDS, np.int32)
        va_z, ea_z, vb_p, eb_p = vap[ia[z]], eap[ia[z]], vbp[ib[z], jt], ebp[ib[z], jt]
        for kc in range(k0, k1, step):
            nk = min(step, k1 - kc)
            for it in range(g * ROW_TILES, min(mt, (g + 1) * ROW_TILES)):
                args = (acc[z, it * BLOCK_ROWS:, jt * BLOCK_COLS:].ctypes.data, ldc,
                        va_z[it, kc:].ctypes.data, ea_z[it, kc:].ctypes.data,
                        vb_p[kc:].ctypes.data, eb_p[kc:].ctypes.data, nk, prm.ctypes.data,
                        scratch.ctypes.data, flags[t:].ctypes.data)
                _tile(variant, args)
    return flags.any()


# ---- parameters ------------------------------------------------------------------------------

def block_fits(block: int, fraction_bits: int) -> bool:
    """Whether a block's terms sum in int32 (L·2^(F+2) <= 2^31): the fast path's first condition."""
    return block << (fraction_bits + 2) <= 1 << 31


@njit(cache=True)
def tile_params(block, fraction_bits, e_zero, precision, emin, rne16, lowest, highest, top_a,
                top_b, prm):
    """Fill the int32 parameter vector prm of the tile kernels for one configuration and
    operands; returns (variant, s_a, s_b) — the kernel variant (−1: outside the fast path) and
    the code shifts of A and B (module docstring).

    The configuration: block L, F, e_zero, the output rounding (RZ to ``precision`` bits, or
    RNE-FP16 with ``rne16``) and the output's ``emin``; the operands: the lowest and highest
    nominal exponent ea + eb of a non-zero product and the highest non-zero exponent of A and
    of B (``mpt.kernels.block_pack.product_range``). The floor of E is max(e_zero, F − 125)
    (RZ) or e_zero (FP16).
    A non-zero c can fall below 2^(F−125) only by cancellation, to |D| >= q >= 2^(lowest − F),
    so the tiny check is needed only when lowest < 2F − 125 (the caller checks the first c);
    the overflow check only when L·2^(F+2) + 2^(F+1) > 2^31. A block whose terms may overflow
    int32 (L·2^(F+2) > 2^31, :func:`block_fits`), an RNE-FP16 e_zero below F − 125 (s and q
    would not be normal) and a combination of checks no kernel of :data:`VARIANTS` has are
    outside the fast path.
    """
    floor = e_zero if rne16 else max(e_zero, fraction_bits - 125)
    if highest > E_MAX or (not rne16 and lowest < fraction_bits - 125) or \
            top_a + top_b > floor + 255 or floor < fraction_bits - 125 or \
            block << (fraction_bits + 2) > 1 << 31:
        return -1, 0, 0
    if X86_ROUNDING:   # clear the low 24 − P significand bits of the RZ-24 result
        prm[P_KEEP] = -(1 << (24 - precision))
    else:              # the bits below the top P of a 32-bit magnitude, shifted by its zeros
        prm[P_KEEP] = (1 << (32 - precision)) - 1
    prm[P_BLOCK] = block
    prm[P_FLOOR] = (floor + 127) << 23
    prm[P_TINY] = (fraction_bits - 125 + 126) << 23
    prm[P_EMIN_C] = (emin + 127) << 23
    prm[P_S] = np.int32(np.uint32((fraction_bits + 254) << 23))
    prm[P_Q] = fraction_bits << 23
    if rne16:
        variant = RNE16 | _CHECK_SUM
    else:
        variant = _SHORT if precision < 24 else 0
        if lowest < 2 * fraction_bits - 125:
            variant |= _CHECK_TINY
        if (block << (fraction_bits + 2)) + (1 << (fraction_bits + 1)) > 1 << 31:
            variant |= _CHECK_SUM
    if variant not in VARIANTS:
        return -1, 0, 0
    return variant, 255 - top_a, 255 - top_a + floor


# ---- one tile GEMM at a time (mpt.kernels.attention) ------------------------------------------

@njit(cache=True)
def chain_tiles(c, va, ea, vb, eb, nk, prm, variant, scratch, flag):
    """The chain over k < nk on packed tile operands (va/ea: (Mt, >= nk, BLOCK_ROWS) from
    ``mpt.kernels.block_pack.tile_pack`` and ``tile_codes``, vb/eb: (Nt, >= nk,
    BLOCK_COLS)) onto c (>= (Mt·BLOCK_ROWS, Nt·BLOCK_COLS) float32, C-contiguous), one tile
    after the other; flag[0] != 0 after: void."""
    ldc = c.shape[1]
    for it in range(va.shape[0]):
        for jt in range(vb.shape[0]):
            args = (c[it * BLOCK_ROWS:, jt * BLOCK_COLS:].ctypes.data, ldc, va[it].ctypes.data,
                    ea[it].ctypes.data, vb[jt].ctypes.data, eb[jt].ctypes.data, nk,
                    prm.ctypes.data, scratch.ctypes.data, flag.ctypes.data)
            _tile(variant, args)


# ---- many small products: one dot product per lane --------------------------------------------

@njit(cache=True, parallel=True)
def block_chain_lanes(vap, eap, vbp, ebp, acc, k0, k1, prm, variant):
    """The block model's chain over k in [k0, k1) for independent dot products, one per lane:
    output d (lane d % BLOCK_COLS of panel d // BLOCK_COLS) is acc[d] chained with row d of A
    and column d of B, packed by ``mpt.kernels.block_pack.lane_codes`` into (P, K, BLOCK_COLS)
    panels (values float32, anchor codes uint8). acc: (P·BLOCK_COLS,) float32, in: c, out: D.
    Returns whether a panel raised the flag (the call's bits are then void). One task per
    panel."""
    npanel = vap.shape[0]
    flags = np.zeros(npanel, np.int32)
    for p in prange(npanel):
        scratch = np.empty(SCRATCH_WORDS, np.int32)
        _lanes(variant, (acc[p * BLOCK_COLS:].ctypes.data, 0, vap[p, k0:].ctypes.data,
                         eap[p, k0:].ctypes.data, vbp[p, k0:].ctypes.data,
                         ebp[p, k0:].ctypes.data, k1 - k0, prm.ctypes.data, scratch.ctypes.data,
                         flags[p:].ctypes.data))
    return flags.any()
