"""L5: the quantization sections of ``mpt study`` — QAT vs post-training quantization, and LoRA
over low-precision bases (issue 7; ``mpt.quant``, ``mpt.lora``).

**QAT vs PTQ.** A bigram MLP — one-hot token (V) → QuantStub → Linear(V, H) + ReLU →
Linear(H, V) → DeQuantStub — learns the study's Markov chain, whose entropy rate ``H`` is also its
best achievable loss (a first-order chain: the previous token is all there is to know). It trains in
FP32 (AdamW, ``mlp_steps`` steps at ``mlp_lr``), then is quantized under each scheme ``(w, a)``:
``int8`` = (8, 8) is PyTorch's default QAT qconfig (weights qint8 symmetric per channel,
activations quint8 with reduce_range, i.e. [0, 127]); ``wWaA`` has ``W``-bit symmetric per-channel
weights and the default's activations (``A = 8``) or affine ones in ``[0, 2^A − 1]``. Two ways:

* **PTQ**: observers (moving-average min/max) watch the FP32 network's activations on
  ``calib_batches`` training batches, fake quantization off; then ``mpt.quant.convert``;
* **QAT**: ``mpt.quant.prepare_qat``, then ``qat_steps`` more AdamW steps through the fake
  quantizers (straight-through gradients, observers on, learning rate ``qat_lr``), observers
  frozen, ``convert``. ``fp32 + tune`` is the control: the same steps, batches and learning rate
  on the float network, i.e. what the extra training alone is worth.

Both converted models are integer-only (int32 accumulation, fixed-point requantization); their
held-out loss is measured on the integer network's dequantized logits, ``fake-quant`` on the
fake-quant network it came from. ``int = fq %`` is the share of output codes where the two agree
(``mpt.quant.convert`` bounds where a layer's codes may differ — by one, next to a rounding tie,
mostly from the int32 bias rounding — and a differing hidden code moves the logits after it).
``weight B``: weights packed at ``w`` bits plus float32 per-channel scales and int32 biases (FP32:
4 bytes per weight and bias).

**LoRA.** A GPT of the study's shape trains ``lora_base_steps`` FP32 steps on the study's chain;
the task then shifts to another chain (``corpus_seed + 1``, same vocabulary and sharpness). Every
``nn.Linear`` (attention qkv and output, MLP) gets rank-``r`` adapters (``alpha = r``, i.e.
scaling 1) over a frozen base stored in fp16, bf16, int8 (per-channel) or NF4 (blocks of 64),
trained ``lora_steps`` steps (AdamW at the study's learning rate); each adapted layer computes in
its base's compute format (fp16, bf16; bf16 for int8 and NF4, QLoRA's) and hands FP32 on to the
FP32 rest of the network. Against them: no fine-tune (the base on the new chain) and a full
FP32 fine-tune of every parameter. ``base B``: the stored frozen weights of the adapted layers
(codes and scales); ``frozen B``: everything frozen (also the FP32 embeddings and LayerNorms, the
biases in the compute format); ``train B``: FP32 trainable weights, gradients and AdamW's two
moments (16 B each, ``mpt.planning``); ``base loss old task``: the stored base alone (adapters at
B = 0) on the original chain — what storing it in the format costs. Every run trains with the
``"fp32"`` recipe's Trainer and a warm-up/cosine schedule; all use loss multiplier 1 (no 2⁻¹¹
factor: the section isolates the base format, not gradient underflow). Step counts scale with
the study's ``steps`` (:meth:`QuantStudyConfig.for_steps`; 400 gives the defaults).
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from functools import partial

import numpy as np

import mpt.functional as F
from mpt import nn
from mpt import quant as Q
from mpt._checks import check_int
from mpt._tables import markdown_table, text_table
from mpt.autograd.tensor import Tensor, no_grad
from mpt.planning import state_bytes_per_parameter
from mpt.quant import lora
from mpt.train.corpus import MarkovCorpus
from mpt.train.trainer import TrainConfig, Trainer

__all__ = ["LORA_FORMATS", "QuantStudyConfig", "QuantStudyResult", "BigramMLP", "QuantRow",
           "QatSection", "LoraRow", "LoraSection", "run_qat_vs_ptq", "run_lora", "run_quant_study",
           "format_quant_sections", "quant_markdown"]

LORA_FORMATS = ("fp16", "bf16", "int8", "nf4")
# FP32 weights, gradients and AdamW's two moments: 16 B per trainable parameter
_TRAIN_BYTES = int(state_bytes_per_parameter("fp32", "fp32", None, "adamw", "fp32")["total"])


@dataclass(frozen=True)
class QuantStudyConfig:
    """Sizes and step counts of the two sections (module docstring)."""

    hidden: int = 64
    mlp_steps: int = 600
    mlp_lr: float = 1e-2
    qat_steps: int = 100
    qat_lr: float = 1e-3
    calib_batches: int = 8
    schemes: tuple[tuple[int, int], ...] = ((8, 8), (4, 8), (4, 4))
    lora_base_steps: int = 300
    lora_steps: int = 150
    lora_ranks: tuple[int, ...] = (4, 8)
    lora_formats: tuple[str, ...] = LORA_FORMATS

    @classmethod
    def for_steps(cls, steps: int) -> "QuantStudyConfig":
        """The defaults scaled to a study of ``steps`` steps (400: the defaults above)."""
        return cls(mlp_steps=max(1, 3 * steps // 2), qat_steps=max(1, steps // 4),
                   lora_base_steps=max(1, 3 * steps // 4), lora_steps=max(1, 3 * steps // 8))

    def __post_init__(self):
        for name in ("hidden", "mlp_steps", "qat_steps", "calib_batches", "lora_base_steps",
                     "lora_steps"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), min=1))
        if not self.schemes or any(not (2 <= w <= 8 and 2 <= a <= 8) for w, a in self.schemes):
            raise ValueError(f"schemes must be (weight bits, activation bits) pairs in [2, 8]; "
                             f"got {self.schemes!r}")
        if any(f not in LORA_FORMATS for f in self.lora_formats):
            raise ValueError(f"lora_formats must be among {LORA_FORMATS}; got "
                             f"{self.lora_formats!r}")


# ---- QAT vs PTQ ----------------------------------------------------------------------------------
class BigramMLP(nn.Module):
    """``logits = fc2(relu(fc1(onehot(idx))))`` between a QuantStub and a DeQuantStub; token ids
    (B, T) → logits (B, T, V) float32 (dequantized when converted)."""

    def __init__(self, vocab: int, hidden: int, seed: int = 0):
        super().__init__()
        self.vocab = vocab
        self.quant = Q.QuantStub()
        self.fc1 = nn.Linear(vocab, hidden, seed=seed)
        self.fc2 = nn.Linear(hidden, vocab, seed=seed + 1)
        self.dequant = Q.DeQuantStub()

    def forward(self, idx) -> Tensor:
        onehot = np.eye(self.vocab, dtype=np.float32)[np.asarray(idx)]         # (B, T, V)
        h = self.fc1(self.quant(Tensor(onehot)))                               # (B, T, H)
        if isinstance(h, Tensor):  # the float network's ReLU; fused into fc1 once quantized
            h = F.relu(h)
        return self.dequant(self.fc2(h))                                       # (B, T, V)


def _scheme_name(scheme) -> str:
    return "int8" if scheme == (8, 8) else f"w{scheme[0]}a{scheme[1]}"


def _qconfig(scheme) -> Q.QConfig:
    """``(8, 8)``: PyTorch's default QAT qconfig ("fbgemm": weights qint8 symmetric per channel,
    activations quint8 with reduce_range, i.e. [0, 127]). ``(w, a)``: weights symmetric per channel
    in ``[−2^(w−1), 2^(w−1)−1]``; activations the default's for ``a = 8``, else affine in
    ``[0, 2^a − 1]``."""
    default = Q.default_qat_qconfig()
    w_bits, a_bits = scheme
    activation = default.activation if a_bits == 8 else partial(
        Q.FakeQuantize, Q.MovingAverageMinMaxObserver, quant_min=0, quant_max=2 ** a_bits - 1,
        dtype="quint8")
    weight = default.weight if w_bits == 8 else partial(
        Q.FakeQuantize, Q.MovingAveragePerChannelMinMaxObserver, quant_min=-2 ** (w_bits - 1),
        quant_max=2 ** (w_bits - 1) - 1, dtype="qint8", qscheme="per_channel_symmetric",
        ch_axis=0)
    return Q.QConfig(activation, weight)


def _fake_quantizers(network):
    return [m for m in network.modules() if isinstance(m, Q.FakeQuantize)]


def _loss(network, batches) -> float:
    """Mean held-out loss (float64 mean of fp32 batch losses) of ``network``'s logits."""
    losses = []
    with no_grad():
        for idx, targets in batches:
            logits = network(idx)                                                # (B, T, V)
            B, T, V = logits.shape
            losses.append(float(F.cross_entropy(logits.reshape(B * T, V),
                                                np.asarray(targets).reshape(-1)).item()))
    return math.fsum(losses) / len(losses)


