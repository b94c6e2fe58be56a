"""L4: loss scaling — one protocol (:class:`LossScaler`), PyTorch's ``GradScaler`` (dynamic) and
``StaticLossScale``.

Like jmp's NoOp/Static/Dynamic loss scales, the scalers share one protocol and differ only in
their rule for the next scale: :class:`LossScaler` runs the loop (scale, unscale with the inf
check, skipped steps, records, state) and asks its subclass for ``_next(scale, tracker,
found_inf)``. ``GradScaler(enabled=False)`` is the no-op scaler, as in PyTorch.

``GradScaler`` reproduces ``torch.amp.GradScaler`` (docs/amp.md §1) with its defaults
(``init_scale=2**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000``):

* state: the scale is a float32, created by the first :meth:`GradScaler.scale`; the growth
  tracker an int32;
* ``scale(loss)``: ``loss · scale`` (an fp16/bf16 loss is first cast to fp32, as PyTorch's type
  promotion with the float32 scale tensor does);
* ``unscale_(optimizer)``: ``inv = f32(1 / f64(scale))``; every gradient element that is
  non-finite (before unscaling) sets ``found_inf``; then ``g ← g·inv`` in float32 (skipped when
  ``inv == 1``), stored back RNE in the gradient's format. FP16 gradients raise
  ``ValueError("Attempting to unscale FP16 gradients.")``;
* ``step(optimizer)``: unscale if not done, skip ``optimizer.step()`` if any ``found_inf``.
  Optimizers with ``supports_amp_scaling`` (master weights or fused, see ``mpt.optim``) get a
  read-only inf/NaN scan and then ``optimizer.step(inv_scale=inv)``, which unscales on the fly
  (so fp16 model gradients are fine there, as with PyTorch's fused optimizers);
* ``update()``: on overflow ``scale = f32(f64(scale)·backoff)``, tracker 0; else the tracker counts
  clean steps and on reaching ``growth_interval`` ``scale = f32(f64(scale)·growth)`` if finite,
  tracker 0. Several optimizers share the scale: their found_infs are summed.
* misuse raises as PyTorch does: ``unscale_`` twice before ``update``, ``unscale_`` after
  ``step``, ``step`` twice → ``RuntimeError``; ``unscale_``/``step``/``update`` before any
  ``scale()`` and ``update()`` with no inf check recorded → :class:`ScalerUsageError` (an
  ``AssertionError`` like PyTorch's, and a ``RuntimeError``).

Opt-in extras that leave the default bits alone: ``min_scale`` (floor after a backoff),
``max_scale`` (cap on growth) and ``record=True``, which appends a :class:`ScaleRecord` per
``update()`` to ``scaler.records`` (scale used, summed found_inf, skipped, name of the first
gradient that overflowed — names come from the optimizer's named parameters, see
``mpt.optim.Optimizer``). Oracle: ``mpt.reference.grad_scaler_reference``, and
``torch.amp.GradScaler`` when torch is installed (tests/test_amp.py).
"""
from __future__ import annotations

import enum
from dataclasses import asdict, dataclass

import numpy as np

import mpt.functional  # noqa: F401  (registers the Tensor operators used by scale())
from mpt._checks import check_bool, check_int, check_real
from mpt.autograd.tensor import Tensor, opmath, round_to
from mpt.formats import get_format

__all__ = ["LossScaler", "GradScaler", "StaticLossScale", "ScaleRecord", "ScalerUsageError",
           "non_finite"]

_F32 = np.float32
_FP32 = get_format("fp32")


class ScalerUsageError(RuntimeError, AssertionError):
    """A GradScaler method called out of order where PyTorch raises ``AssertionError``."""


