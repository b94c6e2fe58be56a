"""L5: the study's configuration: workload, recipes, target (the package docstring gives the
defaults' reasons)."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from mpt._checks import check_bool, check_int
from mpt.amp.recipes import get_recipe, recipes_for
from mpt.targets import get_target
from mpt.train.trainer import TrainConfig

__all__ = ["StudyConfig"]

def attention_backend(recipes) -> str:
    """"flash" when the flash kernels run every recipe's GEMM model (NVIDIA, the CPU), else
    "naive" for all recipes alike (AMD, TPU, Gaudi, Trainium: their models run through
    mpt.gemm), so that rows compared with each other differ by their recipes alone."""
    return "flash" if all(r.flash_attention for r in recipes) else "naive"


@dataclass(frozen=True)
class StudyConfig:
    """Everything a study run depends on (see the module docstring for the defaults' reasons)."""

    recipes: tuple[str, ...] | None = None
    target: str = "h100"
    steps: int = 400
    vocab: int = 32
    sharpness: int = 8
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    seq_len: int = 16
    batch: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    global_batch_tokens: int = 2 ** 19
    eval_batches: int = 8
    seed: int = 0
    corpus_seed: int = 0
    text: str | None = None
    quant: bool = True
    attention: str | None = None
    compare_targets: tuple[str, ...] = ()

    def __post_init__(self):
        target = get_target(self.target)
        object.__setattr__(self, "target", target.name)
        if self.recipes is None:   # every built-in recipe the target can run
            names = recipes_for(target)
        else:
            names = [get_recipe(r).name for r in self.recipes]
        object.__setattr__(self, "recipes", tuple(get_recipe(r, target).name for r in names))
        if not self.recipes:
            raise ValueError("recipes must name at least one recipe")
        object.__setattr__(self, "attention", self._attention_backend(target))
        for name in ("steps", "d_model", "n_layers", "n_heads", "seq_len", "batch",
                     "eval_batches", "global_batch_tokens", "sharpness"):
            object.__setattr__(self, name, check_int(name, getattr(self, name), min=1))
        object.__setattr__(self, "vocab", check_int("vocab", self.vocab, min=2))
        object.__setattr__(self, "corpus_seed",
                           check_int("corpus_seed", self.corpus_seed, min=0, max=2**64 - 1))
        object.__setattr__(self, "quant", check_bool("quant", self.quant))
        object.__setattr__(self, "compare_targets",
                           tuple(get_target(t).name for t in self.compare_targets))
        if self.text is not None and not isinstance(self.text, (str, os.PathLike)):
            raise TypeError(f"text must be None or a file path; got {type(self.text).__name__}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads={self.n_heads} must divide d_model={self.d_model}")
        if self.global_batch_tokens < self.micro_tokens:
            raise ValueError(f"global_batch_tokens ({self.global_batch_tokens}) must be at least "
                             f"the micro-batch's {self.micro_tokens} tokens")
        self.train_config()          # checks lr, min_lr, warmup_steps, betas, weight_decay, seed

    def _attention_backend(self, target) -> str:
        """``attention``: "flash" or "naive"; None picks :func:`attention_backend` of the
        recipes on ``target``."""
        if self.attention is not None:
            if self.attention not in ("flash", "naive"):
                raise ValueError(f"attention must be None, 'flash' or 'naive'; got "
                                 f"{self.attention!r}")
            return self.attention
        return attention_backend(get_recipe(r, target) for r in self.recipes)

    @property
    def micro_tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def loss_multiplier(self) -> float:
        """``micro_tokens / global_batch_tokens`` (module docstring)."""
        return self.micro_tokens / self.global_batch_tokens

    def detail_steps(self) -> tuple[int, ...]:
        return tuple(sorted({1, max(1, self.steps // 2), self.steps}))

    def train_config(self) -> TrainConfig:
        return TrainConfig(lr=self.lr, min_lr=self.min_lr, warmup_steps=self.warmup_steps,
                           total_steps=self.steps, betas=self.betas, eps=1e-8,
                           weight_decay=self.weight_decay, loss_multiplier=self.loss_multiplier,
                           seed=self.seed, detail_steps=self.detail_steps())

    def describe(self) -> dict:
        out = dataclasses.asdict(self)
        out["loss_multiplier"] = self.loss_multiplier
        return out

