"""L4: optimizers with FP32 state — SGD, Adam, AdamW — and ``clip_grad_norm_``.

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

import math
from dataclasses import dataclass

import numpy as np

from mpt._checks import check_bool, check_int, check_real
from mpt.formats import get_format, rounding_mode
from mpt.kernels.fma import fma_array
from mpt.kernels.optim import adam_step, sgd_step, sum_abs_pow
from mpt.rounding import round as _round
from mpt.tensor import opmath

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "CopyDownStats", "clip_grad_norm_"]

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
        new = _round(work.reshape(p.data.shape), fmt, self.rounding, **key)
        same = new.reshape(-1).view(_uint(new)) == old_bits.view(_uint(new))
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


def _uint(a):
    return {1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize]


# ---- PyTorch's tensor ops as float32 array ops (unfused path) ------------------------------------
def _add_alpha(a, s, b, fma):
    """``a.add(b, alpha=s)``: fma(s, b, a) or a + s·b (``s`` float32)."""
    return fma_array(s, b, a) if fma else a + s * b


def _lerp(a, b, w, fma):
    """``a.lerp(b, w)``: a + w·(b − a) for |w| < 0.5, else b + (w − 1)·(b − a) (w − 1 exact)."""
    if abs(w) < 0.5:
        return _add_alpha(a, w, b - a, fma)
    return _add_alpha(b, w - _F32(1), b - a, fma)


def _addcmul(a, t1, t2, s, fma):
    """``a.addcmul(t1, t2, value=s)``: fma(s·t1, t2, a) or a + (s·t1)·t2."""
    return _add_alpha(a, s * t1, t2, fma)


class SGD(Optimizer):
    """``torch.optim.SGD``: momentum, dampening, Nesterov, (coupled) weight decay.

    g ← g + wd·p; buf ← g on the first step, then buf·μ + (1 − dampening)·g; g ← g + μ·buf
    (Nesterov) or buf; p ← p − lr·g — each ``+ s·x`` an ``add(alpha)`` (fused with ``fma=True``).
    """

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, **profile):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov), **profile)

    def _validate(self, group):
        """PyTorch's ranges: momentum >= 0; dampening any finite number; nesterov a bool that
        needs a momentum and zero dampening."""
        super()._validate(group)
        group["momentum"] = check_real("momentum", group["momentum"], min=0)
        group["dampening"] = check_real("dampening", group["dampening"])
        group["nesterov"] = check_bool("nesterov", group["nesterov"])
        if group["nesterov"] and (group["momentum"] <= 0 or group["dampening"] != 0):
            raise ValueError("nesterov momentum requires a momentum and zero dampening")

    def _new_state(self, p):
        return {}

    def _scalars(self, p, group, state):
        first = "momentum_buffer" not in state
        if group["momentum"] != 0 and first:
            state["momentum_buffer"] = np.empty(p.data.shape, _F32)       # set to g by this step
        return dict(first=first, use_wd=group["weight_decay"] != 0, wd=_F32(group["weight_decay"]),
                    use_momentum=group["momentum"] != 0, mu=_F32(group["momentum"]),
                    one_minus_damp=_F32(1 - group["dampening"]),
                    nesterov=bool(group["nesterov"]), neg_lr=_F32(-group["lr"]))

    def _update(self, p, g, state, s):
        fma = self.fma
        if s["use_wd"]:
            g = _add_alpha(g, s["wd"], p, fma)
        if s["use_momentum"]:
            buf = state["momentum_buffer"].reshape(-1)
            buf[...] = g if s["first"] else _add_alpha(buf * s["mu"], s["one_minus_damp"], g, fma)
            g = _add_alpha(g, s["mu"], buf, fma) if s["nesterov"] else buf
        p[...] = _add_alpha(p, s["neg_lr"], g, fma)

    def _fused(self, work, g, inv, state, s):
        buf = state["momentum_buffer"].reshape(-1) if s["use_momentum"] else work[:0]
        return sgd_step(work, g, _F32(1) if inv is None else inv, buf, s["first"], s["use_wd"],
                        s["wd"], s["use_momentum"], s["mu"], s["one_minus_damp"], s["nesterov"],
                        s["neg_lr"], self.fma)


class Adam(Optimizer):
    """``torch.optim.Adam`` (``decoupled=False``: ``g ← g + wd·p``) in the single-tensor order:

    t ← t + 1; m ← m.lerp(g, 1 − β1); v ← (v·β2).addcmul(g, g, value=1 − β2);
    bc1 = 1 − β1^t, bc2 = 1 − β2^t (float64); denom = √v / f32(bc2^½) + f32(eps);
    p ← p.addcdiv(m, denom, value=−lr/bc1). ``bc2 ** 0.5`` is Python's (as PyTorch computes it).
    """

    _decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 **profile):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         **profile)

    def _validate(self, group):
        """PyTorch's ranges: betas a pair in [0, 1), eps >= 0."""
        super()._validate(group)
        betas = group["betas"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2) of real numbers in [0, 1); got "
                            f"{type(betas).__name__} {betas!r}")
        group["betas"] = tuple(check_real(f"betas[{i}]", b, min=0, lt=1)
                               for i, b in enumerate(betas))
        group["eps"] = check_real("eps", group["eps"], min=0)

    def _new_state(self, p):
        return {"step": np.zeros((), _F32), "exp_avg": np.zeros(p.data.shape, _F32),
                "exp_avg_sq": np.zeros(p.data.shape, _F32)}

    def _scalars(self, p, group, state):
        state["step"] += _F32(1)                        # float32 step count, as PyTorch keeps it
        t = float(state["step"])
        lr, wd, (b1, b2) = group["lr"], group["weight_decay"], group["betas"]
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        return dict(use_wd=wd != 0, decay=_F32(1 - lr * wd), wd=_F32(wd), w1=_F32(1 - b1),
                    b2=_F32(b2), one_minus_b2=_F32(1 - b2), bc2_sqrt=_F32(bc2 ** 0.5),
                    eps=_F32(group["eps"]), neg_step_size=_F32(-(lr / bc1)))

    def _update(self, p, g, state, s):
        fma = self.fma
        m, v = state["exp_avg"].reshape(-1), state["exp_avg_sq"].reshape(-1)
        if s["use_wd"]:
            if self._decoupled:
                p[...] = p * s["decay"]
            else:
                g = _add_alpha(g, s["wd"], p, fma)
        m[...] = _lerp(m, g, s["w1"], fma)
        v[...] = _addcmul(v * s["b2"], g, g, s["one_minus_b2"], fma)
        denom = self._sqrt(v) / s["bc2_sqrt"] + s["eps"]
        p[...] = p + (s["neg_step_size"] * m) / denom                   # addcdiv

    def _fused(self, work, g, inv, state, s):
        return adam_step(work, g, _F32(1) if inv is None else inv, state["exp_avg"].reshape(-1),
                         state["exp_avg_sq"].reshape(-1), s["use_wd"], self._decoupled,
                         s["decay"], s["wd"], s["w1"], s["b2"], s["one_minus_b2"], s["bc2_sqrt"],
                         s["eps"], s["neg_step_size"], self.fma)


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled decay ``p ← p·f32(1 − lr·wd)`` first
    (``1 − lr·wd`` in float64), default ``weight_decay=1e-2``."""

    _decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 **profile):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         **profile)


# ---- gradient clipping --------------------------------------------------------------------------
def _vector_norm(x: np.ndarray, norm_type: float) -> np.float32:
    """f32 of the ``norm_type`` norm of float32 ``x``: a sequential float64 sum of |x|^p in index
    order, then ^(1/p) in float64 (``math.sqrt`` for p = 2), rounded once; max |x| for inf."""
    if x.size == 0:
        return _F32(0)
    if math.isinf(norm_type):
        return np.max(np.abs(x))
    total = sum_abs_pow(x, float(norm_type))
    if math.isnan(total):
        return _F32(math.nan)
    return _F32(math.sqrt(total) if norm_type == 2.0 else total ** (1.0 / norm_type))


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False) -> np.float32:
    """``torch.nn.utils.clip_grad_norm_``: scale every gradient by
    ``min(1, f32(1 / (total + f32(1e-6))) · f32(max_norm))`` and return ``total`` (float32).

    The coefficient is PyTorch's ``max_norm / (total_norm + 1e-6)``: a Python float divided by a
    tensor is ``tensor.reciprocal() * float`` there, two float32 roundings.

    ``total`` is the norm of the per-tensor norms (as PyTorch structures it), each computed by
    :func:`_vector_norm` on the gradient decoded to float32, in parameter order — a fixed order,
    so the same bits on every machine. The scaling is computed in float32 and rounded (RNE) to each
    gradient's format. ``norm_type``: p > 0 or ``inf``; ``max_norm`` >= 0 (``inf``: no clipping;
    PyTorch sets no range, a negative one would flip the gradients and is refused).
    """
    if hasattr(parameters, "data"):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    norm_type = check_real("norm_type", norm_type, gt=0, finite=False)
    max_norm = check_real("max_norm", max_norm, min=0, finite=False)
    error_if_nonfinite = check_bool("error_if_nonfinite", error_if_nonfinite)
    if not grads:
        return _F32(0)
    norms = np.array([_vector_norm(opmath(g.data).reshape(-1), norm_type) for g in grads], _F32)
    total = _vector_norm(norms, norm_type)
    if error_if_nonfinite and not np.isfinite(total):
        raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite, "
                           "so it cannot be clipped; pass error_if_nonfinite=False to scale by it")
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        coef = np.minimum((_F32(1) / (total + _F32(1e-6))) * _F32(max_norm), _F32(1))
        for g in grads:
            fmt = _format_of(g)
            if fmt.name == "fp32":
                g.data *= coef
            else:
                g.data[...] = _round(opmath(g.data) * coef, fmt, "nearest_even")
            _bump(g)
    return total