class _Stage(enum.Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


@dataclass(frozen=True)
class ScaleRecord:
    """One iteration of a recording scaler: the ``scale`` the loss was multiplied by,
    ``found_inf`` (how many gradient tensors held Inf/NaN, over all its optimizers; PyTorch keeps
    only "> 0"), whether a step was ``skipped``, the name of the first gradient with a
    non-finite value (``None`` if none), and the scale and tracker after the update."""

    step: int
    scale: float
    found_inf: int
    skipped: bool
    first_overflow: str | None
    new_scale: float
    growth_tracker: int


def _named_grads(optimizer):
    """(name, grad Tensor) of every parameter with a gradient, in the optimizer's order."""
    if hasattr(optimizer, "named_parameters"):
        named = optimizer.named_parameters()
    else:
        named = ((f"group{i}.param{j}", p) for i, g in enumerate(optimizer.param_groups)
                 for j, p in enumerate(g["params"]))
    return [(name, p.grad) for name, p in named if p.grad is not None]


def _check_float32_scale(name: str, value: float) -> np.float32:
    """``f32(value)``, which must be finite and non-zero (the scale is kept as a float32)."""
    with np.errstate(over="ignore"):
        scale = _F32(value)
    if not 0 < scale < np.inf:
        raise ValueError(f"{name} must round to a finite non-zero float32; got {value!r}")
    return scale


def _checked_settings(init_scale, growth_factor, backoff_factor, growth_interval, min_scale,
                      max_scale, *, in_state_dict: bool = False) -> dict:
    """The scaler's settings as Python numbers, checked: every scale a finite float > 0 that
    stays finite and non-zero in float32 (the scale is a float32), ``growth_factor`` > 1,
    ``backoff_factor`` in (0, 1), ``growth_interval`` a positive int32, ``min_scale <=
    max_scale``. ``in_state_dict``: name the fields as :meth:`GradScaler.state_dict` keys."""
    def label(name):
        key = "scale" if name == "init_scale" else name
        return f"state_dict[{key!r}]" if in_state_dict else name

    out = dict(growth_factor=check_real(label("growth_factor"), growth_factor, gt=1),
               backoff_factor=check_real(label("backoff_factor"), backoff_factor, gt=0, lt=1),
               growth_interval=check_int(label("growth_interval"), growth_interval, min=1,
                                         max=2**31 - 1))
    for name, value in (("init_scale", init_scale), ("min_scale", min_scale),
                        ("max_scale", max_scale)):
        value = check_real(label(name), value, gt=0, optional=name != "init_scale")
        if value is not None:
            _check_float32_scale(label(name), value)
        out[name] = value
    low, high = out["min_scale"], out["max_scale"]
    if low is not None and high is not None and low > high:
        raise ValueError(f"{label('min_scale')} {low!r} exceeds {label('max_scale')} {high!r}")
    return out


def non_finite(named) -> tuple[int, str | None]:
    """(how many of the ``(name, Tensor or array or None)`` pairs hold an Inf or NaN, the name of
    the first of them), read-only: the scaler's inf check, and ``mpt.train.diagnostics``'."""
    count, first = 0, None
    for name, x in named:
        if x is not None and not np.isfinite(opmath(np.asarray(getattr(x, "data", x)))).all():
            count += 1
            first = name if first is None else first
    return count, first


class LossScaler:
    """The loss-scaling loop every scaler shares (module docstring); a subclass gives the rule
    ``_next(scale, tracker, found_inf) -> (scale, tracker)`` and its own settings
    (``_settings``/``_load_settings``)."""

    def __init__(self, init_scale, enabled=True, *, record=False):
        self._enabled = check_bool("enabled", enabled)
        self._init_scale = init_scale
        self._scale: np.float32 | None = None
        self._growth_tracker = np.int32(0)
        self._per_optimizer: dict = {}
        self._updates = 0
        self.records: list[ScaleRecord] | None = [] if check_bool("record", record) else None

    # ---- queries ---------------------------------------------------------------------------
    def is_enabled(self) -> bool:
        return self._enabled

    def get_scale(self) -> float:
        """The current scale (the init scale before the first ``scale()``; 1.0 if disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale)

    def get_growth_tracker(self) -> int:
        return int(self._growth_tracker)

    def inv_scale(self) -> np.float32:
        """``f32(1 / f64(scale))``: the factor ``unscale_`` multiplies gradients by (Inf once a
        collapsing scale reaches 0 or its reciprocal overflows float32, as in PyTorch)."""
        scale = np.float64(self._require_scale("inv_scale"))
        with np.errstate(divide="ignore", over="ignore"):
            return _F32(np.float64(1.0) / scale)

    # ---- the loop --------------------------------------------------------------------------
    def scale(self, outputs):
        """``outputs · scale`` for a Tensor or a (nested) list/tuple of Tensors."""
        if not self._enabled:
            return outputs
        if self._scale is None:
            self._scale = _F32(self._init_scale)
        return self._scale_outputs(outputs)

    def _scale_outputs(self, outputs):
        if isinstance(outputs, Tensor):
            if outputs.format.name not in ("fp32", "fp64"):
                outputs = outputs.to(_FP32)       # PyTorch promotes to the float32 scale's dtype
            return outputs * Tensor(np.array(self._scale, dtype=outputs.dtype), outputs.format)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self._scale_outputs(o) for o in outputs)
        raise TypeError(f"outputs must be a Tensor or a list/tuple of Tensors; got "
                        f"{type(outputs).__name__}")

    def unscale_(self, optimizer) -> None:
        """Multiply every gradient of ``optimizer`` by ``inv_scale()`` in place, recording
        whether any held Inf/NaN (see the module docstring)."""
        if not self._enabled:
            return
        self._require_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the "
                               "last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        named = _named_grads(optimizer)
        for _, g in named:
            if g.format.name == "fp16":
                raise ValueError("Attempting to unscale FP16 gradients.")
        state["found_inf"], state["first"] = non_finite(named)
        inv = self.inv_scale()
        if inv != 1:
            with np.errstate(over="ignore", invalid="ignore"):
                for _, g in named:
                    if g.format.name == "fp32":
                        g.data *= inv
                    else:
                        g.data[...] = round_to(opmath(g.data) * inv, g.format)
                    if hasattr(g, "bump_version"):
                        g.bump_version()
        state["stage"] = _Stage.UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscale (if not done) and run ``optimizer.step()`` unless a gradient was non-finite;
        returns what the step returned (None when skipped)."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._require_scale("step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY and getattr(optimizer, "supports_amp_scaling", False):
            state["found_inf"], state["first"] = non_finite(_named_grads(optimizer))
            kwargs = {**kwargs, "inv_scale": self.inv_scale()}
        elif state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return result

    def update(self, new_scale=None) -> None:
        """Apply the growth/backoff rule (or set ``new_scale``) and reset the per-step state."""
        if not self._enabled:
            return
        scale = self._require_scale("update")
        checked = [s for s in self._per_optimizer.values() if s["stage"] is not _Stage.READY]
        found = sum(s["found_inf"] for s in checked)
        first = next((s["first"] for s in checked if s["first"] is not None), None)
        if new_scale is not None:
            new_scale = check_real("new_scale", new_scale, gt=0)
            self._scale = _check_float32_scale("new_scale", new_scale)
        else:
            if not checked:
                raise ScalerUsageError("No inf checks were recorded prior to update.")
            self._scale, tracker = self._next(scale, int(self._growth_tracker), found)
            self._growth_tracker = np.int32(tracker)
        self._updates += 1
        if self.records is not None:
            self.records.append(ScaleRecord(self._updates, float(scale), int(found), found > 0,
                                            first, float(self._scale), int(self._growth_tracker)))
        self._per_optimizer = {}

    def _next(self, scale, tracker, found_inf):
        raise NotImplementedError

    def _state(self, optimizer) -> dict:
        return self._per_optimizer.setdefault(
            id(optimizer), {"stage": _Stage.READY, "found_inf": 0, "first": None})

    def _require_scale(self, name):
        if self._scale is None:
            raise ScalerUsageError(
                f"Attempted {name} but _scale is None.  This may indicate your script did not use "
                "scaler.scale(loss or outputs) earlier in the iteration.")
        return self._scale

    # ---- state -----------------------------------------------------------------------------
    def _settings(self) -> dict:
        """The subclass's settings, as :meth:`state_dict` saves them."""
        return {}

    def state_dict(self) -> dict:
        """Plain scalars (PyTorch's keys: ``scale``, ``_growth_tracker`` and the subclass's
        settings), plus the records as dicts when recording; empty when disabled."""
        if not self._enabled:
            return {}
        out = {"scale": self.get_scale(), **self._settings(),
               "_growth_tracker": self.get_growth_tracker()}
        if self.records is not None:
            out["records"] = [asdict(r) for r in self.records]
            out["updates"] = self._updates
        return out

    def _check_settings(self, state_dict: dict) -> dict:
        """The settings of ``state_dict`` checked (``init_scale`` at least); ValueError/TypeError
        naming the field."""
        value = check_real("state_dict['scale']", state_dict["scale"], gt=0)
        _check_float32_scale("state_dict['scale']", value)
        return {"init_scale": value, "growth_interval": 1}

    def _load_settings(self, settings: dict) -> None:
        self._init_scale = settings["init_scale"]

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore what :meth:`state_dict` saved. Every field is checked first (presence, type and
        the constructor's ranges; ``_growth_tracker`` in [0, growth_interval)); nothing changes
        unless all pass (``ValueError``/``TypeError`` naming the field)."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"state_dict must be a dict; got {type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               f"from a disabled instance of {type(self).__name__}.")
        missing = [k for k in ("scale", *self._settings(), "_growth_tracker")
                   if k not in state_dict and k not in ("min_scale", "max_scale")]
        if missing:
            raise ValueError(f"state_dict lacks {', '.join(map(repr, missing))}")
        settings = self._check_settings(state_dict)
        tracker = check_int("state_dict['_growth_tracker']", state_dict["_growth_tracker"],
                            min=0, max=settings["growth_interval"] - 1)
        updates = check_int("state_dict['updates']", state_dict.get("updates", 0), min=0)
        records = None
        if "records" in state_dict:
            try:
                records = [ScaleRecord(**r) for r in state_dict["records"]]
            except TypeError as exc:
                raise ValueError(f"state_dict['records'] must be ScaleRecord dicts: {exc}") \
                    from None
        self._load_settings(settings)
        if self._scale is not None:
            self._scale = _F32(self._init_scale)
        self._growth_tracker = np.int32(tracker)
        self._updates = updates
        if records is not None:
            self.records = records


class GradScaler(LossScaler):
    """Dynamic loss scaling with PyTorch's exact semantics (see the module docstring)."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, enabled=True, *, min_scale=None, max_scale=None,
                 record=False):
        settings = _checked_settings(init_scale, growth_factor, backoff_factor, growth_interval,
                                     min_scale, max_scale)
        super().__init__(settings["init_scale"], enabled, record=record)
        self._load_settings(settings)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def _next(self, scale, tracker, found_inf):
        """PyTorch's update rule on (float32 scale, tracker), plus the opt-in floor and cap."""
        if found_inf:
            new = _F32(float(scale) * self._backoff_factor)
            if self._min_scale is not None:
                new = max(new, _F32(self._min_scale))
            return new, 0
        tracker += 1
        if tracker == self._growth_interval:
            with np.errstate(over="ignore"):                       # Inf is refused below
                grown = _F32(float(scale) * self._growth_factor)
            if np.isfinite(grown):
                scale = grown if self._max_scale is None else min(grown, _F32(self._max_scale))
            tracker = 0
        return scale, tracker

    def _settings(self) -> dict:
        out = {"growth_factor": self._growth_factor, "backoff_factor": self._backoff_factor,
               "growth_interval": self._growth_interval}
        for key in ("min_scale", "max_scale"):
            if getattr(self, "_" + key) is not None:
                out[key] = float(getattr(self, "_" + key))
        return out

    def _check_settings(self, state_dict: dict) -> dict:
        return _checked_settings(state_dict["scale"], state_dict["growth_factor"],
                                 state_dict["backoff_factor"], state_dict["growth_interval"],
                                 state_dict.get("min_scale"), state_dict.get("max_scale"),
                                 in_state_dict=True)

    def _load_settings(self, settings: dict) -> None:
        self._init_scale = settings["init_scale"]
        self._growth_factor = settings["growth_factor"]
        self._backoff_factor = settings["backoff_factor"]
        self._growth_interval = settings["growth_interval"]
        self._min_scale = settings["min_scale"]
        self._max_scale = settings["max_scale"]


class StaticLossScale(LossScaler):
    """A constant loss scale ``S``: ``scale(t) = t·S``, ``unscale(g) = g·f32(1/S)``; a step with a
    non-finite gradient is still skipped (as Megatron's constant scaler does), but the scale never
    changes. The :class:`LossScaler` protocol and records, like :class:`GradScaler`."""

    def __init__(self, scale, enabled=True, *, record=False):
        scale = check_real("scale", scale, gt=0)
        _check_float32_scale("scale", scale)
        super().__init__(scale, enabled, record=record)

    def _next(self, scale, tracker, found_inf):
        return scale, 0
