"""L4: SGD, Adam and AdamW in PyTorch's single-tensor operation order, on FP32 state.

Each update is one float32 array op per PyTorch tensor op, fused or not as the optimizer's
arithmetic profile says (``mpt.optim.optimizer``'s module docstring), or the fused Numba step of
``mpt.kernels.optim`` — the same bits. Oracle: ``mpt.reference.optim`` (exact rationals).
"""
from __future__ import annotations

import numpy as np

from mpt._checks import check_bool, check_real
from mpt.kernels.fma import fma_array
from mpt.kernels.optim import adam_step, sgd_step
from mpt.optim.optimizer import _F32, Optimizer

__all__ = ["SGD", "Adam", "AdamW"]


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

