"""Float64 oracles of the composite ops of ``mpt.functional`` (used only by tests).

Each is the textbook formula in float64 numpy, written for clarity, not for bits: tests compare
mpt's fp64 mode against them to a few float64 ulps, and mpt's float32 results within the rounding
bounds derived in the tests. Gradients are checked by central differences of these functions.
"""
from __future__ import annotations

import numpy as np

__all__ = ["softmax", "log_softmax", "layer_norm", "rms_norm", "cross_entropy", "attention"]


def softmax(x, axis=-1):
    """exp(x − max) / Σ exp(x − max) along ``axis`` (float64)."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    """x − max − log Σ exp(x − max) along ``axis`` (float64)."""
    x = np.asarray(x, np.float64)
    z = x - x.max(axis=axis, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=axis, keepdims=True))


def layer_norm(x, n_dims, weight=None, bias=None, eps=1e-5):
    """(x − mean) / sqrt(var + eps) · w + b over the last ``n_dims`` axes (biased variance)."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(x.ndim - n_dims, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + eps)
    if weight is not None:
        y = y * np.asarray(weight, np.float64)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    return y


def rms_norm(x, n_dims, weight=None, eps=2.0**-23):
    """x / sqrt(mean(x²) + eps) · w over the last ``n_dims`` axes."""
    x = np.asarray(x, np.float64)
    axes = tuple(range(x.ndim - n_dims, x.ndim))
    y = x / np.sqrt((x * x).mean(axis=axes, keepdims=True) + eps)
    return y if weight is None else y * np.asarray(weight, np.float64)


def cross_entropy(logits, target, weight=None, ignore_index=-100, reduction="mean"):
    """−w_t·log softmax(x)_t per row of (N, C) logits; mean over the weights of kept rows."""
    logits = np.asarray(logits, np.float64)
    target = np.asarray(target)
    w = np.ones(logits.shape[1]) if weight is None else np.asarray(weight, np.float64)
    keep = target != ignore_index
    rows = np.flatnonzero(keep)
    lp = log_softmax(logits, axis=1)
    losses = np.zeros(len(target))
    losses[rows] = -lp[rows, target[rows]] * w[target[rows]]
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / w[target[rows]].sum()


def attention(q, k, v, mask=None, scale=None):
    """softmax(q·kᵀ·scale, masked) · v in float64; ``mask`` bool (True = attend); rows with no
    key give 0."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = np.einsum("...ld,...sd->...ls", q, k) * scale
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    empty = np.isneginf(s).all(axis=-1, keepdims=True)
    s = np.where(empty, 0.0, s)
    p = np.where(empty, 0.0, softmax(s, axis=-1))
    return np.einsum("...ls,...sd->...ld", p, v)
