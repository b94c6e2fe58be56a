"""L1: register-blocked GEMM micro-kernels: the ``ieee_fma`` model, the block model's chunked
fast path, and the LLVM-IR helpers that :mod:`mpt.kernels.block_gemm` (the block model's tile
kernels) and :mod:`mpt.kernels.mfma` share.

Numba cannot name vector registers, so the inner loops are written as LLVM IR through
``numba.core.extending.intrinsic``: a tile of outputs lives in 16-lane float32/int32 vector
registers while packed, k-major panels of A (``rows`` values per k) and B (32 values per k)
stream through it, GotoBLAS-style. Operands are packed (zero-padded to whole tiles, read from
any strides: no copy first) once per GEMM by :func:`pack_rows` / :func:`pack_cols`, except
where ``fma_chain`` reads them in place (whole row tiles of A, whole column panels of B's
contiguous rows: :func:`direct_rows`, :func:`col_panels`); the drivers can then run any
k-range.

``fma_chain`` — every output element is ``acc = c; for k increasing: acc = fma(a_ik, b_kj, acc)``,
one IEEE binary32 fused multiply-add per k (``llvm.fma.v16f32``: exact product and sum, one RNE
rounding; LLVM never splits it into a multiply and an add). What a CPU or a CUDA-core loop
computes, and mpt's FP32 matmul. Oracle: ``mpt.reference.mma.ieee_fma_reference``.

``block_chain_packed`` — the block model of :mod:`mpt.kernels.mma` for operands that meet its
fast conditions (finite, non-zero products within [2^-60, 2^60], F <= 29; see
``mpt.kernels.mma.block_chain``) but not those of :mod:`mpt.kernels.block_gemm` (blocks whose
sum overflows int32, such as Blackwell's f8f6f4: 32 products, F = 25; scale-folded operands):
the anchor pass (max of nominal products) and the sum pass (Σ int32(a·b·2^(F-E)) over chunks
of at most 2^(29-F) products, float32 products exact) run in registers; the per-block start and
the output rounding are the shared Numba steps. Oracle: ``mpt.reference.mma.block_dot_reference``
and the hardware samples.

In every kernel each output element sees the same operations in the same order whatever the
tiling and the thread count.
"""
from __future__ import annotations

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numba
import numpy as np
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.extending import intrinsic

from mpt.kernels.fma import fma32
from mpt.kernels.half import fp16_as_f32
from mpt.kernels.mma import block_finish, block_scale, block_start

__all__ = ["ROWS", "BLOCK_ROWS", "COLS", "ROW_TILES", "F32", "BF16", "FP16", "source",
           "as_f32_pattern", "pack_panels", "pack_rows", "pack_cols", "col_panels",
           "pack_tiles", "unpack_tiles", "direct_rows", "fma_chain", "fma_lanes", "next_output",
           "block_chain_packed", "sum_chunk", "fma_tile", "fma_tile_strided",
           # building blocks of LLVM IR kernels over these panels (block_gemm and mfma use them)
           "const", "panel_vectors", "panel_splats", "k_loop", "vector_intrinsic", "AVX512"]

_LANES = 16              # 32-bit lanes of one AVX-512 register
_VECS = 2                # vectors per tile row
COLS = _LANES * _VECS    # tile columns
ROWS = 8                 # tile rows of the FMA kernel: 16 accumulator registers
BLOCK_ROWS = 8           # tile rows of the chunked block kernel (its sum pass spills a few of its
                         # 16 + 16 scale and total registers, yet 8 rows measured faster than 4/6)
_KC = 512                # k-slice per FMA micro-kernel call: packed panels stay in L1/L2
ROW_TILES = 8            # row tiles per parallel task (they share one B panel in cache)

#: Whether Numba compiles for this host and the host has AVX-512: the IR kernels then use its
#: embedded rounding (``block_gemm``, ``mfma_packed``) and integer-domain broadcast loads
#: (:func:`panel_splats`).
AVX512 = numba.config.CPU_NAME is None and \
    bool(llvm.get_host_cpu_features().get("avx512f", False))
if AVX512:
    llvm.initialize_native_asmparser()   # panel_splats's inline assembly

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


