"""L5: computing probes with mpt's own models — one configuration, as a device would run it.

Every configuration of a registered model is computed the way the adapter protocol describes
(a, b, c in; one d per row out), whatever its kind:

* a plain instruction: ``mpt.mma`` with the configuration's variant;
* a block-scaled instruction (``MMAModel.scaled``: Blackwell's kind::mxf8f6f4 / mxf4 / mxf4nvf4,
  CDNA4's ``v_mfma_scale``): ``mpt.mma`` with **unit scales** — E8M0 code 127 (2^0) or UE4M3
  1.0, in the first (scale format, block) the instruction lists — so that the elements are
  multiplied as they are; K must be a multiple of that block (:func:`instruction_k`);
* a software configuration (``params`` ``("software", True)``: XLA's f32 dot on a TPU,
  Trainium's auto-cast): ``mpt.gemm``, the library composition a user's framework call runs.

:func:`run_model` runs a whole probe set and keeps the result of a model on a battery
(:attr:`ProbeSet.key`) for the rest of the process: the battery is fixed by its arguments and a
model is immutable data, so the same bits come back (the matching step runs every registered
model on every battery; the tests characterize every preset).
"""
from __future__ import annotations

import functools

import numpy as np

from mpt.characterize.battery import build_battery
from mpt.characterize.probes import ProbeSet, bits_of
from mpt.engines import gemm, get_mma_model, mma
from mpt.engines.blockscaled import SCALE_FORMATS
from mpt.formats import get_format

__all__ = ["compute", "run_model", "run_cached", "instruction_k", "how", "unit_scale_spec"]


def unit_scale_spec(model, cfg) -> tuple[str, int] | None:
    """(scale format, block) of the unit scales a block-scaled configuration is probed with
    (the first it lists; AMD's ``scale_block``: UE8M0), or None for an unscaled one."""
    model = get_mma_model(model)
    if not model.scaled(cfg):
        return None
    scales = cfg.param("scales")
    return tuple(scales[0]) if scales else ("ue8m0", int(cfg.param("scale_block")))


def instruction_k(model, cfg) -> int:
    """The multiple of K a configuration needs from a probe: the block of the unit scales
    (one code per block of k), else 1 (``mpt.mma`` pads or chains any K)."""
    spec = unit_scale_spec(model, cfg)
    return spec[1] if spec else 1


def how(model, cfg) -> str:
    """How a configuration is computed, for the report ('' for a plain instruction)."""
    model = get_mma_model(model)
    spec = unit_scale_spec(model, cfg)
    if spec:
        return f"block-scaled: probed with unit scales ({spec[0].upper()} 1.0 per {spec[1]} k)"
    if cfg.param("software"):
        return "software around the instructions: probed through mpt.gemm"
    return ""


def compute(model, a, b, c, in_format: str, out_format: str, variant: str | None = None,
            options: dict | None = None) -> np.ndarray:
    """d (P,) of one probe per row: a, b (P, K) of ``in_format``'s storage dtype, c (P,) of
    ``out_format``'s, computed by ``model``'s configuration for ``in_format`` and ``variant``
    (module docstring). ValueError/TypeError from mpt when it cannot run them."""
    model = get_mma_model(model)
    cfg = model.config(in_format, in_format, variant)
    options = dict(options or {})
    a3, b3, c3 = a[:, None, :], b[:, :, None], c[:, None, None]          # (P,1,K) (P,K,1) (P,1,1)
    kw = {"model": model, "in_format": in_format, "variant": cfg.variant}
    if cfg.param("software"):
        d = gemm(a3, b3, c3, **kw, **options)
    else:
        spec = unit_scale_spec(model, cfg)
        if spec is not None:
            options["scale_a"], options["scale_b"] = _unit_scales(spec, a.shape)
        d = mma(a3, b3, c3, out_format=out_format, **kw, **options)
    return np.asarray(d).reshape(-1)


def _unit_scales(spec, shape):
    """(scale_a (P, 1, G), scale_b (P, G, 1)) of unit codes, G = ceil(K / block)."""
    fmt, block = spec
    p, k = shape
    groups = -(-k // block)
    one = np.ones((), np.float32).astype(get_format(SCALE_FORMATS[fmt]).dtype)
    return np.full((p, 1, groups), one), np.full((p, groups, 1), one)


def run_model(model, ps: ProbeSet, variant: str | None = None) -> np.ndarray:
    """The (P,) result bits of ``model`` on every probe of ``ps`` (one :func:`compute` per row
    length). Raises what mpt raises when the configuration cannot run them."""
    out = np.zeros(len(ps), np.dtype(f"u{get_format(ps.out_format).dtype.itemsize}"))
    for k, rows in ps.groups():
        d = compute(model, ps.a[rows, :k], ps.b[rows, :k], ps.c[rows], ps.in_format,
                    ps.out_format, variant)
        out[rows] = bits_of(d.astype(get_format(ps.out_format).dtype, copy=False),
                            ps.out_format)
    return out


def run_cached(model, ps: ProbeSet, variant: str | None = None):
    """(bits, "") of :func:`run_model`, or (None, why) when the model cannot run the probes;
    kept for the process when ``ps`` is a whole battery (``ps.key``)."""
    model = get_mma_model(model)
    if ps.key is None:
        return _outcome(model, ps, variant)
    return _battery_outcome(model, variant, ps.key)


@functools.lru_cache(maxsize=4096)
def _battery_outcome(model, variant, key):
    fin, fout, k_multiple, seed = key
    bits, error = _outcome(model, build_battery(fin, fout, k_multiple=k_multiple, seed=seed),
                           variant)
    if bits is not None:
        bits.flags.writeable = False
    return bits, error


def _outcome(model, ps, variant):
    try:
        return run_model(model, ps, variant), ""
    except (ValueError, TypeError, NotImplementedError) as exc:
        return None, str(exc)
