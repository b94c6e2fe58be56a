"""L4: the optimizer base class — FP32 state, master weights, copy-down, loss-scale unscaling.

The algorithms are in :mod:`mpt.optim.algorithms` (SGD, Adam, AdamW), gradient clipping in
:mod:`mpt.optim.clip`.

Semantics follow PyTorch's single-tensor path (docs/amp.md §3), operation by operation:

* Hyper-parameters are Python floats; scalar arithmetic on them (``1 − lr·wd``, bias corrections,
  ``lr/bc1``) is float64, and each enters float32 math as ``f32(x)`` once.
* Every tensor op is one float32 operation. The **arithmetic profile** ``fma`` decides the rest:
  ``fma=True`` (PyTorch 2.13 on x86-64 CPU, measured op by op) computes ``add(b, alpha=s)`` as
  ``fma(f32(s), b, a)``, ``lerp(a, b, w)`` (|w| < 0.5) as ``fma(w, b − a, a)`` and
  ``addcmul(t1, t2, value=s)`` as ``fma(f32(s)·t1, t2, a)``; ``fma=False`` rounds each product and
  sum separately. ``addcdiv`` and divisions are separate roundings in both.
* ``sqrt="correctly_rounded"`` (numpy / CUDA's ``sqrtf``). PyTorch's CPU ``sqrt`` on float32 is
  not correctly rounded (≈19 % of inputs in [0.5, 1.5) are 1 ULP off), so bit identity with
  ``torch.optim.AdamW`` on CPU needs its square root: pass ``sqrt=callable`` (a float32 array in,
  a float32 array out, e.g. ``lambda v: torch.from_numpy(v).sqrt().numpy()``; unfused only).
* States (``step``, ``exp_avg``, ``exp_avg_sq``, ``momentum_buffer``) are float32 arrays whatever
  the parameter format; gradients of any format are decoded exactly to float32.

**Master weights and copy-down.** A parameter is anything with ``.data`` (its storage array) and
``.grad`` (a Tensor or None) — normally an ``mpt.nn.Parameter``. The update always runs on a
float32 *working copy*: the parameter itself for fp32; for fp16/bf16 (any format narrower than
fp32) either a persistent FP32 **master** (``master_weights=True``, ``state["master"]``, created at
the parameter's first step from its exact value — the Apex O2 layout) or a transient decode of the
parameter (``master_weights=False``: pure low-precision training). After the update the working
copy is rounded down to the parameter's format with ``rounding`` (``"nearest_even"``, or
``"stochastic"`` keyed by ``seed``, the parameter's index and the optimizer's step count) and
written into ``param.data``. ``optimizer.lost_updates`` maps each low-precision parameter's name
to a :class:`CopyDownStats`: elements whose working copy changed, and how many of those kept
their low-precision bits (the update was lost: below half an ULP of the weight).

**Loss scaling.** ``step(inv_scale=s)`` unscales each gradient element (``g·s`` in float32) on the
way in, leaving ``.grad`` untouched; this is what ``GradScaler.step`` uses for optimizers with
``supports_amp_scaling`` (master weights or fused), so fp16 gradients need no fp32 copy.

**Fused step.** ``fused=True`` runs unscale → update of the master and states as one Numba pass
per parameter (``mpt.kernels.optim``; the global skip-on-overflow decision is GradScaler's
read-only scan before it), then the copy-down as one ``mpt.round`` pass. It gives the same bits
as the unfused path, which composes one array op per PyTorch op; both are checked against
``mpt.reference`` (exact rationals) in tests/test_optim.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mpt._checks import check_bool, check_int, check_real
from mpt.autograd.tensor import opmath
from mpt.formats import UNSIGNED, get_format, rounding_mode
from mpt.rounding import round as round_format

__all__ = ["Optimizer", "CopyDownStats"]

_F32 = np.float32


@dataclass(frozen=True)
class CopyDownStats:
    """One parameter's copy-down in one step: ``changed`` elements of the FP32 working copy, of
    which ``lost`` kept their low-precision bits; ``numel`` elements in all."""

    lost: int
    changed: int
    numel: int

    @property
    def lost_fraction(self) -> float:
        """Share of the changed elements whose update was lost (0 when nothing changed)."""
        return self.lost / self.changed if self.changed else 0.0


def _format_of(p):
    fmt = getattr(p, "format", None)
    return get_format(p.data.dtype) if fmt is None else fmt


def _check_param(p, where):
    if not isinstance(getattr(p, "data", None), np.ndarray) or not hasattr(p, "grad"):
        raise TypeError(f"{where}: a parameter needs .data (ndarray) and .grad; got "
                        f"{type(p).__name__}")
    fmt = _format_of(p)
    if fmt.kind != "float" or np.dtype(fmt.dtype).itemsize > 4:
        raise TypeError(f"{where}: parameter format must be fp32 or narrower (fp16, bf16, ...); "
                        f"got {fmt.name}")


def _param_name(group, i, j):
    names = group.get("param_names")
    return names[j] if names else f"group{i}.param{j}"


def _bump(t):
    if hasattr(t, "bump_version"):
        t.bump_version()


class Optimizer:
    """Base class: param groups, FP32 state, master weights, copy-down (see the module docstring).

    ``params``: an iterable of parameters, of ``(name, parameter)`` pairs (as
    ``module.named_parameters()`` gives; names are used by ``lost_updates`` and GradScaler's
    records), or of dicts (param groups with their own hyper-parameters).
    """

    def __init__(self, params, defaults, *, fma=True, sqrt="correctly_rounded",
                 master_weights=False, rounding="nearest_even", seed=0, fused=False):
        for name, value in (("fma", fma), ("master_weights", master_weights), ("fused", fused)):
            check_bool(name, value)
        if sqrt != "correctly_rounded" and not callable(sqrt):
            raise ValueError(f"sqrt must be 'correctly_rounded' or a callable; got {sqrt!r}")
        if fused and callable(sqrt):
            raise ValueError("fused=True computes correctly rounded square roots; a sqrt callable "
                             "needs fused=False")
        self.fma, self.sqrt, self.fused = fma, sqrt, fused
        self.master_weights = master_weights
        self.rounding = rounding_mode(rounding).value
        self.seed = check_int("seed", seed, min=0, max=2**64 - 1)
        self.defaults = dict(defaults)
        self.param_groups: list[dict] = []
        self.state: dict = {}
        self.lost_updates: dict[str, CopyDownStats] = {}
        self._steps = 0
        params = list(params) if not hasattr(params, "data") else [params]
        if not params:
            raise ValueError("params: optimizer got an empty parameter list")
        for group in (params if isinstance(params[0], dict) else [{"params": params}]):
            self.add_param_group(group)

    @property
    def supports_amp_scaling(self) -> bool:
        """Whether ``step(inv_scale=...)`` should unscale the gradients (GradScaler asks)."""
        return self.master_weights or self.fused

    def add_param_group(self, group: dict) -> None:
        """Add a group (``{"params": [...], **hyper}``); missing hyper-parameters take defaults.

        Every hyper-parameter is checked (:meth:`_validate`, PyTorch's ranges, and never NaN or
        Inf) and stored as a Python float; a parameter may appear only once in an optimizer."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("param group must be a dict with a 'params' entry")
        items = group["params"]
        items = [items] if hasattr(items, "data") else list(items)
        named = [isinstance(x, tuple) for x in items]
        if any(named) and not all(named):
            raise ValueError("params: give all parameters of a group with names or none")
        names = [n for n, _ in items] if items and all(named) else None
        params = [p for _, p in items] if names is not None else items
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        mine = set()
        for j, p in enumerate(params):
            _check_param(p, "params")
            if id(p) in seen:
                raise ValueError("params: some parameters appear in more than one parameter group")
            if id(p) in mine:
                raise ValueError(f"params: parameter {j} of the group is listed twice (it would "
                                 "be updated twice per step)")
            mine.add(id(p))
        new = {**self.defaults, **{k: v for k, v in group.items() if k != "params"}}
        new["params"] = params
        if names is not None:
            new["param_names"] = names
        self._validate(new)
        self.param_groups.append(new)

    def _validate(self, group: dict) -> None:
        """Check the group's hyper-parameters in place, converting them to Python floats (bools,
        NaN and Inf refused). Subclasses extend it."""
        group["lr"] = check_real("lr", group.get("lr"), min=0)
        if "weight_decay" in group:
            group["weight_decay"] = check_real("weight_decay", group["weight_decay"], min=0)

    def named_parameters(self):
        """(name, parameter) for every parameter: its given name or ``group{i}.param{j}``."""
        for i, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                yield _param_name(group, i, j), p

    def zero_grad(self, set_to_none: bool = True) -> None:
        for _, p in self.named_parameters():
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    # ---- the step --------------------------------------------------------------------------------
    def step(self, closure=None, *, inv_scale=None):
        """One update of every parameter that has a gradient; returns ``closure()`` if given.

        ``inv_scale``: a float32 factor > 0 applied to every gradient element first (loss
        scaling; +inf once a scale has collapsed to 0, NaN refused), None for none. Non-finite
        gradients are not checked here (GradScaler skips the step).
        """
        inv_scale = check_real("inv_scale", inv_scale, gt=0, finite=False, optional=True)
        loss = closure() if closure is not None else None
        inv = None if inv_scale is None else _F32(inv_scale)
        self._steps += 1
        stats, index = {}, 0
        for i, group in enumerate(self.param_groups):
            for j, p in enumerate(group["params"]):
                if p.grad is not None:
                    result = self._step_param(p, group, inv, index)
                    if result is not None:
                        stats[_param_name(group, i, j)] = result
                index += 1
        self.lost_updates = stats
        return loss

    def _step_param(self, p, group, inv, index):
        fmt = _format_of(p)
        low = fmt.name != "fp32"
        state = self.state.get(p)
        if state is None:
            state = self.state[p] = self._init_state(p, low)
        g = opmath(p.grad.data).reshape(-1)                                 # (n,) float32
        if "master" in state:
            work = state["master"].reshape(-1)                              # persistent master
        elif low:
            work = p.data.astype(_F32).reshape(-1)                          # transient decode
        else:
            work = p.data.reshape(-1) if p.data.flags.c_contiguous else p.data.ravel()
        scalars = self._scalars(p, group, state)
        before = work.copy() if low else None
        if self.fused:
            self._fused(work, g, inv, state, scalars)
        else:
            with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
                if inv is not None and inv != 1:
                    g = g * inv
                self._update(work, g, state, scalars)
        if not low:
            if work.base is not p.data and work is not p.data:
                p.data[...] = work.reshape(p.data.shape)
            _bump(p)
            return None
        return self._copy_down(p, fmt, work, work != before, index)

    def _copy_down(self, p, fmt, work, changed, index):
        """Round the FP32 working copy into ``p.data``; count the ``changed`` elements and the
        lost updates among them (low-precision bits unchanged)."""
        old_bits = p.data.copy().reshape(-1)
        key = dict(seed=self.seed, stream=self._stream(index)) \
            if self.rounding == "stochastic" else {}
        new = round_format(work.reshape(p.data.shape), fmt, self.rounding, **key)
        same = new.reshape(-1).view(UNSIGNED[new.itemsize]) == old_bits.view(UNSIGNED[new.itemsize])
        p.data[...] = new
        _bump(p)
        return CopyDownStats(int(np.count_nonzero(changed & same)), int(np.count_nonzero(changed)),
                             work.size)

    def _stream(self, index) -> int:
        """Philox stream of parameter ``index``'s stochastic copy-down in this step."""
        return (self._steps << 32) | index

    def _init_state(self, p, low) -> dict:
        state = self._new_state(p)
        if self.master_weights and low:
            state["master"] = p.data.astype(_F32)                           # exact decode
        return state

    # subclass hooks: _new_state(p) -> dict; _scalars(p, group, state) -> dict of float32/bool
    # (advances step counters); _update(work, g, state, scalars) in place (unfused);
    # _fused(work, g, inv, state, scalars): the fused kernel, in place

    def _sqrt(self, v):
        return np.sqrt(v) if self.sqrt == "correctly_rounded" else np.asarray(self.sqrt(v), _F32)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """``{"state": {index: {name: float32 array}}, "param_groups": [...], "steps": int}``;
        parameters are numbered in group order (as PyTorch); arrays are copies."""
        index = {id(p): i for i, (_, p) in enumerate(self.named_parameters())}
        state = {index[id(p)]: {k: np.array(v, copy=True) for k, v in s.items()}
                 for p, s in self.state.items()}
        groups, start = [], 0
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry["params"] = list(range(start, start + len(group["params"])))
            start += len(group["params"])
            groups.append(entry)
        return {"state": state, "param_groups": groups, "steps": self._steps}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore hyper-parameters and float32 states saved by :meth:`state_dict` (checked)."""
        groups = state_dict.get("param_groups")
        if not isinstance(groups, list) or len(groups) != len(self.param_groups):
            raise ValueError("state_dict: param_groups do not match this optimizer's groups")
        params = [p for _, p in self.named_parameters()]
        for mine, saved in zip(self.param_groups, groups):
            if len(saved.get("params", ())) != len(mine["params"]):
                raise ValueError("state_dict: a param group has a different number of parameters")
        new_state = {}
        for key, saved in state_dict.get("state", {}).items():
            i = int(key)
            if not 0 <= i < len(params):
                raise ValueError(f"state_dict: state for parameter {i} of {len(params)}")
            new_state[params[i]] = {k: self._checked_state(params[i], k, v)
                                    for k, v in saved.items()}
        new_groups = []
        for mine, saved in zip(self.param_groups, groups):
            new = {**mine, **{k: v for k, v in saved.items() if k != "params"}}
            self._validate(new)                                 # all checked before any change
            new_groups.append(new)
        steps = check_int("state_dict['steps']", state_dict.get("steps", 0), min=0)
        for mine, new in zip(self.param_groups, new_groups):
            mine.update(new)
        self.state = new_state
        self._steps = steps

    @staticmethod
    def _checked_state(p, name, value):
        arr = np.asarray(value)
        if arr.dtype != _F32:
            raise ValueError(f"state_dict: state {name!r} must be float32; got {arr.dtype}")
        if arr.ndim and arr.shape != p.data.shape:
            raise ValueError(f"state_dict: state {name!r} has shape {arr.shape}, parameter has "
                             f"{p.data.shape}")
        return arr.copy()


