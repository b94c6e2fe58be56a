"""mpt.training: the Trainer sets each recipe up as its data says, composes the step in PyTorch's
order (bit-equal to the hand-written loop), and accumulates gradients exactly."""
import math

import numpy as np
import pytest

import mpt.functional as F
from mpt import nn
from mpt.amp import GradScaler, StaticLossScale
from mpt.amp.linear import BlockScaledLinear, Fp8Linear, Tf32Linear
from mpt.amp.recipes import LossScaling, get_recipe, recipe_names
from mpt.optim import AdamW
from mpt.train.corpus import MarkovCorpus
from mpt.train.trainer import StepMetrics, TrainConfig, Trainer, learning_rate

CORPUS = MarkovCorpus(16, 8, seed=0)


def _gpt(seed=0, width=16, backend="flash"):
    return nn.GPT(16, width, 1, 2, 8, seed=seed, backend=backend)


def _batch(index, batch=4):
    return CORPUS.batch(batch, 8, "train", index)


def _same_bits(a, b):
    """Whether two models hold the same parameter bits."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(np.array_equal(sa[k].view(np.uint8),
                                                         sb[k].view(np.uint8)) for k in sa)


@pytest.mark.parametrize("name", recipe_names())
def test_trainer_sets_up_the_recipe(name):
    recipe = get_recipe(name)
    backend = "flash" if recipe.flash_attention else "naive"
    trainer = Trainer(_gpt(width=32 if recipe.block_scaled else 16, backend=backend),  # MX: 32
                      name)
    assert {p.format.name for p in trainer.network.parameters()} == {recipe.param_format}
    assert trainer.optimizer.master_weights == (recipe.master_format is not None)
    assert trainer.optimizer.rounding == recipe.rounding
    scaler = {"none": type(None), "dynamic": GradScaler}[recipe.loss_scaling.kind]
    assert type(trainer.scaler) is scaler
    linears = [m for m in trainer.network.modules()
               if isinstance(m, (Fp8Linear, Tf32Linear, BlockScaledLinear))]
    kind = Fp8Linear if recipe.fp8 else Tf32Linear if recipe.compute_format == "tf32" else \
        BlockScaledLinear if recipe.block_scaled else None
    assert len(linears) == (4 if kind else 0) and all(type(m) is kind for m in linears)
    assert len(trainer.fp8_layers) == (4 if recipe.fp8 else 0)
    m = trainer.train_step([_batch(0)])
    assert m.step == 1 and np.isfinite(m.loss) and trainer.history == [m]


def test_static_loss_scaling():
    recipe = get_recipe("fp16-o2").replace(name="fp16-static",
                                           loss_scaling=LossScaling("static", init_scale=1024.0))
    trainer = Trainer(_gpt(), recipe)
    assert type(trainer.scaler) is StaticLossScale
    assert trainer.train_step([_batch(0)]).scale == 1024.0


def test_fp32_step_equals_the_hand_written_loop():
    config = TrainConfig(lr=3e-3, betas=(0.9, 0.95), loss_multiplier=2.0**-6)
    trainer = Trainer(_gpt(), "fp32", config)
    model = _gpt()
    opt = AdamW(model.named_parameters(), lr=3e-3, betas=(0.9, 0.95), fused=True)
    for step in range(3):
        idx, tgt = _batch(step)
        metrics = trainer.train_step([(idx, tgt)])
        opt.zero_grad()
        logits = model(idx)                                          # (4, 8, 16)
        loss = F.cross_entropy(logits.reshape(32, 16), tgt.reshape(-1))
        (loss * 2.0**-6).backward()
        opt.step()
        assert metrics.loss == loss.item()
    assert _same_bits(trainer.network, model)


def test_gradient_accumulation_is_exact():
    # two micro-batches equal to the whole batch: g/2 + g/2 = g exactly, so one step of each
    # gives the same bits (a wrong micro-batch divisor or order would show)
    config = TrainConfig(lr=1e-2, grad_accum=2, loss_multiplier=2.0**-4)
    a = Trainer(_gpt(), "bf16-amp", config)
    b = Trainer(_gpt(), "bf16-amp", TrainConfig(lr=1e-2, loss_multiplier=2.0**-4))
    for step in range(2):
        ma = a.train_step([_batch(step), _batch(step)])
        mb = b.train_step([_batch(step)])
        assert ma.loss == mb.loss
    assert _same_bits(a.model, b.model)
    wrong = Trainer(_gpt(), "bf16-amp", TrainConfig(lr=1e-2, grad_accum=2))
    wrong.train_step([_batch(0), _batch(1)])
    assert not _same_bits(wrong.model, b.model)
    with pytest.raises(ValueError, match="grad_accum=2"):
        a.train_step([_batch(0)])


def test_clipping():
    with pytest.raises(ValueError, match="fp16 gradients"):
        Trainer(_gpt(), "fp16-o2", TrainConfig(clip_grad_norm=1.0))
    trainer = Trainer(_gpt(), "fp16-amp", TrainConfig(clip_grad_norm=1e-3))
    m = trainer.train_step([_batch(0)])
    assert m.grad_norm is not None and m.grad_norm > 1e-3       # unscaled norm, then clipped
    assert m.grad_norm < 100.0


def test_learning_rate_schedule():
    c = TrainConfig(lr=1.0, min_lr=0.1, warmup_steps=4, total_steps=14)
    assert [learning_rate(c, s) for s in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert learning_rate(c, 9) == 0.1 + 0.45 * (1 + math.cos(math.pi / 2))
    assert learning_rate(c, 14) == learning_rate(c, 20) == 0.1
    assert learning_rate(TrainConfig(lr=0.5), 100) == 0.5
    for bad in ({"grad_accum": 0}, {"loss_multiplier": 0.0}, {"clip_grad_norm": -1.0},
                {"total_steps": 0}, {"warmup_steps": -1}):
        with pytest.raises(ValueError):
            TrainConfig(**bad)


def test_metrics_of_fp16_without_scaling_show_the_flushed_gradients():
    config = TrainConfig(lr=3e-3, loss_multiplier=2.0**-20, detail_steps=(1,))
    m = Trainer(_gpt(), "fp16-noscale", config).train_step([_batch(0)])
    assert m.loss_grad.format == "fp16" and m.loss_grad.numel == 32 * 16
    assert m.loss_grad.underflow > 0 and m.grad_zeros > 0
    assert m.histograms["loss_grad"].total == 32 * 16
    # per tensor: fp16 gradients cast to fp16 lose nothing more; their zeros are the step's
    assert set(m.tensors) == {n for n, _ in Trainer(_gpt(), "fp32").network.named_parameters()}
    assert all(s.underflow == 0 and s.format == "fp16" for s in m.tensors.values())
    assert sum(s.numel - s.nonzero - s.nonfinite for s in m.tensors.values()) == m.grad_zeros
    assert m.histograms["params"].zeros == m.grad_zeros
    scaled = Trainer(_gpt(), "fp16-amp", config).train_step([_batch(0)])
    assert scaled.loss_grad.underflow == 0 and scaled.scale == 2.0**16
    assert StepMetrics.from_dict(m.to_dict()) == m


def test_evaluate_is_the_mean_batch_loss():
    trainer = Trainer(_gpt(), "bf16-amp")
    batches = [_batch(i) for i in range(3)]
    losses = [trainer._logits_and_loss(i, t)[1].item() for i, t in batches]
    assert trainer.evaluate(batches) == math.fsum(losses) / 3
    assert trainer.network.training


def test_evaluate_leaves_the_fp8_state_alone():
    trainer = Trainer(_gpt(), "fp8-hybrid")
    trainer.train_step([_batch(0)])
    before = {n: layer.fp8_state_dict() for n, layer in trainer.fp8_layers.items()}
    assert np.isfinite(trainer.evaluate([_batch(5, batch=8)]))
    for name, layer in trainer.fp8_layers.items():
        for role, state in layer.fp8_state_dict().items():
            assert state["scale"] == before[name][role]["scale"]
            assert np.array_equal(state["amax_history"], before[name][role]["amax_history"])