def _train(network, data, steps: int, lr: float, seed: int, warmup: int = 20) -> Trainer:
    config = TrainConfig(lr=lr, min_lr=lr / 10, warmup_steps=min(warmup, steps), total_steps=steps,
                         betas=(0.9, 0.95), weight_decay=0.0, seed=seed)
    trainer = Trainer(network, "fp32", config)
    trainer.train(data, steps)
    return trainer


def _weight_bytes(network, bits: int | None) -> int:
    """FP32: 4 B per weight and bias; ``bits``: packed codes + float32 scales + int32 biases."""
    linears = [m for m in network.modules() if isinstance(m, nn.Linear)]
    if bits is None:
        return sum(4 * (m.weight.size + m.bias.size) for m in linears)
    return sum(math.ceil(m.weight.size * bits / 8) + 8 * m.out_features for m in linears)


def _codes_agree(int_model, fq_model, batches) -> tuple[float, int]:
    """(share of output codes where the integer network equals the fake-quant network, the largest
    difference of codes)."""
    out_fq = fq_model.fc2.activation_post_process
    same = total = worst = 0
    with no_grad():
        for idx, _ in batches:
            onehot = Tensor(np.eye(int_model.vocab, dtype=np.float32)[np.asarray(idx)])
            q_int = int_model.fc2(int_model.fc1(int_model.quant(onehot))).q.astype(np.int64)
            q_fq = out_fq.codes(fq_model(idx)).astype(np.int64)               # (B, T, V)
            same += int(np.count_nonzero(q_int == q_fq))
            worst = max(worst, int(np.abs(q_int - q_fq).max()))
            total += q_int.size
    return same / total, worst


