"""L4: Intel Neural Compressor's FP8 scaling on Gaudi, and the Gaudi FP8 Linear as a GEMM plan.

**Scales** (documented: github intel/neural-compressor,
``neural_compressor/torch/algorithms/fp8_quant/_core/fp_utils.py`` and ``scale_methods/``): INC
quantizes x as ``round_fp8(x · (1/s))`` with s = maxabs / (fullscale · backoff), backoff 0.5 for
weights and 0.25 for activations, then rounds s — ``pow2`` (2^ceil(log2 s)), ``hw_aligned``
(pow2, then a power of 16 in [16^-2, 16] on Gaudi 2, a power of two in [2^-55, 2^7] on Gaudi 3:
the scales the MME applies as an exponent bias), ``unit`` (1) or ``identity``. One assumption:
``log2_rounding`` (:data:`LOG2_ROUNDINGS`), how ceil(log2 s) is evaluated.

**The plan** (:func:`inc_fp8_plan`, the recipes ``gaudi2-fp8`` / ``gaudi3-fp8``): the scaling
rule ``"inc"`` of :mod:`mpt.functional.gemm_plan` quantizes each tensor role per tensor from its
own maxabs (INC measures it in a calibration pass; a training step has none, so the tensor being
quantized is its own measurement, as INC's dynamic quantization does), with the role's backoff
(input: activation, weight: weight, output gradient: activation) and the scale method's rounding;
the GEMMs run on the chip's MME model with the scales as per-tensor dequantisation factors
(``mpt.gemm(..., scale_a=s_x, scale_b=s_w)``: D = fma(RN32(s_x·s_w), acc, -0), exact for powers
of two unless D over- or underflows). Casts saturate (``clip``, the converters' clip_fp).

INC quantizes inference only. For the backward pass mpt chooses, and says why:

* Gaudi 3: the output gradient in E5M2 (bias 15), as Transformer Engine's HYBRID recipe: the
  MME mixes E4M3 and E5M2 (the dgrad G·W is E5M2 × E4M3);
* Gaudi 2: the output gradient in E4M3 (bias 7, max 240) — Gaudi 2's MME takes one FP8 kind per
  GEMM, and the dgrad multiplies the gradient with the E4M3 weight;
* on both, the gradient's scale is ``maxabs_pow2`` (activation backoff), not ``maxabs_hw``:
  Gaudi 2's hardware-aligned scales stop at 2^-8, which would leave a gradient of maxabs 1e-6
  (2^-20) scaled below E4M3's smallest subnormal 2^-9 — every value flushed to zero.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from mpt.engines.gaudi import CHIPS, fp8_params
from mpt.formats import get_format
from mpt.functional.gemm_plan import GemmPlan, GemmSpec, Operand, Quantization, register_scaling
from mpt.rounding import decode as _decode
from mpt.rounding import round as _round

__all__ = ["INC_BACKOFFS", "INC_SCALE_METHODS", "LOG2_ROUNDINGS", "fullscale",
           "hw_aligned_scales", "round_scale", "scale_from_maxabs", "maxabs", "maxabs_hw",
           "maxabs_pow2", "unit_scale", "inc_quantize", "IncConfig", "inc_fp8_plan"]

_DEFAULT_BIAS = {"e4m3": 7, "e5m2": 15}


def _chip(chip) -> str:
    if chip not in CHIPS:
        raise ValueError(f"chip must be one of {', '.join(map(repr, CHIPS))}; got {chip!r}")
    return chip


#: INC's backoffs of MAXABS_HW / MAXABS_POW2 (scale_method_config.py): weights 0.5, activations
#: 0.25 (so the largest value lands at half / a quarter of the FP8 range).
INC_BACKOFFS = {"weight": 0.5, "activation": 0.25}
#: INC's scale methods (scale_method_config.py) for weights and activations:
#: (granularity "tensor" | "channel", rounding, backoff).
INC_SCALE_METHODS = {
    "unit_scale": {"weight": ("tensor", "unit", 1.0), "activation": ("tensor", "unit", 1.0)},
    "maxabs_hw": {"weight": ("tensor", "hw_aligned", 0.5),
                  "activation": ("tensor", "hw_aligned", 0.25)},
    "maxabs_pow2": {"weight": ("tensor", "pow2", 0.5), "activation": ("tensor", "pow2", 0.25)},
    "maxabs_arbitrary": {"weight": ("tensor", "identity", 0.5),
                         "activation": ("tensor", "identity", 0.25)},
    "act_maxabs_hw_weights_pcs_maxabs_pow2": {"weight": ("channel", "pow2", 0.5),
                                              "activation": ("tensor", "hw_aligned", 0.25)},
    "act_maxabs_pow2_weights_pcs_maxabs_pow2": {"weight": ("channel", "pow2", 0.5),
                                                "activation": ("tensor", "pow2", 0.25)},
    "act_maxabs_pcs_pow2_weight_maxabs_pts_pow2_hw": {"weight": ("tensor", "hw_aligned", 0.5),
                                                      "activation": ("channel", "pow2", 1.0)},
}
# INC's EXP_BIAS_SETS (fp_utils.py): the biases whose scales are "hardware aligned". Gaudi 3's
# is range(0, 63), which stops at 62 although the bias field reaches 63.
_INC_BIAS_SETS = {"gaudi2": {"e4m3": (3, 7, 11, 15), "e5m2": (15,)},
                  "gaudi3": {"e4m3": tuple(range(0, 63)), "e5m2": tuple(range(0, 63))}}
_INC_SCALE_STEP = {"gaudi2": 4, "gaudi3": 1}   # DEVICES_SCALE_FACTORS: powers of 16 / of 2
_F32 = np.float32


def fullscale(chip, kind="e4m3", bias=None) -> float:
    """INC's ``get_fullscale``: the FP8 range a scale maps maxabs onto.

    Gaudi 2 E4M3: 240 (INC takes torch's float8_e4m3fnuz max, equal to Gaudi 2's IEEE-like E4M3
    at bias 7); Gaudi 3 E4M3: 448 (float8_e4m3fn); E5M2: 57344. At another exponent bias b the
    range is multiplied by 2^(default bias - b).
    """
    _chip(chip)
    base = {("gaudi2", "e4m3"): 240.0, ("gaudi3", "e4m3"): 448.0}.get((chip, kind), 57344.0)
    if kind not in _DEFAULT_BIAS:
        raise ValueError(f"kind must be 'e4m3' or 'e5m2'; got {kind!r}")
    default = _DEFAULT_BIAS[kind]
    return base * 2.0 ** (default - (default if bias is None else bias))


def hw_aligned_scales(chip, kind="e4m3") -> tuple[float, ...]:
    """INC's ``get_fp8_hw_alligned_scales``: fullscale(bias)/fullscale(default) = 2^(7 - bias)
    over the chip's bias set -- Gaudi 2 E4M3: 16, 1, 1/16, 1/256 (powers of 16 in [16^-2, 16]);
    Gaudi 3: 2^7 down to 2^-55 (biases 0..62)."""
    return tuple(fullscale(chip, kind, b) / fullscale(chip, kind)
                 for b in _INC_BIAS_SETS[_chip(chip)][kind])


#: Assumption ``log2_rounding`` of the scale rounding: INC evaluates torch.log2 in its hp_dtype;
#: "exact" takes ceil(log2 s) of the float32 scale exactly, "float32" rounds log2(s) to the
#: nearest float32 first (torch.log2 on float32, taken as correctly rounded), which gives one
#: power of two less when s lies just above a power of two (s = 16·(1 + 2^-23): 16, not 32).
LOG2_ROUNDINGS = ("exact", "float32")


def _pow2_ceil(s: np.ndarray, log2_rounding: str) -> np.ndarray:
    """2^ceil(log2 s) of float32 s (INC's ScaleToPow2: torch.exp2(torch.ceil(torch.log2(s))));
    0 gives 0, inf inf, NaN NaN."""
    if log2_rounding not in LOG2_ROUNDINGS:
        raise ValueError(f"log2_rounding must be one of {LOG2_ROUNDINGS}; got {log2_rounding!r}")
    s64 = s.astype(np.float64)
    m, e = np.frexp(s64)
    e = np.where(m == 0.5, e - 1, e)                          # exact ceil(log2 s)
    if log2_rounding == "float32":
        with np.errstate(divide="ignore", invalid="ignore"):
            e = np.ceil(np.log2(s64).astype(_F32)).astype(np.float64)
    finite = np.isfinite(s) & (s > 0)
    with np.errstate(over="ignore"):
        p = np.ldexp(1.0, np.where(finite, e, 0).astype(np.int64)).astype(_F32)
    return np.where(finite, p, s).astype(_F32)


def round_scale(scale, *, chip, method, kind="e4m3", log2_rounding="exact"):
    """INC's scale rounding (round_scales_function.py) of float32 scales (a float32 scalar for
    a scalar, else an array).

    "identity": unchanged. "pow2": 2^ceil(log2 s). "unit": 1. "hw_aligned": pow2, then up to a
    power of 2^step (step 4 on Gaudi 2: powers of 16; 1 on Gaudi 3), clamped to
    [min, max] of :func:`hw_aligned_scales` (INC uses the E4M3 set for every FP8 kind): 0 gives
    the minimum, inf the maximum, NaN stays NaN. ``log2_rounding``: :data:`LOG2_ROUNDINGS`.
    """
    s = np.asarray(scale, dtype=_F32)
    if method not in ("identity", "unit", "pow2", "hw_aligned"):
        raise ValueError("method must be 'identity', 'pow2', 'hw_aligned' or 'unit'; "
                         f"got {method!r}")
    if method == "identity":
        out = s
    elif method == "unit":
        out = np.ones_like(s)
    else:
        out = _pow2_ceil(s, log2_rounding)
    if method == "hw_aligned":
        step = _INC_SCALE_STEP[_chip(chip)]
        allowed = hw_aligned_scales(chip, "e4m3")
        finite = np.isfinite(out) & (out > 0)
        e = np.frexp(np.where(finite, out, 1).astype(np.float64))[1] - 1   # log2 of the power
        aligned = np.where(finite, np.ldexp(1.0, -(-e // step) * step), out)  # 2^(⌈e/step⌉·step)
        out = np.clip(aligned, min(allowed), max(allowed))
    return np.asarray(out, _F32)[()]


def maxabs(x, axis=None) -> np.ndarray:
    """max|x| in float32: of the tensor (axis None), or per channel along ``axis`` (the max over
    every other axis, shape (x.shape[axis],)). NaN propagates."""
    x = np.asarray(x)
    x = _decode(x) if x.dtype not in (np.float32, np.float64) else x.astype(_F32)
    a = np.abs(x)
    if axis is None:
        return _F32(a.max()) if a.size else _F32(0)
    axis = axis % x.ndim
    return np.moveaxis(a, axis, 0).reshape(x.shape[axis], -1).max(axis=1).astype(_F32)


def scale_from_maxabs(amax, *, chip, method="identity", backoff=1.0, kind="e4m3",
                      log2_rounding="exact"):
    """INC's ``calc_maxabs_scale`` then the rounding: s = f32(maxabs / f32(fullscale·backoff)),
    rounded by :func:`round_scale`. x quantizes as round_fp8(x / s) and dequantizes as q·s."""
    denom = _F32(fullscale(chip, kind) * backoff)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        s = np.asarray(amax, dtype=_F32) / denom
    return round_scale(s, chip=chip, method=method, kind=kind, log2_rounding=log2_rounding)


def _role(role):
    if role not in INC_BACKOFFS:
        raise ValueError(f"role must be 'weight' or 'activation'; got {role!r}")
    return INC_BACKOFFS[role]


def maxabs_hw(x, *, chip, role, axis=None, kind="e4m3", log2_rounding="exact"):
    """INC's MAXABS_HW scale (float32): maxabs/(fullscale·backoff), backoff 0.5 (weights) or 0.25
    (activations), rounded up to a power of two and then into the chip's hardware-aligned set
    (:func:`round_scale` "hw_aligned"). Per tensor; ``axis`` gives the per-channel variant."""
    return scale_from_maxabs(maxabs(x, axis), chip=chip, method="hw_aligned",
                             backoff=_role(role), kind=kind, log2_rounding=log2_rounding)


def maxabs_pow2(x, *, chip, role, axis=None, kind="e4m3", log2_rounding="exact"):
    """INC's MAXABS_POW2 scale (float32): as :func:`maxabs_hw` without the hardware alignment
    (scale_method_config.py; the PCS variants use ``axis``)."""
    return scale_from_maxabs(maxabs(x, axis), chip=chip, method="pow2", backoff=_role(role),
                             kind=kind, log2_rounding=log2_rounding)


def unit_scale(x, *, axis=None):
    """INC's UNIT_SCALE: 1.0 per tensor, or per channel along ``axis`` (float32)."""
    x = np.asarray(x)
    return _F32(1) if axis is None else np.ones(x.shape[axis % x.ndim], _F32)


