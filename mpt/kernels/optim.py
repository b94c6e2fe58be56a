"""L1: fused optimizer steps — unscale → update of the FP32 master in one pass per element.

The copy-down to the model's fp16/bf16 copy is the next pass, ``mpt.round`` over the master
(``mpt.optim``); it also counts lost updates.

Each kernel walks a parameter's elements once, in one thread (a parallel region's start-up takes
milliseconds on a busy 2-core machine and would dominate the many small tensors of a model;
elements are independent, so the order does not matter for the bits). Per element:

1. unscales the gradient, ``g = g · inv_scale`` in float32 (skipped when ``inv_scale == 1``, as
   PyTorch's GradScaler does);
2. applies the optimizer update to the float32 master value (and float32 states) in PyTorch's
   single-tensor operation order (docs/amp.md §3), with the ``fma`` profile: ``fma=True`` makes
   ``add(alpha)``, ``lerp`` and ``addcmul`` one fused multiply-add each (``mpt.kernels.fma``),
   ``fma=False`` rounds every product and sum; every other op is one float32 IEEE operation
   (Numba without fastmath never contracts ``a*b + c``).

The global inf/NaN decision (skip the whole step) needs every gradient, so it is a separate
read-only pass before these kernels (``mpt.amp.GradScaler``), as in Apex and PyTorch.

Oracle: ``mpt.reference.sgd_reference`` / ``adam_reference`` (exact rationals), and the unfused
array path of ``mpt.optim`` (bit equality, both profiles, tests/test_optim.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from mpt.kernels.fma import fma32

__all__ = ["sgd_step", "adam_step", "sum_abs_pow"]


@njit(inline="always")
def _add_alpha(a, s, b, fma):
    """``a.add(b, alpha=s)`` for a float32 ``s``: fma(s, b, a) or a + s·b."""
    return fma32(s, b, a) if fma else a + s * b


@njit(cache=True)
def sgd_step(w, g, inv_scale, buf, first, use_wd, wd, use_momentum, mu, one_minus_damp, nesterov,
             neg_lr, fma):
    """Fused SGD step on (n,) float32 ``w`` (master, in place), ``g`` (grad) and ``buf`` (momentum
    buffer, in place; ``first``: set it to the grad). Scalars are float32.

    g ← g·inv; g ← g.add(w, alpha=wd); buf ← g (first) or (buf·mu).add(g, alpha=1−dampening);
    g ← g.add(buf, alpha=mu) (nesterov) or buf; w ← w.add(g, alpha=−lr).
    """
    for i in range(w.size):
        gi = g[i] * inv_scale if inv_scale != 1 else g[i]
        old = w[i]
        if use_wd:
            gi = _add_alpha(gi, wd, old, fma)
        if use_momentum:
            b = gi if first else _add_alpha(buf[i] * mu, one_minus_damp, gi, fma)
            buf[i] = b
            gi = _add_alpha(gi, mu, b, fma) if nesterov else b
        new = _add_alpha(old, neg_lr, gi, fma)
        w[i] = new


@njit(cache=True)
def adam_step(w, g, inv_scale, m, v, use_wd, decoupled, decay, wd, w1, b2, one_minus_b2, bc2_sqrt,
              eps, neg_step_size, fma):
    """Fused Adam/AdamW step on (n,) float32 ``w`` (master), ``m``, ``v`` (all in place), ``g``.

    Scalars are float32 (``decay = f32(1 − lr·wd)``, ``w1 = f32(1 − β1)``, ``bc2_sqrt =
    f32(√(1 − β2^t))``, ``neg_step_size = f32(−lr/(1 − β1^t))``).
    w ← w·decay (AdamW) or g ← g.add(w, alpha=wd) (Adam); m ← m.lerp(g, w1);
    v ← (v·β2).addcmul(g, g, value=1−β2); w ← w.addcdiv(m, √v/bc2_sqrt + eps, value=−step_size).
    ``lerp`` follows PyTorch's two formulas: m + w1·(g − m) if |w1| < 0.5, else
    g + (w1 − 1)·(g − m).
    """
    small = abs(w1) < 0.5
    coeff = w1 if small else w1 - np.float32(1)                    # w1 − 1 is exact for w1 ≥ 0.5
    for i in range(w.size):
        gi = g[i] * inv_scale if inv_scale != 1 else g[i]
        old = w[i]
        p = old
        if use_wd:
            if decoupled:
                p = p * decay
            else:
                gi = _add_alpha(gi, wd, p, fma)
        mi = m[i]
        mi = _add_alpha(mi if small else gi, coeff, gi - mi, fma)
        vi = _add_alpha(v[i] * b2, one_minus_b2 * gi, gi, fma)     # addcmul: (s·g)·g
        denom = np.sqrt(vi) / bc2_sqrt + eps
        p = p + (neg_step_size * mi) / denom
        m[i] = mi
        v[i] = vi
        w[i] = p


@njit(cache=True)
def sum_abs_pow(x, p):
    """Σ |x_i|^p over a (n,) float32 array, sequentially in index order, in float64.

    For p = 2 every term is exact (a float32 square fits in float64); the sum rounds to float64
    at each step (relative error <= (n−1)·2^-53, far below float32's 2^-24 for n < 2^29).
    """
    total = 0.0
    if p == 2.0:
        for i in range(x.size):
            xi = np.float64(x[i])
            total += xi * xi
    else:
        for i in range(x.size):
            total += abs(np.float64(x[i])) ** p
    return total