def _as_value(x):
    return const(x) if isinstance(x, int) else x


def panel_vectors(builder, addr, k, ld=COLS):
    """The _VECS vectors at the start of row k of a (K, >= COLS) float32 panel with row stride
    ld floats (an int or an i64 value)."""
    row = builder.gep(_pointer(builder, addr), [builder.mul(k, _as_value(ld))])
    ptrs = [builder.bitcast(builder.gep(row, [const(_LANES * v)]), _VF32.as_pointer())
            for v in range(_VECS)]
    return [builder.load(p, align=4) for p in ptrs]


def panel_splats(builder, addr, k, rows, row_stride=1, k_stride=None):
    """A[r, k] for r < rows, each broadcast to a vector, from float32 elements at
    addr + 4·(r·row_stride + k·k_stride) (strides: ints or i64 values; a packed (K, rows) panel
    by default)."""
    base = builder.gep(_pointer(builder, addr),
                       [builder.mul(k, _as_value(rows if k_stride is None else k_stride))])
    ptrs = [builder.gep(base, [builder.mul(const(r), _as_value(row_stride))]) for r in range(rows)]
    if AVX512:
        return [_broadcast_load(builder, p) for p in ptrs]
    zeros = ir.Constant(ir.VectorType(_I32, _LANES), [0] * _LANES)
    out = []
    for p in ptrs:
        v = builder.insert_element(ir.Constant(_VF32, ir.Undefined), builder.load(p, align=4),
                                   ir.Constant(_I32, 0))
        out.append(builder.shuffle_vector(v, ir.Constant(_VF32, ir.Undefined), zeros))
    return out


def _broadcast_load(builder, ptr):
    """The float32 at ptr in every lane, loaded by ``vpbroadcastd`` (inline assembly that reads
    memory, so LLVM keeps it in order with stores). LLVM would pick ``vbroadcastss`` for a float
    splat, and on AMD Zen 4 that takes a vector ALU slot, while the integer-domain broadcast runs
    in the load pipes: a loop of 4 vmulps and 4 vpaddd (zmm) takes 4.0 cycles, 6.0 with 4
    vbroadcastss from memory, 4.0-4.2 with 4 vpbroadcastd (measured on an EPYC Zen 4)."""
    asm = ir.InlineAsm(ir.FunctionType(_VI32, [ptr.type]), "vpbroadcastd $1, $0", "=v,*m",
                       side_effect=False)
    return builder.bitcast(builder.call(asm, [ptr], arg_attrs={0: ("elementtype",)}), _VF32)


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


def _codegen(emit):
    def codegen(context, builder, signature, args):
        emit(builder, *args)
        return context.get_dummy_value()
    return codegen


def _tile_intrinsic(emit, nargs):
    """An intrinsic of ``nargs`` (5, 7, 8 or 10) intp arguments (addresses, strides, counts)
    whose body ``emit`` writes."""
    sig = types.void(*([types.intp] * nargs))
    if nargs == 5:
        def typer(typingctx, x0, x1, x2, x3, x4):
            return sig, _codegen(emit)
    elif nargs == 7:
        def typer(typingctx, x0, x1, x2, x3, x4, x5, x6):
            return sig, _codegen(emit)
    elif nargs == 8:
        def typer(typingctx, x0, x1, x2, x3, x4, x5, x6, x7):
            return sig, _codegen(emit)
    else:
        def typer(typingctx, x0, x1, x2, x3, x4, x5, x6, x7, x8, x9):
            return sig, _codegen(emit)
    return intrinsic(typer)