# ---- quantization, the scaling rule and the plan ----------------------------------------------

#: Per-tensor scale methods a plan can use (the per-channel ones need per-column dequantisation,
#: which mpt.gemm's per-tensor scales do not express).
_PER_TENSOR = tuple(m for m, roles in INC_SCALE_METHODS.items()
                    if all(g == "tensor" for g, _, _ in roles.values()))


def inc_quantize(values, fmt, *, chip, method="maxabs_hw", role="activation",
                 log2_rounding="exact", clip=True):
    """(q, s): ``values`` (float32) quantized per tensor as INC does with ``method``: s from the
    tensor's own maxabs (:func:`scale_from_maxabs` with the role's backoff, the FP8 kind's
    fullscale), q = round_fmt(f32(x · f32(1/s))) to nearest even, saturating when ``clip``.
    ``fmt``: the FP8 format (a Gaudi FP8 format or ``fp8_e4m3fn``/``fp8_e5m2``). Returns q in
    fmt's storage dtype and s as a float32 scalar (the dequantisation factor: x ≈ q·s)."""
    if method not in _PER_TENSOR:
        raise ValueError(f"method must be a per-tensor INC scale method "
                         f"({', '.join(_PER_TENSOR)}); got {method!r}")
    _, rounding, backoff = INC_SCALE_METHODS[method][_role_key(role)]
    kind = fp8_params(fmt)[0]
    x = np.asarray(values, np.float32)
    s = scale_from_maxabs(maxabs(x), chip=chip, method=rounding, backoff=backoff, kind=kind,
                          log2_rounding=log2_rounding)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        q = _round(x * (_F32(1) / s), fmt, saturate=clip)
    return q, _F32(s)


