"""L1: register-blocked GEMM micro-kernels: the ``ieee_fma`` model and the fast block model.

Numba cannot name vector registers, so the inner loops are written as LLVM IR through
``numba.core.extending.intrinsic``: a tile of outputs lives in 16-lane float32/int32 vector
registers while packed, k-major panels of A (``rows`` values per k) and B (32 values per k)
stream through it, GotoBLAS-style. Operands are packed (zero-padded to whole tiles) once per
GEMM by :func:`pack_rows` / :func:`pack_cols`; the drivers can then run any k-range.

``fma_chain`` — every output element is ``acc = c; for k increasing: acc = fma(a_ik, b_kj, acc)``,
one IEEE binary32 fused multiply-add per k (``llvm.fma.v16f32``: exact product and sum, one RNE
rounding; LLVM never splits it into a multiply and an add). What a CPU or a CUDA-core loop
computes, and mpt's FP32 matmul. Oracle: ``mpt.reference.mma.ieee_fma_reference``.

``block_chain_packed`` — the block model of :mod:`mpt.kernels.mma` for operands that meet its
fast conditions (finite, non-zero products within [2^-60, 2^60], F <= 29; see
``mpt.kernels.mma.block_chain``): the anchor pass (max of nominal products) and the sum pass
(Σ int32(a·b·2^(F-E)) over chunks of at most 2^(29-F) products, float32 products exact) run in
registers; the per-block start and the output rounding are the shared Numba steps. Oracle:
``mpt.reference.mma.block_dot_reference`` and the hardware samples. In both kernels each output element sees the same operations in the
same order whatever the tiling and the thread count.
"""
from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from mpt.kernels.mma import block_finish, block_scale, block_start

__all__ = ["ROWS", "BLOCK_ROWS", "COLS", "ROW_TILES", "pack_rows", "pack_cols", "pack_tiles",
           "unpack_tiles", "fma_chain", "block_chain_packed", "sum_chunk", "fma_tile",
           # building blocks of LLVM IR kernels over these panels (mpt.kernels.mfma uses them)
           "const", "panel_vectors", "panel_splats", "k_loop", "vector_intrinsic"]

_LANES = 16              # 32-bit lanes of one AVX-512 register
_VECS = 2                # vectors per tile row
COLS = _LANES * _VECS    # tile columns
ROWS = 8                 # tile rows of the FMA kernel: 16 accumulator registers
BLOCK_ROWS = 8           # tile rows of the block kernel (its sum pass spills a few of its 16 + 16
                         # scale and total registers, yet 8 rows measured faster than 4 or 6)
_KC = 512                # k-slice per FMA micro-kernel call: packed panels stay in L1/L2
ROW_TILES = 8            # row tiles per parallel task (they share one B panel in cache)

_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_VF32 = ir.VectorType(_F32, _LANES)
_VI32 = ir.VectorType(_I32, _LANES)


def const(n):
    """An LLVM i64 constant (indices and counts in the emitted IR)."""
    return ir.Constant(_I64, n)


def _pointer(builder, addr, elem=_F32):
    return builder.inttoptr(addr, elem.as_pointer())


def _tile_pointers(builder, addr, ld, rows, vtype):
    """Vector pointers to the rows x _VECS vectors of a tile at addr with row stride ld elements."""
    base = _pointer(builder, addr, vtype.element)
    offsets = [builder.add(builder.mul(const(r), ld), const(_LANES * v))
               for r in range(rows) for v in range(_VECS)]
    return [builder.bitcast(builder.gep(base, [o]), vtype.as_pointer()) for o in offsets]


def panel_vectors(builder, addr, k):
    """The _VECS vectors of row k of a packed (K, COLS) float32 panel."""
    row = builder.gep(_pointer(builder, addr), [builder.mul(k, const(COLS))])
    ptrs = [builder.bitcast(builder.gep(row, [const(_LANES * v)]), _VF32.as_pointer())
            for v in range(_VECS)]
    return [builder.load(p, align=4) for p in ptrs]


def panel_splats(builder, addr, k, rows):
    """Row k of a packed (K, rows) float32 panel, each value broadcast to a vector."""
    row = builder.gep(_pointer(builder, addr), [builder.mul(k, const(rows))])
    zeros = ir.Constant(ir.VectorType(_I32, _LANES), [0] * _LANES)
    out = []
    for r in range(rows):
        x = builder.load(builder.gep(row, [const(r)]), align=4)
        v = builder.insert_element(ir.Constant(_VF32, ir.Undefined), x, ir.Constant(_I32, 0))
        out.append(builder.shuffle_vector(v, ir.Constant(_VF32, ir.Undefined), zeros))
    return out


