"""L1: Numba kernels of 2-D convolution (im2col / col2im) and pooling.

Geometry (as PyTorch, ``ceil_mode=False``): an output pixel (oh, ow) reads input rows
``oh·sh − ph + i·dh`` and columns ``ow·sw − pw + j·dw`` for kernel offsets (i, j); positions in the
padding read zero (convolution, average pooling) or take no part (max pooling).

``im2col`` only moves bits (it runs on uint views of any storage format; padding is the all-zero
pattern, +0 in every float format). The backward kernels accumulate in the work dtype (float32 or
float64) in a fixed order: per (n, c) plane — one thread per plane — outputs in row-major order
(oh, ow), then kernel offsets (i, j) in row-major order. Oracles: float64 loops in the tests.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from mpt.kernels.ops import sized

__all__ = ["im2col", "col2im", "max_pool2d", "max_pool2d_backward", "avg_pool2d",
           "avg_pool2d_backward"]


@sized
@njit(parallel=True, cache=True)
def im2col(x, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo):
    """x (N, C, H, W) → cols (N, ho·wo, C·kh·kw): ``cols[n, oh·wo + ow, (c·kh + i)·kw + j]`` is
    the input at (c, oh·sh − ph + i·dh, ow·sw − pw + j·dw), zero bits in the padding."""
    N, C, H, W = x.shape
    cols = np.zeros((N, ho * wo, C * kh * kw), x.dtype)
    for nl in prange(N * ho):
        n = nl // ho
        oh = nl % ho
        for ow in range(wo):
            row = oh * wo + ow
            for c in range(C):
                for i in range(kh):
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j * dw
                        if 0 <= w < W:
                            cols[n, row, (c * kh + i) * kw + j] = x[n, c, h, w]
    return cols


@sized
@njit(parallel=True, cache=True)
def col2im(dcols, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo):
    """The adjoint of :func:`im2col`: dcols (N, ho·wo, C·kh·kw) float → dx (N, C, H, W), each
    input position summing its contributions sequentially in (oh, ow, i, j) row-major order."""
    N = dcols.shape[0]
    dx = np.zeros((N, C, H, W), dcols.dtype)
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(ho):
            for ow in range(wo):
                row = oh * wo + ow
                for i in range(kh):
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j * dw
                        if 0 <= w < W:
                            dx[n, c, h, w] += dcols[n, row, (c * kh + i) * kw + j]
    return dx


@sized
@njit(parallel=True, cache=True)
def max_pool2d(x, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo):
    """Max over each window (padding excluded; NaN propagates; ties keep the first in row-major
    order). x (N, C, H, W) float → (out (N, C, ho, wo), arg (N, C, ho, wo) int64 flat h·W + w)."""
    N, C, H, W = x.shape
    out = np.empty((N, C, ho, wo), x.dtype)
    arg = np.empty((N, C, ho, wo), np.int64)
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(ho):
            for ow in range(wo):
                best = x.dtype.type(-np.inf)
                at = -1
                for i in range(kh):
                    h = oh * sh - ph + i * dh
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j * dw
                        if w < 0 or w >= W:
                            continue
                        v = x[n, c, h, w]
                        if at < 0 or v > best or (v != v and best == best):
                            best = v
                            at = h * W + w
                out[n, c, oh, ow] = best
                arg[n, c, oh, ow] = at
    return out, arg


@sized
@njit(parallel=True, cache=True)
def max_pool2d_backward(g, arg, H, W):
    """dx[n, c].flat[arg] += g, outputs in row-major order (sequential per plane)."""
    N, C, ho, wo = g.shape
    dx = np.zeros((N, C, H * W), g.dtype)
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(ho):
            for ow in range(wo):
                dx[n, c, arg[n, c, oh, ow]] += g[n, c, oh, ow]
    return dx.reshape(N, C, H, W)


@njit(inline="always")
def _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw, include_pad):
    """PyTorch's avg_pool2d divisor: the window clipped to the padded input (include_pad) or to
    the input itself."""
    h0 = oh * sh - ph
    w0 = ow * sw - pw
    h1 = min(h0 + kh, H + ph)
    w1 = min(w0 + kw, W + pw)
    if include_pad:
        return (h1 - h0) * (w1 - w0)
    return (min(h1, H) - max(h0, 0)) * (min(w1, W) - max(w0, 0))


@sized
@njit(parallel=True, cache=True)
def avg_pool2d(x, kh, kw, sh, sw, ph, pw, ho, wo, include_pad):
    """Average over each window: sequential sum in row-major window order (work dtype), divided
    by the divisor (one IEEE division). x (N, C, H, W) → (N, C, ho, wo)."""
    N, C, H, W = x.shape
    out = np.empty((N, C, ho, wo), x.dtype)
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(ho):
            for ow in range(wo):
                s = x.dtype.type(0)
                for i in range(kh):
                    h = oh * sh - ph + i
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j
                        if 0 <= w < W:
                            s += x[n, c, h, w]
                out[n, c, oh, ow] = s / x.dtype.type(
                    _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw, include_pad))
    return out


@sized
@njit(parallel=True, cache=True)
def avg_pool2d_backward(g, H, W, kh, kw, sh, sw, ph, pw, include_pad):
    """dx += g / divisor over each window, outputs then offsets in row-major order."""
    N, C, ho, wo = g.shape
    dx = np.zeros((N, C, H, W), g.dtype)
    for nc in prange(N * C):
        n = nc // C
        c = nc % C
        for oh in range(ho):
            for ow in range(wo):
                v = g[n, c, oh, ow] / g.dtype.type(
                    _divisor(oh, ow, H, W, kh, kw, sh, sw, ph, pw, include_pad))
                for i in range(kh):
                    h = oh * sh - ph + i
                    if h < 0 or h >= H:
                        continue
                    for j in range(kw):
                        w = ow * sw - pw + j
                        if 0 <= w < W:
                            dx[n, c, h, w] += v
    return dx