def _emit_fma_tile(builder, c_addr, ldc, a_addr, sar, sak, b_addr, ldb, nk, from_zero=False):
    """C[ROWS, COLS] (row stride ldc floats) = fma(A[r, k], B[k, j], C[r, j]) for k < nk, with
    A[r, k] at a_addr + 4·(r·sar + k·sak) and B[k, j] at b_addr + 4·(k·ldb + j) (a packed
    (nk, COLS) panel: ldb = COLS). ``from_zero``: the chain starts from +0 registers instead
    of loading C (the same bits as a C of +0; C's memory is only written)."""
    vfma = vector_intrinsic(builder, "llvm.fma.v16f32", _VF32, 3)
    ptrs = _tile_pointers(builder, c_addr, ldc, ROWS, _VF32)

    def step(k, acc):
        b = panel_vectors(builder, b_addr, k, ldb)
        a = panel_splats(builder, a_addr, k, ROWS, sar, sak)
        return [builder.call(vfma, [a[i // _VECS], b[i % _VECS], acc[i]]) for i in range(len(acc))]
    start = [ir.Constant(_VF32, [0.0] * _LANES)] * len(ptrs) if from_zero else \
        [builder.load(p, align=4) for p in ptrs]
    acc = k_loop(builder, nk, start, step)
    for p, value in zip(ptrs, acc):
        builder.store(value, p, align=4)


def _emit_fma_strided(builder, c_addr, ldc, a_addr, sar, sak, b_addr, nk):
    """:func:`_emit_fma_tile` on a packed (nk, COLS) B panel."""
    _emit_fma_tile(builder, c_addr, ldc, a_addr, sar, sak, b_addr, COLS, nk)


def _emit_fma(builder, c_addr, ldc, a_addr, b_addr, nk):
    """:func:`_emit_fma_strided` on a packed (nk, ROWS) A panel."""
    _emit_fma_strided(builder, c_addr, ldc, a_addr, 1, ROWS, b_addr, nk)


_fma_tile = _tile_intrinsic(_emit_fma_tile, 8)
_fma_tile_zero = _tile_intrinsic(
    lambda builder, *args: _emit_fma_tile(builder, *args, from_zero=True), 8)
#: ``fma_tile_strided(c_addr, ldc, a_addr, sar, sak, b_addr, nk)``: :data:`fma_tile` with A read
#: in place, A[r, k] at a_addr + 4·(r·sar + k·sak) (used by mpt.kernels.attention).
fma_tile_strided = _tile_intrinsic(_emit_fma_strided, 7)
#: ``fma_tile(c_addr, ldc, a_addr, b_addr, nk)`` (intp arguments), callable from njit code: the
#: ROWS x COLS tile at c_addr (row stride ldc floats) += FMA chain over k < nk of a packed
#: (nk, ROWS) A panel and a packed (nk, COLS) B panel (used by mpt.kernels.attention's tile
#: GEMMs).
fma_tile = _tile_intrinsic(_emit_fma, 5)


# ---- the chunked block kernel (block_chain_packed) ---------------------------------------------

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


_anchor_tile = _tile_intrinsic(_emit_anchor, 5)
_sum_tile = _tile_intrinsic(_emit_sum, 5)


F32, BF16, FP16 = 0, 1, 2   # how the packers read an operand's patterns (:func:`source`)


def source(x: np.ndarray):
    """(bit patterns, kind) of an operand as the packers read it: 32-bit values as uint32
    (kind F32), bfloat16 and float16 storage as uint16 (BF16, FP16), widened to float32 as read;
    a view of x."""
    if x.dtype.itemsize == 4:
        return x.view(np.uint32), F32
    if x.dtype.name == "bfloat16":
        return x.view(np.uint16), BF16
    if x.dtype == np.float16:
        return x.view(np.uint16), FP16
    raise TypeError(f"the packers read 32-bit, bfloat16 or float16 values; got {x.dtype}")


@njit(inline="always")
def as_f32_pattern(x, kind):
    """The 32-bit pattern of a source pattern of ``kind`` (:func:`source`), exact: a bf16
    pattern is the top half of its float32's; an fp16 pattern widens as IEEE conversion does
    (``mpt.kernels.half.fp16_as_f32``)."""
    if kind == BF16:
        return np.uint32(x) << np.uint32(16)
    if kind == FP16:
        return fp16_as_f32(x)
    return np.uint32(x)


@njit(cache=True, parallel=True)
def _pack_values(bits, kind, vout):
    """vout[z, p, k, w] = the 32-bit pattern of bits[z, p·W + w, k] (0 past R): panels of width
    W = vout.shape[3] along the axis R of bits (B, R, K), patterns of ``kind``. k outer, w inner
    whatever bits' layout: the writes stream, and with K the faster axis the W rows are read as
    W streams. Measured faster than reading each row whole (1.05-2.2x, 2-core AMD EPYC: widths
    4-64, K 128-4096, float32, bfloat16 and float16 sources). Direct indexing, no row views."""
    nb, nr, k = bits.shape
    npanel, width = vout.shape[1], vout.shape[3]
    for t in prange(nb * npanel):
        z, p = t // npanel, t % npanel
        w_n = min(width, nr - p * width)
        r0 = p * width
        for kk in range(k):
            for w in range(w_n):
                vout[z, p, kk, w] = as_f32_pattern(bits[z, r0 + w, kk], kind)
        if w_n < width:
            for kk in range(k):
                for w in range(w_n, width):
                    vout[z, p, kk, w] = 0


def pack_panels(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """out[z, p, k, w] = x[z, p·W + w, k], zero past R: panels of width W = out.shape[3] along
    the axis R of x (B, R, K) (32-bit values, or bfloat16/float16 widened to float32 as read;
    any strides, no copy first)."""
    if out.dtype.itemsize != 4:
        raise TypeError(f"pack_panels packs into 32-bit values; got {out.dtype}")
    _pack_values(*source(x), out.view(np.uint32))
    return out


def pack_rows(a: np.ndarray, rows: int) -> np.ndarray:
    """(B, M, K) 32-bit values, or bfloat16/float16 widened to float32 (any strides) -> (B,
    ceil(M/rows), K, rows): row panels, k-major, zero-padded."""
    nb, m, k = a.shape
    return pack_panels(a, np.empty((nb, -(-m // rows), k, rows), _packed_dtype(a)))


def pack_cols(b: np.ndarray) -> np.ndarray:
    """(B, K, N) 32-bit values, or bfloat16/float16 widened to float32 (any strides) -> (B,
    ceil(N/COLS), K, COLS): column panels, k-major, zero-padded."""
    nb, k, n = b.shape
    return pack_panels(b.transpose(0, 2, 1),
                       np.empty((nb, -(-n // COLS), k, COLS), _packed_dtype(b)))


def _packed_dtype(x):
    """The dtype of x's panels: x's own for 32-bit values, float32 for 16-bit ones."""
    return x.dtype if x.dtype.itemsize == 4 else np.dtype(np.float32)


def col_panels(b: np.ndarray) -> np.ndarray:
    """The column panels of B (B, K, N) float32 as :func:`fma_chain` reads them, (B, N/COLS, K,
    COLS): a view of b where its rows are contiguous, positive-strided, whole panels (N a
    multiple of COLS) and not 4 KiB apart (the ``direct_rows`` rule), else :func:`pack_cols`."""
    nb, k, n = b.shape
    if b.strides[2] != 4 or n % COLS or b.strides[1] <= 0 or b.strides[1] % 4096 == 0:
        return pack_cols(b)
    return b.reshape(nb, k, n // COLS, COLS).transpose(0, 2, 1, 3)


@njit(cache=True, parallel=True)
def fma_chain(a, ap, a_direct, bp, acc, ia, ib, k0, k1, from_zero):
    """acc[z] = FMA chain of A[ia[z]]·B[ib[z]] over k in [k0, k1), increasing k, onto acc[z].

    Row tile it of A (ROWS rows) is read in place from a (Ba, M, K) float32 (positive strides)
    when it < a_direct, else from the packed panel ap[:, it − a_direct] ((Ba, ·, K, ROWS) from
    ``pack_rows``); bp: (Bb, Nt, K, COLS) float32 column panels from :func:`col_panels` (packed,
    or B itself: any stride along K); acc: (B, Mt·ROWS, Nt·COLS) float32, C-contiguous, in: c,
    out: D (padding rows and columns are ignored). ``from_zero`` (with k1 > k0): c is +0 and
    acc's content is never read (it need not be initialised; every element is written). Tasks
    are (batch, column panel, 64 rows).
    """
    nb, ldc = acc.shape[0], acc.shape[2]
    mt, nt = acc.shape[1] // ROWS, bp.shape[1]
    sar, sak = a.strides[1] // 4, a.strides[2] // 4
    ldb = bp.strides[2] // 4
    groups = (mt + ROW_TILES - 1) // ROW_TILES
    for t in prange(nb * nt * groups):
        z = t // (nt * groups)
        jt = t // groups % nt
        g = t % groups
        b_panel = bp[ib[z], jt]
        for kc in range(k0, k1, _KC):
            nk = min(_KC, k1 - kc)
            b_addr = b_panel[kc:].ctypes.data
            for it in range(g * ROW_TILES, min(mt, (g + 1) * ROW_TILES)):
                c_addr = acc[z, it * ROWS:, jt * COLS:].ctypes.data
                if it < a_direct:
                    a_addr, ars, aks = a[ia[z], it * ROWS:, kc:].ctypes.data, sar, sak
                else:
                    a_addr, ars, aks = ap[ia[z], it - a_direct, kc:].ctypes.data, 1, ROWS
                if from_zero and kc == k0:
                    _fma_tile_zero(c_addr, ldc, a_addr, ars, aks, b_addr, ldb, nk)
                else:
                    _fma_tile(c_addr, ldc, a_addr, ars, aks, b_addr, ldb, nk)


def direct_rows(a: np.ndarray, rows: int) -> int:
    """How many whole row tiles of A (B, M, K) float32 the kernels read in place: all of them,
    unless a stride is negative or a row stride is a multiple of 4 KiB (then the ``rows``
    streams of a tile would share cache sets: pack instead)."""
    row_stride = max(a.strides[1:])
    if min(a.strides[1:]) <= 0 or row_stride % 4096 == 0:
        return 0
    return a.shape[1] // rows


@njit(inline="always")
def next_output(z, i, j, m, n):
    """The output after (z, i, j) of (B, M, N), in C order (counted up: no division)."""
    j += 1
    if j == n:
        j, i = 0, i + 1
        if i == m:
            i, z = 0, z + 1
    return z, i, j


@njit(cache=True, parallel=True)
def fma_lanes(a, b, acc, ia, ib, k0, k1):
    """The FMA chain of :func:`fma_chain` over k in [k0, k1) with one output per chain, for
    many small products that tiles would pad: acc[z, i, j] (float32 (B, M, N), in: c, out: D)
    from a[ia[z], i, :] and b[ib[z], :, j] (float32, any strides). Same operations in the same
    order per output. Four outputs' chains run interleaved (one chain's FMAs wait on each
    other; four keep the FMA units busy); one task per 256 outputs."""
    nb, m, n = acc.shape
    total = nb * m * n
    for t in prange((total + 255) // 256):
        d0, d1 = t * 256, min(total, (t + 1) * 256)
        z, i, j = d0 // (m * n), d0 // n % m, d0 % n
        for _ in range((d1 - d0) // 4):
            z1, i1, j1 = next_output(z, i, j, m, n)
            z2, i2, j2 = next_output(z1, i1, j1, m, n)
            z3, i3, j3 = next_output(z2, i2, j2, m, n)
            x0, x1, x2, x3 = acc[z, i, j], acc[z1, i1, j1], acc[z2, i2, j2], acc[z3, i3, j3]
            for k in range(k0, k1):
                x0 = fma32(a[ia[z], i, k], b[ib[z], k, j], x0)
                x1 = fma32(a[ia[z1], i1, k], b[ib[z1], k, j1], x1)
                x2 = fma32(a[ia[z2], i2, k], b[ib[z2], k, j2], x2)
                x3 = fma32(a[ia[z3], i3, k], b[ib[z3], k, j3], x3)
            acc[z, i, j], acc[z1, i1, j1], acc[z2, i2, j2], acc[z3, i3, j3] = x0, x1, x2, x3
            z, i, j = next_output(z3, i3, j3, m, n)
        for _ in range((d1 - d0) % 4):
            x = acc[z, i, j]
            for k in range(k0, k1):
                x = fma32(a[ia[z], i, k], b[ib[z], k, j], x)
            acc[z, i, j] = x
            z, i, j = next_output(z, i, j, m, n)


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
