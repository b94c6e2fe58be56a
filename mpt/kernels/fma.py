"""L1: the fused multiply-add, ``fma(a, b, c) = round(a·b + c)`` with ONE rounding.

Python 3.11's ``math`` has no ``fma`` and Numba 0.68 does not type one, so ``fma32``/``fma64``
call LLVM's ``llvm.fma.*`` intrinsic. Unlike ``llvm.fmuladd`` (which the backend may split into a
multiply and an add), ``llvm.fma`` is specified to compute the product and sum "as if to infinite
precision and round once"; the x86 backend emits ``vfmadd`` when the CPU has FMA3 and otherwise
calls libm's ``fmaf``/``fma``, which are correctly rounded too. Rounding is the current IEEE mode
(round to nearest, ties to even: Python never changes it).

Precision contract: float32 inputs, exact product and sum, one RNE rounding to float32 (``fma32``);
the same in float64 (``fma64``). Oracle: ``mpt.reference.fma32`` (exact rationals), checked in
``tests/test_optim.py`` on random and adversarial (tie, cancellation, subnormal, overflow) inputs.

Why not float64 arithmetic? ``a·b`` is exact in float64 for float32 ``a, b`` (48 significant bits),
but ``f32(a·b + c)`` rounds twice (to float64, then to float32) and is wrong when the first
rounding lands exactly on a float32 tie, so an intrinsic (or a round-to-odd correction) is needed.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.core.extending import intrinsic

__all__ = ["fma32", "fma64", "fma_array", "fma64_chain"]


def _fma_intrinsic(float_type):
    @intrinsic
    def _fma(typingctx, a, b, c):
        if not all(t == float_type for t in (a, b, c)):
            return None  # no match: Numba reports a typing error naming the argument types
        sig = float_type(float_type, float_type, float_type)

        def codegen(context, builder, signature, args):
            return builder.fma(*args)

        return sig, codegen
    return _fma


_fma_f32 = _fma_intrinsic(types.float32)
_fma_f64 = _fma_intrinsic(types.float64)


@njit(inline="always")
def fma32(a, b, c):
    """float32 ``round(a·b + c)`` with a single rounding (arguments converted to float32 first)."""
    return _fma_f32(np.float32(a), np.float32(b), np.float32(c))


@njit(inline="always")
def fma64(a, b, c):
    """float64 ``round(a·b + c)`` with a single rounding."""
    return _fma_f64(np.float64(a), np.float64(b), np.float64(c))


@njit(cache=True)
def _fma_array(a, b, c, out):  # all (n,) float32; one thread (vectorised), see mpt.kernels.optim
    for i in range(out.size):
        out[i] = fma32(a[i], b[i], c[i])


def fma_array(a, b, c) -> np.ndarray:
    """Elementwise float32 ``fma(a, b, c)`` of broadcast float32 arrays (a new float32 array).

    Elementwise: the result does not depend on the order.
    """
    arrays = []
    for name, x in (("a", a), ("b", b), ("c", c)):
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise TypeError(f"fma_array: {name} must be float32; got {x.dtype}")
        arrays.append(x)
    shape = np.broadcast_shapes(*(x.shape for x in arrays))
    # Materialised copies: a broadcast view (even of size 1) carries flags Numba warns about.
    a, b, c = (np.array(np.broadcast_to(x, shape), np.float32).ravel() for x in arrays)
    out = np.empty(a.size, dtype=np.float32)
    _fma_array(a, b, c, out)
    return out.reshape(shape)


@njit(cache=True, parallel=True)
def fma64_chain(a, b, acc, ia, ib, k0, k1):
    """acc[z] = FMA chain of A[ia[z]]·B[ib[z]] over k in [k0, k1), in increasing k, onto acc[z]:
    ``acc_ij = fma64(a_ik, b_kj, acc_ij)``, one IEEE float64 rounding (RNE) per k.

    a: (Ba, M, K) float64, b: (Bb, K, N) float64, acc: (B, M, N) float64 in (c) / out (D).
    What an FP64 GEMM on CUDA cores or NVIDIA's FP64 Tensor Cores (DMMA: MMA-Sim models them as
    this chain) computes, and ``mpt.kernels.ops.matmul_f64``. One task per output row: each
    element is computed by one thread in a fixed order. Oracle: a float64 loop over ``fma64``
    and exact rationals (tests/test_mma_variants.py).
    """
    nb, m, n = acc.shape
    for t in prange(nb * m):
        z, i = t // m, t % m
        row, a_row, b_mat = acc[z, i], a[ia[z], i], b[ib[z]]
        for k in range(k0, k1):
            ak, b_k = a_row[k], b_mat[k]
            for j in range(n):
                row[j] = fma64(ak, b_k[j], row[j])
