"""L5: planning calculators — training memory per parameter and per token, and scaling laws.

Memory (bytes, exact integers where the formats are whole bytes):

* states per parameter: weights in their format, gradients in theirs, an optional FP32 master copy,
  and the optimizer's FP32 states (Adam/AdamW: m and v; SGD with momentum: one buffer). With fp16
  weights and grads, an FP32 master and Adam this is the ZeRO paper's 2 + 2 + 4 + 4 + 4 = 16 bytes
  (Rajbhandari et al. 2020, amp.md §5);
* activations of one transformer layer (Korthikanti et al. 2022, 16-bit activations, 1-byte dropout
  masks): ``s·b·h·(34 + 5·a·s/h)`` without recomputation, ``34·s·b·h`` with selective recomputation
  of attention, ``2·s·b·h`` (the layer input only) with full recomputation.

Scaling laws (techniques.md §5): ``L(N, D) = E + A/N^α + B/D^β`` with ``C ≈ 6·N·D``. Minimising L
at fixed C gives ``N_opt = G·(C/6)^(β/(α+β))``, ``D_opt = (C/6)^(α/(α+β))/G`` with
``G = (α·A/(β·B))^(1/(α+β))``; along that frontier ``L(C) = E + K·(C/6)^(−αβ/(α+β))`` with
``K = A·G^−α + B·G^β``, which inverts in closed form to the budget that reaches a target loss.
"""
from __future__ import annotations

from dataclasses import dataclass

from mpt.formats import get_format

__all__ = [
    "ScalingLaw", "CHINCHILLA", "EPOCH_AI", "KAPLAN_N_EXPONENT", "SCALING_LAWS",
    "state_bytes_per_parameter", "activation_bytes_per_layer",
]

#: Kaplan et al. 2020: the compute-optimal model size grows as N ∝ C^0.73.
KAPLAN_N_EXPONENT = 0.73


@dataclass(frozen=True)
class ScalingLaw:
    """A Chinchilla-form loss law ``L(N, D) = E + A/N^alpha + B/D^beta`` (N params, D tokens)."""

    name: str
    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n_params: float, n_tokens: float) -> float:
        _check_positive(n_params=n_params, n_tokens=n_tokens)
        return self.E + self.A / n_params**self.alpha + self.B / n_tokens**self.beta

    @property
    def _G(self) -> float:
        a, b = self.alpha, self.beta
        return (a * self.A / (b * self.B)) ** (1 / (a + b))

    def compute_optimal(self, flops: float) -> tuple[float, float]:
        """(N_opt, D_opt) minimising the loss at a compute budget of ``flops`` (C = 6·N·D)."""
        _check_positive(flops=flops)
        a, b, x = self.alpha, self.beta, flops / 6
        return self._G * x ** (b / (a + b)), x ** (a / (a + b)) / self._G

    def optimal_loss(self, flops: float) -> float:
        """The loss reached by the compute-optimal split of ``flops``."""
        return self.loss(*self.compute_optimal(flops))

    def budget_for_loss(self, target: float) -> float:
        """The smallest compute (FLOPs) whose optimal split reaches loss ``target`` (> E)."""
        if not target > self.E:
            raise ValueError(f"target must exceed the irreducible loss E = {self.E} of "
                             f"{self.name}; got {target}")
        a, b, G = self.alpha, self.beta, self._G
        K = self.A * G**-a + self.B * G**b
        return 6 * (K / (target - self.E)) ** ((a + b) / (a * b))


#: Hoffmann et al. 2022, Approach 3 (rounded constants as published).
CHINCHILLA = ScalingLaw("chinchilla", E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)
#: Besiroglu et al. 2024 (Epoch AI) refit of Approach 3.
EPOCH_AI = ScalingLaw("epoch-ai", E=1.8172, A=482.01, B=2085.43, alpha=0.3478, beta=0.3658)
SCALING_LAWS = {law.name: law for law in (CHINCHILLA, EPOCH_AI)}

_OPTIMIZER_STATES = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2}


def _check_positive(**values) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be positive; got {value!r}")


def _bytes(fmt) -> float:
    return get_format(fmt).bits / 8


def state_bytes_per_parameter(weight_format="fp32", grad_format=None, master_format=None,
                              optimizer="adam", state_format="fp32") -> dict[str, float]:
    """Bytes per parameter of weights, gradients, master copy and optimizer states.

    ``grad_format`` defaults to the weight format (gradients live in their tensor's format);
    ``master_format=None`` means no separate master copy (fp32 training, or pure low precision).
    """
    if optimizer not in _OPTIMIZER_STATES:
        raise ValueError(f"optimizer must be one of {sorted(_OPTIMIZER_STATES)}; got {optimizer!r}")
    parts = {
        "weights": _bytes(weight_format),
        "grads": _bytes(grad_format if grad_format is not None else weight_format),
        "master": _bytes(master_format) if master_format is not None else 0.0,
        "optimizer": _OPTIMIZER_STATES[optimizer] * _bytes(state_format),
    }
    parts["total"] = sum(parts.values())
    return parts


def activation_bytes_per_layer(seq_len: int, batch: int, hidden: int, heads: int,
                               recompute: str = "none") -> float:
    """Activation bytes one transformer layer keeps for backward (Korthikanti et al. 2022).

    16-bit activations; ``recompute`` is ``"none"``, ``"selective"`` (attention recomputed) or
    ``"full"`` (only the layer input is kept).
    """
    _check_positive(seq_len=seq_len, batch=batch, hidden=hidden, heads=heads)
    sbh = seq_len * batch * hidden
    if recompute == "none":
        return sbh * (34 + 5 * heads * seq_len / hidden)
    if recompute == "selective":
        return 34.0 * sbh
    if recompute == "full":
        return 2.0 * sbh
    raise ValueError(f"recompute must be 'none', 'selective' or 'full'; got {recompute!r}")