def k_loop(builder, nk, state, body):
    """Emit ``for k in range(nk): state = body(k, state)``; return the final state (SSA values)."""
    entry = builder.block
    head = builder.append_basic_block("k.head")
    loop = builder.append_basic_block("k.body")
    done = builder.append_basic_block("k.done")
    builder.branch(head)
    builder.position_at_end(head)
    k = builder.phi(_I64)
    k.add_incoming(const(0), entry)
    phis = []
    for value in state:
        phi = builder.phi(value.type)
        phi.add_incoming(value, entry)
        phis.append(phi)
    builder.cbranch(builder.icmp_signed("<", k, nk), loop, done)
    builder.position_at_end(loop)
    new = body(k, phis)
    k.add_incoming(builder.add(k, const(1)), builder.block)
    for phi, value in zip(phis, new):
        phi.add_incoming(value, builder.block)
    builder.branch(head)
    builder.position_at_end(done)
    return phis


def vector_intrinsic(builder, name, vtype, arity):
    """The LLVM intrinsic ``name`` (e.g. ``llvm.fma.v16f32``) over ``arity`` vectors of vtype."""
    fnty = ir.FunctionType(vtype, [vtype] * arity)
    return cgutils.get_or_insert_function(builder.module, fnty, name)


def _tile_intrinsic(emit):
    """An intrinsic (5 intp arguments: addresses and counts) whose body ``emit`` writes."""
    @intrinsic
    def tile(typingctx, x0, x1, x2, x3, x4):
        def codegen(context, builder, signature, args):
            emit(builder, *args)
            return context.get_dummy_value()
        return types.void(*([types.intp] * 5)), codegen
    return tile