@dataclass(frozen=True)
class QuantRow:
    """One row of the QAT vs PTQ section: the held-out ``loss`` (of the integer-only network for a
    quantized row), the bytes of its weights, and for quantized rows the fake-quant network's loss,
    the share of output codes where the integer network equals it and their largest difference."""

    loss: float
    weight_bytes: int
    fake_quant_loss: float | None = None
    int_equals_fake_quant: float | None = None
    max_code_difference: int | None = None


@dataclass(frozen=True)
class QatSection:
    """The QAT vs PTQ section: its rows by name, and its wall time."""

    rows: dict[str, QuantRow]
    seconds: float


@dataclass(frozen=True)
class LoraRow:
    """One row of the LoRA section: held-out loss on the shifted task, trainable parameters, bytes
    of the stored base weights, of everything frozen and of the training state, and the loss of
    the network before fine-tuning on the original task (the stored base alone)."""

    loss: float
    trainable: int
    base_bytes: int
    frozen_bytes: int
    train_bytes: int
    base_loss: float | None = None


@dataclass(frozen=True)
class LoraSection:
    """The LoRA section: its rows by name, the shifted chain's entropy rate, the GPT's parameter
    count and the wall time."""

    rows: dict[str, LoraRow]
    entropy_rate: float
    parameters: int
    seconds: float


def _section_dict(section) -> dict:
    """A section as JSON-ready data (rows without their empty fields)."""
    out = asdict(section)
    out["rows"] = {name: {k: v for k, v in row.items() if v is not None}
                   for name, row in out["rows"].items()}
    return out


def _quantized(fp32_model, scheme, calibrate, qat, eval_batches) -> QuantRow:
    """Prepare a copy of ``fp32_model`` under ``scheme``, calibrate (PTQ) or fine-tune (QAT), freeze
    observers, convert; the fake-quant and integer models' held-out losses."""
    network = Q.prepare_qat(copy.deepcopy(fp32_model), _qconfig(scheme), fuse_relu=("fc1",))
    if qat is None:
        for fq in _fake_quantizers(network):
            fq.disable_fake_quant()
        for idx, _ in calibrate:
            with no_grad():
                network(idx)
        for fq in _fake_quantizers(network):
            fq.enable_fake_quant()
    else:
        qat(network)
    for fq in _fake_quantizers(network):
        fq.disable_observer()
    fq_loss = _loss(network, eval_batches)
    int_model = Q.convert(copy.deepcopy(network))
    agree, worst = _codes_agree(int_model, network, eval_batches)
    return QuantRow(_loss(int_model, eval_batches), _weight_bytes(fp32_model, scheme[0]),
                    fq_loss, agree, worst)


