"""L4: reproducible initialisation — every random value a function of ``(seed, key, index)``.

``key`` is the parameter's dotted name under the module that initialised it. The words come from
mpt's counter-based Philox4x32-10 stream (``mpt.kernels.random``, stream id = first 8 bytes of
BLAKE2b of the key); uniforms take 53 bits; normals use Marsaglia's polar method with a logarithm
written in IEEE ``+ - * /`` only (:func:`_log`), so the float64 samples do not depend on the
platform's libm or numpy's SIMD paths, and they are rounded once (RNE) to the parameter's
format. Same seed → same bits on every machine, every run, any thread count. Default rules
follow PyTorch (Linear/Conv2d uniform ``±1/sqrt(fan_in)``, Embedding normal(0, 1), norms 1 and
0); the GPT uses GPT-2's (``mpt.models.gpt``).
"""
from __future__ import annotations

import hashlib

import numpy as np

from mpt._checks import check_int, check_real
from mpt.autograd.tensor import Tensor
from mpt.kernels.random import random_words

__all__ = ["gaussian", "uniform", "init_normal_", "init_uniform_", "init_constant_"]


_LN2_HI = float.fromhex("0x1.62e42feep-1")           # ln 2, high 32 bits: e * _LN2_HI is exact
_LN2_LO = float.fromhex("0x1.a39ef35793c76p-33")     # ln 2 - _LN2_HI
_SQRT_HALF = float.fromhex("0x1.6a09e667f3bcdp-1")
_ATANH_TERMS = tuple(1.0 / (2 * k + 1) for k in range(11))  # 1/1, 1/3, ..., 1/21


def _log(x: np.ndarray) -> np.ndarray:
    """Natural log of positive float64 ``x`` from IEEE ``+ - * /`` only (platform-independent).

    ``x = m 2^e`` with ``m`` in ``[√½, √2)`` (``frexp``, exact); ``ln m = 2 atanh(f)``,
    ``f = (m-1)/(m+1)``, ``|f| <= 0.1716``: the series ``2f Σ f^2k/(2k+1)`` truncated after 11
    terms leaves ``< 0.0295^11/23 < 2^-59``. Error a few float64 ulps (checked against
    ``math.log`` in ``tests/test_nn.py``).
    """
    m, e = np.frexp(x)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = (e - low).astype(np.float64)
    f = (m - 1.0) / (m + 1.0)
    z = f * f
    p = np.full_like(z, _ATANH_TERMS[-1])
    for c in _ATANH_TERMS[-2::-1]:
        p = p * z + c
    return e * _LN2_HI + (e * _LN2_LO + 2.0 * f * p)


def _stream(key: str) -> int:
    """The Philox stream id of a parameter key (64 bits of BLAKE2b: stable across runs)."""
    if not isinstance(key, str):
        raise TypeError(f"key must be a str (a parameter's dotted name); got {type(key).__name__}")
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")


def uniform(seed: int, key: str, n: int) -> np.ndarray:
    """``n`` float64 uniforms in ``[0, 1)``: value ``i`` is ``(w[2i] 2^21 + w[2i+1] >> 11) 2^-53``
    for the Philox words ``w`` of stream ``(seed, key)`` (53 random bits, exact)."""
    n = check_int("n", n, min=0)
    w = random_words(seed, _stream(key), 2 * n).astype(np.uint64)  # (2n,)
    bits = (w[0::2] << np.uint64(21)) | (w[1::2] >> np.uint64(11))  # (n,) 53-bit integers
    return bits.astype(np.float64) * 2.0**-53


def gaussian(seed: int, key: str, n: int) -> np.ndarray:
    """``n`` float64 standard normals of stream ``(seed, key)`` (Marsaglia's polar method).

    Pairs ``u, v = 2U - 1`` (exact) with ``s = u² + v²`` in ``(0, 1)`` are accepted in stream
    order; each gives ``u k, v k`` with ``k = sqrt(-2 ln s / s)``. The first ``n`` values do not
    depend on ``n`` (a longer draw extends a shorter one).
    """
    n = check_int("n", n, min=0)
    pairs = (n + 1) // 2
    draw = pairs * 4 // 3 + 64  # acceptance is π/4 ≈ 0.785
    while True:
        u = 2.0 * uniform(seed, key, 2 * draw) - 1.0  # (2 draw,)
        u, v = u[0::2], u[1::2]
        s = u * u + v * v
        ok = (s > 0.0) & (s < 1.0)
        if np.count_nonzero(ok) >= pairs:
            break
        draw *= 2
    u, v, s = u[ok][:pairs], v[ok][:pairs], s[ok][:pairs]
    k = np.sqrt(-2.0 * _log(s) / s)
    return np.stack([u * k, v * k], axis=1).reshape(-1)[:n]


def init_normal_(param: Tensor, std: float, *, seed: int, key: str, mean: float = 0.0) -> Tensor:
    """Fill ``param`` with ``mean + std·gaussian(seed, key)`` (float64), rounded RNE to its
    format."""
    std = check_real("std", std, min=0)
    values = check_real("mean", mean) + std * gaussian(seed, key, param.size)
    param.copy_(values.reshape(param.shape))
    return param


def init_uniform_(param: Tensor, bound: float, *, seed: int, key: str) -> Tensor:
    """Fill ``param`` with ``bound·(2U - 1)``, uniform in ``[-bound, bound)`` (float64), rounded
    RNE to its format."""
    values = check_real("bound", bound, min=0) * (2.0 * uniform(seed, key, param.size) - 1.0)
    param.copy_(values.reshape(param.shape))
    return param


def init_constant_(param: Tensor, value: float) -> Tensor:
    """Fill ``param`` with ``value`` rounded RNE to its format."""
    param.copy_(np.full(param.shape, value, np.float64))
    return param