def _emit_fma(builder, c_addr, ldc, a_addr, b_addr, nk):
    """C[ROWS, COLS] (row stride ldc) = fma(A[k, r], B[k, j], C[r, j]) for k = 0..nk-1."""
    vfma = vector_intrinsic(builder, "llvm.fma.v16f32", _VF32, 3)
    ptrs = _tile_pointers(builder, c_addr, ldc, ROWS, _VF32)

    def step(k, acc):
        b = panel_vectors(builder, b_addr, k)
        a = panel_splats(builder, a_addr, k, ROWS)
        return [builder.call(vfma, [a[i // _VECS], b[i % _VECS], acc[i]]) for i in range(len(acc))]
    acc = k_loop(builder, nk, [builder.load(p, align=4) for p in ptrs], step)
    for p, value in zip(ptrs, acc):
        builder.store(value, p, align=4)


def _emit_anchor(builder, anchor_addr, unused, pa_addr, pb_addr, nk):
    """anchor[BLOCK_ROWS, COLS] = max(anchor, pa[k, r]·pb[k, j]) over k = 0..nk-1."""
    vmax = vector_intrinsic(builder, "llvm.maxnum.v16f32", _VF32, 2)
    ptrs = _tile_pointers(builder, anchor_addr, const(COLS), BLOCK_ROWS, _VF32)

    def step(k, anchor):
        b = panel_vectors(builder, pb_addr, k)
        a = panel_splats(builder, pa_addr, k, BLOCK_ROWS)
        return [builder.call(vmax, [anchor[i], builder.fmul(a[i // _VECS], b[i % _VECS])])
                for i in range(len(anchor))]
    anchor = k_loop(builder, nk, [builder.load(p, align=4) for p in ptrs], step)
    for p, value in zip(ptrs, anchor):
        builder.store(value, p, align=4)


def _emit_sum(builder, total_addr, scale_addr, va_addr, vb_addr, nk):
    """total[BLOCK_ROWS, COLS] += int32(va[k, r]·vb[k, j]·scale[r, j]) over k = 0..nk-1
    (fptosi truncates toward zero: the spec's per-term truncation)."""
    scale = [builder.load(p, align=4)
             for p in _tile_pointers(builder, scale_addr, const(COLS), BLOCK_ROWS, _VF32)]
    ptrs = _tile_pointers(builder, total_addr, const(COLS), BLOCK_ROWS, _VI32)

    def step(k, total):
        b = panel_vectors(builder, vb_addr, k)
        a = panel_splats(builder, va_addr, k, BLOCK_ROWS)
        return [builder.add(total[i], builder.fptosi(
            builder.fmul(builder.fmul(a[i // _VECS], b[i % _VECS]), scale[i]), _VI32))
            for i in range(len(total))]
    total = k_loop(builder, nk, [builder.load(p, align=4) for p in ptrs], step)
    for p, value in zip(ptrs, total):
        builder.store(value, p, align=4)


_fma_tile = _tile_intrinsic(_emit_fma)
_anchor_tile = _tile_intrinsic(_emit_anchor)
_sum_tile = _tile_intrinsic(_emit_sum)
#: ``fma_tile(c_addr, ldc, a_addr, b_addr, nk)`` (intp arguments), callable from njit code: the
#: ROWS x COLS tile at c_addr (row stride ldc floats) += FMA chain over k < nk of a packed (nk, ROWS)
#: A panel and a packed (nk, COLS) B panel (used by mpt.kernels.attention's tile GEMMs).
fma_tile = _fma_tile


@njit(cache=True, parallel=True)
def _pack_rows(a, out):
    """out[z, it, k, r] = a[z, it·rows + r, k], 0 past the last row."""
    nb, m, k = a.shape
    mt, rows = out.shape[1], out.shape[3]
    for t in prange(nb * mt):
        z, it = t // mt, t % mt
        for r in range(rows):
            i = it * rows + r
            for kk in range(k):
                out[z, it, kk, r] = a[z, i, kk] if i < m else 0


@njit(cache=True, parallel=True)
def _pack_cols(b, out):
    """out[z, jt, k, w] = b[z, k, jt·COLS + w], 0 past the last column."""
    nb, k, n = b.shape
    nt = out.shape[1]
    for t in prange(nb * nt):
        z, jt = t // nt, t % nt
        j0 = jt * COLS
        w_n = min(COLS, n - j0)
        for kk in range(k):
            out[z, jt, kk, :w_n] = b[z, kk, j0:j0 + w_n]
            out[z, jt, kk, w_n:] = 0


def pack_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """(B, M, K) -> (B, ceil(M/rows), K, rows): row panels, k-major, zero-padded."""
    nb, m, k = a.shape
    out = np.empty((nb, -(-m // rows), k, rows), a.dtype)
    _pack_rows(np.ascontiguousarray(a), out)
    return out


def pack_cols(b: np.ndarray) -> np.ndarray:
    """(B, K, N) -> (B, ceil(N/COLS), K, COLS): column panels, k-major, zero-padded."""
    nb, k, n = b.shape
    out = np.empty((nb, -(-n // COLS), k, COLS), b.dtype)
    _pack_cols(np.ascontiguousarray(b), out)
    return out


@njit(cache=True, parallel=True)
def fma_chain(ap, bp, acc, ia, ib, k0, k1):
    """acc[z] = FMA chain of A[ia[z]]·B[ib[z]] over k in [k0, k1), increasing k, onto acc[z].

    ap: (Ba, Mt, K, ROWS) float32 from ``pack_rows(a, ROWS)``; bp: (Bb, Nt, K, COLS) float32
    from :func:`pack_cols`; acc: (B, Mt·ROWS, Nt·COLS) float32, C-contiguous, in: c, out: D
    (padding rows and columns are ignored). Tasks are (batch, column panel, 64 rows).
    """
    nb, ldc = acc.shape[0], acc.shape[2]
    mt, nt = ap.shape[1], bp.shape[1]
    groups = (mt + ROW_TILES - 1) // ROW_TILES
    for t in prange(nb * nt * groups):
        z = t // (nt * groups)
        jt = t // groups % nt
        g = t % groups
        a_z, b_panel = ap[ia[z]], bp[ib[z], jt]
        for kc in range(k0, k1, _KC):
            nk = min(_KC, k1 - kc)
            for it in range(g * ROW_TILES, min(mt, (g + 1) * ROW_TILES)):
                _fma_tile(acc[z, it * ROWS:, jt * COLS:].ctypes.data, ldc,
                          a_z[it, kc:].ctypes.data, b_panel[kc:].ctypes.data, nk)


@njit(cache=True, parallel=True)
def block_chain_packed(vap, pap, vbp, pbp, acc, ia, ib, k0, k1, block, chunk, fraction_bits,
                       zero_pow2, out):
    """The block model's chain over k in [k0, k1) (``mpt.kernels.mma.block_chain``), fast path.

    vap, pap: (Ba, Mt, K, BLOCK_ROWS) float32 values / nominal powers of two of A, packed by
    ``pack_rows``; vbp, pbp: (Bb, Nt, K, COLS) of B by :func:`pack_cols`; acc: (B, Mt, Nt,
    BLOCK_ROWS·COLS) float64 tiles (row-major within a tile, see ``pack_tiles``), in: c, out: D.
    ``chunk``: products per int32 partial sum, with chunk·2^(F+2) <= 2^31 (:func:`sum_chunk`):
    each truncated term is an integer below 2^(F+2), so a chunk's register sum cannot overflow;
    a block of more products (Blackwell's f8f6f4: 32 products, F = 25) adds its chunks' partial
    sums in float64, exactly (below 2^53). Tasks are (batch, column panel, 8 row tiles).
    """
    nb = acc.shape[0]
    mt, nt = vap.shape[1], vbp.shape[1]
    groups = (mt + ROW_TILES - 1) // ROW_TILES
    size = BLOCK_ROWS * COLS
    for t in prange(nb * nt * groups):
        z = t // (nt * groups)
        jt = t // groups % nt
        g = t % groups
        anchor = np.empty(size, np.float32)
        scale = np.empty(size, np.float32)
        part = np.empty(size, np.int32)
        total = np.empty(size)
        c_term = np.empty(size)
        va_z, pa_z, vb_p, pb_p = vap[ia[z]], pap[ia[z]], vbp[ib[z], jt], pbp[ib[z], jt]
        for kb in range(k0, k1, block):
            nk = min(block, k1 - kb)
            for it in range(g * ROW_TILES, min(mt, (g + 1) * ROW_TILES)):
                tile = acc[z, it, jt]
                block_start(tile, anchor, zero_pow2, out[0])
                _anchor_tile(anchor.ctypes.data, 0, pa_z[it, kb:].ctypes.data,
                             pb_p[kb:].ctypes.data, nk)
                if nk <= chunk:          # one register sum: the block's total is the int32 sum
                    block_scale(tile, anchor, scale, c_term, part, fraction_bits, 2.0 ** 88)
                    _sum_tile(part.ctypes.data, scale.ctypes.data, va_z[it, kb:].ctypes.data,
                              vb_p[kb:].ctypes.data, nk)
                    block_finish(tile, anchor, c_term, part, fraction_bits, out)
                    continue
                block_scale(tile, anchor, scale, c_term, total, fraction_bits, 2.0 ** 88)
                for kc in range(kb, kb + nk, chunk):
                    part[:] = 0
                    _sum_tile(part.ctypes.data, scale.ctypes.data, va_z[it, kc:].ctypes.data,
                              vb_p[kc:].ctypes.data, min(chunk, kb + nk - kc))
                    for w in range(size):
                        total[w] += part[w]
                block_finish(tile, anchor, c_term, total, fraction_bits, out)


def sum_chunk(block: int, fraction_bits: int) -> int:
    """Products per int32 partial sum of :func:`block_chain_packed` for blocks of ``block``
    products aligned with F = ``fraction_bits``: the most with chunk·2^(F+2) <= 2^31."""
    return min(block, 1 << (29 - fraction_bits))


def pack_tiles(c: np.ndarray, rows: int) -> np.ndarray:
    """(B, M, N) -> (B, ceil(M/rows), ceil(N/COLS), rows·COLS): float64 output tiles, padded."""
    nb, m, n = c.shape
    mt, nt = -(-m // rows), -(-n // COLS)
    padded = np.zeros((nb, mt * rows, nt * COLS))
    padded[:, :m, :n] = c
    return np.ascontiguousarray(
        padded.reshape(nb, mt, rows, nt, COLS).transpose(0, 1, 3, 2, 4)).reshape(nb, mt, nt, -1)


def unpack_tiles(tiles: np.ndarray, rows: int, m: int, n: int) -> np.ndarray:
    """The inverse of :func:`pack_tiles`: (B, Mt, Nt, rows·COLS) -> (B, m, n)."""
    nb, mt, nt, _ = tiles.shape
    full = tiles.reshape(nb, mt, nt, rows, COLS).transpose(0, 1, 3, 2, 4)
    return full.reshape(nb, mt * rows, nt * COLS)[:, :m, :n]