def run_qat_vs_ptq(config: QuantStudyConfig, study_config, corpus: MarkovCorpus) -> QatSection:
    """The QAT vs PTQ section's numbers (module docstring)."""
    sc = study_config
    start = time.perf_counter()

    def data(tag):
        return lambda step, micro: corpus.batch(sc.batch, sc.seq_len, f"{tag}.{sc.seed}", step)

    evals = [corpus.batch(sc.batch, sc.seq_len, "eval", k) for k in range(sc.eval_batches)]
    network = BigramMLP(corpus.vocab, config.hidden, seed=sc.seed)
    _train(network, data("mlp"), config.mlp_steps, config.mlp_lr, sc.seed)
    calib = [corpus.batch(sc.batch, sc.seq_len, f"calib.{sc.seed}", k)
             for k in range(config.calib_batches)]
    fp32_bytes = _weight_bytes(network, None)
    rows = {"fp32": QuantRow(_loss(network, evals), fp32_bytes)}

    def tune(m):  # the QAT fine-tune; on the float network, the control (same steps and batches)
        _train(m, data("qat"), config.qat_steps, config.qat_lr, sc.seed)

    control = copy.deepcopy(network)
    tune(control)
    rows["fp32 + tune"] = QuantRow(_loss(control, evals), fp32_bytes)
    for scheme in config.schemes:
        name = _scheme_name(scheme)
        rows[f"ptq-{name}"] = _quantized(network, scheme, calib, None, evals)
        rows[f"qat-{name}"] = _quantized(network, scheme, None, tune, evals)
    return QatSection(rows, time.perf_counter() - start)


# ---- LoRA over low-precision bases ---------------------------------------------------------------
class _Fp32Out(nn.Module):
    """A LoRA layer whose output (in its compute format) is cast to FP32 for the FP32 rest of the
    network (embeddings, LayerNorms, residual stream)."""

    def __init__(self, layer: lora.LoRALinear):
        super().__init__()
        self.layer = layer

    def forward(self, x: Tensor) -> Tensor:
        return self.layer(x).to("fp32")


def _frozen_bytes(network) -> int:
    """Stored bytes of everything frozen: parameters without grad plus quantized LoRA bases."""
    params = sum(p.data.nbytes for p in network.parameters() if not p.requires_grad)
    return params + sum(m.qweight.nbytes for m in network.modules()
                        if isinstance(m, lora.LoRALinear) and m.qweight is not None)


def _lora_model(base, r: int, fmt: str, seed: int):
    """A copy of ``base`` with rank-``r`` adapters (alpha = r) on every Linear over ``fmt``."""
    network = lora.apply(copy.deepcopy(base), r=r, alpha=r, base_format=fmt, seed=seed)
    for _, module in list(network.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, lora.LoRALinear):
                wrapped = _Fp32Out(child)
                module._modules[child_name] = wrapped
                object.__setattr__(module, child_name, wrapped)
    return network


def run_lora(config: QuantStudyConfig, study_config, corpus: MarkovCorpus) -> LoraSection:
    """The LoRA section's numbers (module docstring)."""
    from mpt.nn import GPT

    sc = study_config
    start = time.perf_counter()
    shifted = MarkovCorpus(corpus.vocab, corpus.sharpness, seed=corpus.seed + 1)
    evals = [shifted.batch(sc.batch, sc.seq_len, "eval", k) for k in range(sc.eval_batches)]
    original = [corpus.batch(sc.batch, sc.seq_len, "eval", k) for k in range(sc.eval_batches)]

    def data(c, tag):
        return lambda step, micro: c.batch(sc.batch, sc.seq_len, f"{tag}.{sc.seed}", step)

    base = GPT(corpus.vocab, sc.d_model, sc.n_layers, sc.n_heads, sc.seq_len, seed=sc.seed)
    _train(base, data(corpus, "lora.base"), config.lora_base_steps, sc.lr, sc.seed)
    n_params = sum(p.size for p in base.parameters())
    linear_w = sum(m.weight.size for m in base.modules() if isinstance(m, nn.Linear))
    rows = {"no fine-tune": LoraRow(_loss(base, evals), 0, 4 * linear_w, 4 * n_params, 0,
                                    _loss(base, original))}
    full = copy.deepcopy(base)
    _train(full, data(shifted, "lora.ft"), config.lora_steps, sc.lr, sc.seed)
    rows["full fp32"] = LoraRow(_loss(full, evals), n_params, 0, 0, _TRAIN_BYTES * n_params)
    for r in config.lora_ranks:
        for fmt in config.lora_formats:
            network = _lora_model(base, r, fmt, sc.seed)
            base_loss = _loss(network, original)  # B = 0: the stored base alone
            _train(network, data(shifted, "lora.ft"), config.lora_steps, sc.lr, sc.seed)
            report = lora.trainable_parameters(network)
            rows[f"lora r={r} {fmt}"] = LoraRow(
                _loss(network, evals), report["trainable"], report["base_bytes"],
                _frozen_bytes(network), _TRAIN_BYTES * report["trainable"], base_loss)
    return LoraSection(rows, shifted.entropy_rate, n_params, time.perf_counter() - start)