def _role_key(role):
    if role not in INC_BACKOFFS:
        raise ValueError(f"role must be 'weight' or 'activation'; got {role!r}")
    return role


def _inc_rule(stored, values, q, state, axis):
    """The scaling rule ``"inc"``: :func:`inc_quantize` with the quantization's ``params``."""
    if q.rounding != "nearest_even":
        raise ValueError(f"the INC scaling rule rounds to nearest even; got {q.rounding!r}")
    data, s = inc_quantize(values(), q.format, **dict(q.params))
    return Operand(data, get_format(q.format), s)


register_scaling("inc", _inc_rule)


@dataclass(frozen=True)
class IncConfig:
    """The FP8 Linear layers of a Gaudi recipe (module docstring).

    ``method``: INC's scale method of input and weight (per tensor: :data:`INC_SCALE_METHODS`);
    ``grad_method``: the output gradient's (mpt's choice, ``maxabs_pow2``); ``log2_rounding``:
    :data:`LOG2_ROUNDINGS`; ``clip``: saturating casts. ``chip``, ``model`` and ``formats``
    (forward, backward) come from the recipe's target when None.
    """

    method: str = "maxabs_hw"
    grad_method: str = "maxabs_pow2"
    log2_rounding: str = "exact"
    clip: bool = True
    chip: str | None = None
    model: str | None = None
    formats: tuple[str, str] | None = None

    def __post_init__(self):
        for name in ("method", "grad_method"):
            if getattr(self, name) not in _PER_TENSOR:
                raise ValueError(f"{name} must be one of {', '.join(_PER_TENSOR)}; got "
                                 f"{getattr(self, name)!r}")
        if self.log2_rounding not in LOG2_ROUNDINGS:
            raise ValueError(f"log2_rounding must be one of {LOG2_ROUNDINGS}; got "
                             f"{self.log2_rounding!r}")
        if self.chip is not None:
            _chip(self.chip)
        if self.formats is not None:
            object.__setattr__(self, "formats", tuple(get_format(f).name for f in self.formats))

    def plan(self) -> GemmPlan:
        """The GEMM plan (:func:`inc_fp8_plan`); chip, model and formats must be set."""
        if None in (self.chip, self.model, self.formats):
            raise ValueError("IncConfig.plan needs chip, model and formats (a recipe fills them "
                             "from its target)")
        return inc_fp8_plan(self.chip, self.model, self.formats, self.method, self.grad_method,
                            self.log2_rounding, self.clip)

    def describe(self) -> dict:
        return dataclasses.asdict(self)


def inc_fp8_plan(chip, model, formats, method="maxabs_hw", grad_method="maxabs_pow2",
                 log2_rounding="exact", clip=True) -> GemmPlan:
    """A Linear's GEMMs as a Gaudi FP8 recipe runs them: input and weight in ``formats[0]``,
    the output gradient in ``formats[1]``, each quantized per tensor by the rule ``"inc"``
    (roles: activation, weight, activation); fprop, dgrad and wgrad on ``model`` (the chip's
    MME), FP32 output."""
    def quantization(fmt, role, how):
        return Quantization(fmt, "inc", params=(("chip", chip), ("method", how), ("role", role),
                                                ("log2_rounding", log2_rounding), ("clip", clip)))
    fwd, bwd = formats
    spec = GemmSpec(model)
    return GemmPlan(f"inc {method} {fwd}/{bwd} ({model})",
                    quantization(fwd, "activation", method), quantization(fwd, "weight", method),
                    quantization(bwd, "activation", grad_method), spec, spec, spec)
