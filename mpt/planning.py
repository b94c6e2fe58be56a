"""L5: planning calculators — training memory per parameter and per token, and scaling laws.

Memory (bytes, exact integers where the formats are whole bytes):

* states per parameter: weights in their format, gradients in theirs, an optional FP32 master copy,
  and the optimizer's FP32 states (Adam/AdamW: m and v; SGD with momentum: one buffer). With fp16
  weights and grads, an FP32 master and Adam this is the ZeRO paper's 2 + 2 + 4 + 4 + 4 = 16 bytes
  (Rajbhandari et al. 2020, docs/amp.md §5);
* activations of one transformer layer (Korthikanti et al. 2022, 16-bit activations, 1-byte dropout
  masks): ``s·b·h·(34 + 5·a·s/h)`` without recomputation, ``34·s·b·h`` with selective recomputation
  of attention, ``2·s·b·h`` (the layer input only) with full recomputation;
* :func:`training_memory`: the peak bytes per role of one training step of mpt's own GPT
  (``mpt.nn.GPT``) under a recipe (``mpt.recipes``), counting what mpt's ops save for backward
  (below), checked against ``mpt.memory.MemoryLedger`` (tests/test_planning.py).

Per-op accounting of mpt's GPT (s tokens, b sequences, h = d_model, a heads, r = mlp_ratio, V vocab;
c the bytes of the compute format — the activations' format —, p of the parameters'; every
LayerNorm and the loss run in fp32). What each op keeps until its backward:

=========================  =========================================================================
LayerNorm (×2 per layer)   its input in fp32 (an fp32 copy when the stream is fp16/bf16), mean and
                           rstd (2·s·b fp32); with fp16/bf16 parameters also the fp32 weight:
                           4·(s·b·h + 2·s·b) [+ 4·h]
Linear in_proj, out_proj,  its input: (3 + r)·s·b·h·c; under autocast also the cast weight copy,
fc1, fc2                   (4 + 2r)·h²·c; FP8 Linears keep the E4M3 input and weight, 1 byte each
attention "flash"          q, k, v (one buffer, 3·s·b·h·c), the output (s·b·h·c), the log-sum-exp
                           (a·b·s fp32)
attention "naive"          q, k, v (3·s·b·h·c), the fp32 scores and the probabilities:
                           a·b·s²·(4 + c)
GELU                       its input, r·s·b·h·c
residual adds, reshapes,   nothing
embeddings, dropout p = 0
final LayerNorm, tied      the LayerNorm as above, the head's input s·b·h·c (and the cast V·h
head, cross-entropy        embedding copy under autocast), the fp32 logits s·b·V·4 and 2·s·b fp32
loss scaling               the product ``loss·scale`` keeps both fp32 scalars (8 bytes)
=========================  =========================================================================

So a layer keeps ``s·b·h·(8 + (3 + 4 + 2r)·c) + 16·s·b + 4·a·b·s`` bytes with flash attention
(r = 4: ``s·b·h·(8 + 15·c)``, 38·s·b·h in 16 bits against Korthikanti's 34 for Megatron's layer
with dropout masks: mpt keeps fp32 LayerNorm inputs and the GELU input where Megatron keeps 2-byte
copies and 1-byte masks). All of it is live at the end of the forward pass: that is the peak.

With checkpointing (``GPT(checkpoint=k)``: k segments of sizes ``mpt.checkpoint.segment_sizes``)
the forward keeps only each segment's input (s·b·h·p); the backward recomputes segment j while
the inputs of segments 1..j are live, and the head's buffers stay referenced until the backward
ends (the logits by the Trainer, the others by the graph's tensors), so the peak is
``head + max_j(j·s·b·h·p + size_j·layer)`` (less the first LayerNorm's input, which is the
segment input itself when the stream is fp32). Gradients peak above ``N·p``: the Trainer retains
the logits' gradient (s·b·V in the output format) for its loss-gradient statistics, and with
checkpointing every segment's recomputed backward leaves its parameter gradients live until the
outer backward has accumulated them (all block parameters once more). AdamW keeps m, v (fp32)
and a 4-byte step per parameter tensor; a master copy is 4 bytes per parameter.

Scaling laws (docs/techniques.md §5): ``L(N, D) = E + A/N^α + B/D^β`` with ``C ≈ 6·N·D``.
Minimising L at fixed C gives ``N_opt = G·(C/6)^(β/(α+β))``, ``D_opt = (C/6)^(α/(α+β))/G`` with
``G = (α·A/(β·B))^(1/(α+β))``; along that frontier ``L(C) = E + K·(C/6)^(−αβ/(α+β))`` with
``K = A·G^−α + B·G^β``, which inverts in closed form to the budget that reaches a target loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from mpt._checks import check_int
from mpt.amp.recipes import get_recipe
from mpt.formats import get_format
from mpt.nn.checkpoint import segment_sizes

__all__ = [
    "ScalingLaw", "CHINCHILLA", "EPOCH_AI", "KAPLAN_N_EXPONENT", "SCALING_LAWS",
    "state_bytes_per_parameter", "activation_bytes_per_layer", "GPTShape", "MemoryEstimate",
    "training_memory", "format_memory_table",
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


# ---- the memory of one training step of mpt's GPT ------------------------------------------------

_F32 = 4  # bytes of an fp32 value: LayerNorm statistics, the loss, optimizer states, masters


@dataclass(frozen=True)
class GPTShape:
    """The shape of an ``mpt.nn.GPT`` (tied head, biases, pre-LN blocks, MLP hidden r·d_model)."""

    vocab: int
    d_model: int
    n_layers: int
    n_heads: int
    seq_len: int
    mlp_ratio: int = 4

    def __post_init__(self):
        for name in ("vocab", "d_model", "n_layers", "n_heads", "seq_len", "mlp_ratio"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), min=1))
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")

    @classmethod
    def of(cls, model) -> "GPTShape":
        """The shape of a built ``mpt.nn.GPT``."""
        block = model.blocks[0]
        return cls(model.vocab, model.wte.weight.shape[1], model.n_layers, block.attn.n_heads,
                   model.seq_len, block.mlp.fc1.weight.shape[0] // model.wte.weight.shape[1])

    @property
    def block_params(self) -> int:
        """Parameters of one block: 2 LayerNorms, in_proj, out_proj, fc1, fc2 with biases."""
        d, r = self.d_model, self.mlp_ratio
        return (4 + 2 * r) * d * d + (9 + r) * d

    @property
    def n_params(self) -> int:
        """Parameters: embeddings (the head is tied), the blocks, the final LayerNorm."""
        return (self.vocab + self.seq_len) * self.d_model + self.n_layers * self.block_params \
            + 2 * self.d_model

    @property
    def n_tensors(self) -> int:
        """Parameter tensors (AdamW keeps one fp32 step count for each)."""
        return 4 + 12 * self.n_layers


@dataclass(frozen=True)
class MemoryEstimate:
    """Peak bytes per role of one training step (see :func:`training_memory`).

    ``by_role``: weights, grads, master, optimizer, activations (each its own peak) and total
    (their sum: an upper bound of the step's peak, which comes while the activations are being
    freed and the gradients created); ``activations_detail``: the activation bytes per op kind
    of one layer and of the head, the checkpoint segment inputs, and the gradient bytes beyond
    the parameters' own (``grads/...``).
    """

    shape: GPTShape
    recipe: str
    batch: int
    seq: int
    checkpoint: int
    backend: str
    by_role: dict
    activations_detail: dict

    def per_parameter(self) -> dict:
        """Bytes per parameter of the state roles (grads: the parameters' own, without the
        retained logits gradient and the checkpoint's inner gradients)."""
        n = self.shape.n_params
        out = {k: self.by_role[k] / n for k in ("weights", "grads", "master", "optimizer")}
        out["grads"] -= sum(v for k, v in self.activations_detail.items()
                            if k.startswith("grads/")) / n
        return out

    def per_token(self) -> float:
        """Activation bytes per token of the batch."""
        return self.by_role["activations"] / (self.batch * self.seq)


def _linear_operand_bytes(recipe) -> int | None:
    """Bytes per element of the quantized operands a low-precision Linear saves for backward
    (None: it saves its inputs as they are). FP8 and block-scaled Linears save 1-byte codes (the
    block scales, 1 byte per 16 or 32 codes, are not counted); INC's hold their FP8 format's
    storage — 1 byte for the OCP formats, 4 for Gaudi 2's custom formats, which mpt stores as
    float32 values."""
    if recipe.fp8 is not None or recipe.block_scaled is not None:
        return 1
    if recipe.inc is not None:
        return get_format(recipe.inc.formats[0]).dtype.itemsize
    return None


def _layer_activations(b, s, shape, recipe, backend) -> dict:
    """Bytes one block keeps for backward, by op kind (module docstring)."""
    d, a, r = shape.d_model, shape.n_heads, shape.mlp_ratio
    sbh, sb = s * b * d, s * b
    c = _F32 if recipe.compute_format == "tf32" else _bytes(recipe.compute_format)
    low = recipe.param_format != "fp32"
    lin = _linear_operand_bytes(recipe) or c
    copies = recipe.autocast or lin != c
    if backend == "flash":
        attention = 4 * sbh * c + a * sb * _F32
    else:
        attention = 3 * sbh * c + a * b * s * s * (_F32 + (c if c != _F32 else 0))
    return {
        "layernorm": 2 * (_F32 * (sbh + 2 * sb) + (_F32 * d if low else 0)),
        "linear inputs": (3 + r) * sbh * lin,
        "linear weight copies": (4 + 2 * r) * d * d * lin if copies else 0,
        "attention": attention,
        "gelu": r * sbh * c,
    }


def _head_activations(b, s, shape, recipe) -> dict:
    d, V = shape.d_model, shape.vocab
    c = _F32 if recipe.compute_format == "tf32" else _bytes(recipe.compute_format)
    low = recipe.param_format != "fp32"
    return {
        "layernorm": _F32 * (s * b * d + 2 * s * b) + (_F32 * d if low else 0),
        "head input": s * b * d * c + (V * d * c if recipe.autocast else 0),
        "cross-entropy": s * b * V * _bytes(recipe.output_format) + 2 * s * b * _F32,
        "loss scaling": 2 * _F32 if recipe.loss_scaling.kind != "none" else 0,
    }


def _segments(n_layers, checkpoint) -> list:
    if checkpoint is False or checkpoint == 0:
        return []
    k = max(1, round(math.sqrt(n_layers))) if checkpoint is True or checkpoint == "sqrt" \
        else checkpoint
    return segment_sizes(n_layers, k)


def training_memory(shape: GPTShape, recipe, batch: int, seq: int | None = None, *,
                    checkpoint=False, backend: str = "flash",
                    optimizer: str = "adamw") -> MemoryEstimate:
    """Peak bytes per role of one training step of ``mpt.nn.GPT`` of ``shape`` under ``recipe``.

    ``seq`` defaults to ``shape.seq_len``; ``checkpoint`` as ``GPT(checkpoint=...)`` (False, True
    for round(√n_layers) segments, or a number of segments); ``backend`` ``"flash"`` or
    ``"naive"``; dropout 0 (the small GPT's default). The accounting is the module docstring's;
    it matches ``MemoryLedger.peak_by_role`` of a ``Trainer`` step (tests/test_planning.py).
    """
    if not isinstance(shape, GPTShape):
        raise TypeError(f"shape must be a GPTShape; got {type(shape).__name__}")
    recipe = get_recipe(recipe)
    seq = shape.seq_len if seq is None else seq
    _check_positive(batch=batch, seq=seq)
    if seq > shape.seq_len:
        raise ValueError(f"seq must be <= shape.seq_len={shape.seq_len}; got {seq}")
    if backend not in ("flash", "naive"):
        raise ValueError(f"backend must be 'flash' or 'naive'; got {backend!r}")
    states = state_bytes_per_parameter(recipe.param_format, recipe.grad_format,
                                       recipe.master_format, optimizer, recipe.state_format)
    n, d, p = shape.n_params, shape.d_model, _bytes(recipe.param_format)
    layer = _layer_activations(batch, seq, shape, recipe, backend)
    head = _head_activations(batch, seq, shape, recipe)
    per_layer, x = sum(layer.values()), seq * batch * d * p   # x: one block input (the stream)
    sizes = _segments(shape.n_layers, checkpoint)
    if sizes:
        shared = _F32 * seq * batch * d if p == _F32 else 0  # first LayerNorm saves its input
        activations = sum(head.values()) + max((j + 1) * x + size * per_layer - shared
                                               for j, size in enumerate(sizes))
    else:
        activations = shape.n_layers * per_layer + sum(head.values())
    extra_grads = {
        "grads/retained logits grad": batch * seq * shape.vocab * _bytes(recipe.output_format),
        "grads/checkpoint inner grads": shape.n_layers * shape.block_params * states["grads"]
        if sizes else 0}
    grads = n * states["grads"] + sum(extra_grads.values())
    by_role = {
        "weights": n * states["weights"],
        "grads": grads,
        "master": n * states["master"],
        "optimizer": n * states["optimizer"] + (shape.n_tensors * _F32  # Adam's step counts
                                                if optimizer in ("adam", "adamw") else 0),
        "activations": activations,
    }
    by_role = {k: int(v) for k, v in by_role.items()}
    by_role["total"] = sum(by_role.values())
    detail = {**{f"layer/{k}": int(v) for k, v in layer.items()},
              **{f"head/{k}": int(v) for k, v in head.items()},
              "segment inputs": int(len(sizes) * x),
              **{k: int(v) for k, v in extra_grads.items()}}
    return MemoryEstimate(shape, recipe.name, batch, seq, len(sizes), backend, by_role, detail)


def format_memory_table(est: MemoryEstimate) -> str:
    """The per-role table of an estimate (bytes, MiB, bytes per parameter / per token)."""
    per_param = est.per_parameter()
    lines = [f"recipe {est.recipe}: {est.shape.n_params:,} parameters, batch {est.batch} × seq "
             f"{est.seq}, {est.backend} attention, "
             + (f"{est.checkpoint} checkpoint segments" if est.checkpoint else "no checkpointing"),
             f"{'role':<12} {'bytes':>16} {'MiB':>10} {'per unit':>16}"]
    for role, b in est.by_role.items():
        unit = (f"{per_param[role]:.3f} B/param" if role in per_param else
                f"{est.per_token():.1f} B/token" if role == "activations" else "")
        lines.append(f"{role:<12} {b:>16,} {b / 2**20:>10.2f} {unit:>16}")
    lines.append("activations of one layer / the head by op; gradients beyond the parameters':")
    lines += [f"  {k:<28} {v:>14,}" for k, v in est.activations_detail.items()]
    return "\n".join(lines)