@dataclass
class QuantStudyResult:
    config: QuantStudyConfig
    entropy_rate: float
    qat: QatSection
    lora: LoraSection

    def to_dict(self) -> dict:
        return {"config": asdict(self.config), "entropy_rate": self.entropy_rate,
                "qat_vs_ptq": _section_dict(self.qat), "lora": _section_dict(self.lora)}


def run_quant_study(study_config, config: QuantStudyConfig = QuantStudyConfig()):
    """Both sections on the study's Markov corpus (``study_config``: a ``StudyConfig``)."""
    corpus = MarkovCorpus(study_config.vocab, study_config.sharpness,
                          seed=study_config.corpus_seed)
    return QuantStudyResult(config, corpus.entropy_rate, run_qat_vs_ptq(config, study_config,
                                                                         corpus),
                            run_lora(config, study_config, corpus))


# ---- text ----------------------------------------------------------------------------------------
def _qat_rows(result) -> list[tuple[str, ...]]:
    rows = result.qat.rows
    fp32 = rows["fp32"].loss
    out = [("model", "loss", "gap fp32", "gap H", "fake-quant", "int = fq %", "weight B")]
    for name, row in rows.items():
        quantized = row.fake_quant_loss is not None
        out.append((name, f"{row.loss:.4f}", f"{row.loss - fp32:+.4f}",
                    f"{row.loss - result.entropy_rate:+.4f}",
                    f"{row.fake_quant_loss:.4f}" if quantized else "-",
                    f"{100 * row.int_equals_fake_quant:.2f}" if quantized else "-",
                    str(row.weight_bytes)))
    return out


def _lora_rows(result) -> list[tuple[str, ...]]:
    rows = result.lora.rows
    full = rows["full fp32"].loss
    out = [("fine-tune", "loss", "gap full", "trainable", "base B", "frozen B", "train B",
            "base loss old task")]
    for name, row in rows.items():
        out.append((name, f"{row.loss:.4f}", f"{row.loss - full:+.4f}", str(row.trainable),
                    str(row.base_bytes), str(row.frozen_bytes), str(row.train_bytes),
                    f"{row.base_loss:.4f}" if row.base_loss is not None else "-"))
    return out


def _titles(result) -> tuple[str, str]:
    c = result.config
    q = (f"QAT vs PTQ: bigram MLP (hidden {c.hidden}) trained {c.mlp_steps} FP32 steps; PTQ "
         f"calibrated on {c.calib_batches} batches, QAT {c.qat_steps} steps; integer-only models "
         f"(H = {result.entropy_rate:.4f}; {result.qat.seconds:.1f} s)")
    lo = (f"LoRA: GPT trained {c.lora_base_steps} FP32 steps, task shifted to another chain "
          f"(H = {result.lora.entropy_rate:.4f}), {c.lora_steps} fine-tune steps "
          f"({result.lora.seconds:.1f} s)")
    return q, lo


def format_quant_sections(result) -> str:
    """The two sections as aligned text."""
    q, lo = _titles(result)
    return "\n".join([q, text_table(_qat_rows(result), numeric=True), "", lo,
                      text_table(_lora_rows(result), numeric=True)])


def quant_markdown(result) -> str:
    """The two sections as markdown (for report.md)."""
    q, lo = _titles(result)
    return "\n".join(["## QAT vs post-training quantization", "", q, "",
                      markdown_table(_qat_rows(result)), "", "## LoRA over low-precision bases",
                      "", lo, "", markdown_table(_lora_rows(result)), "",
                      "Setup and columns: `python -c \"import mpt.study.quant; "
                      "help(mpt.study.quant)\"`.", ""])
