"""L5: ``mpt study --grid`` — recipes × seeds × model sizes × learning rates, one task per cell.

**The grid.** A :class:`GridConfig` names the recipes, the seeds, the model sizes (``d_model``,
``n_layers``, ``n_heads``: a name of :data:`MODEL_SIZES` or an explicit triple ``"D:L:H"``) and
the learning rates; everything else of the workload (steps, target, corpus, batch, context, the
shape of the schedule) is its ``study`` :class:`~mpt.study.StudyConfig`'s. A *cell* is one point
of the grid: it trains the study's GPT under one recipe, from one seed, at one size and learning
rate (``min_lr = min_lr_ratio · lr``, the study's 3e-4 / 3e-3 by default), exactly as
:func:`mpt.study.run_recipe` does for :meth:`GridConfig.cell_config`. The quantization sections
of the study are not part of a grid.

**Seeds.** A cell's run seed (the initialisation, the order of the training batches and the
stochastic-rounding key: ``StudyConfig.seed``) is :func:`cell_seed` of its seed coordinate ``s``:
``derive_seed("seed", s)``, the first 8 bytes, read little-endian, of the BLAKE2b digest of the
canonical JSON ``["mpt.study.grid/1", "seed", s]`` — stable across Python versions and machines,
unlike ``hash()``. The recipe, size and learning rate do not enter it, on purpose: every recipe,
size and learning rate of one seed sees the same batches and the same stochastic-rounding key
(and, at one size, the same initialisation), so that a difference between two recipes at one
seed is the recipes' alone (common random numbers); the seeds are the replicates whose scatter
measures the noise (:mod:`mpt.study.aggregate`). The chain of the Markov corpus is the study's
``corpus_seed`` for every cell: one task, one best achievable loss.

**Running.** :func:`run_grid` maps :func:`run_cell` over the cells with
:func:`mpt.tasks.map_tasks`: serially in this process, on a local Dask cluster of ``workers``
processes, or on an existing one (``scheduler``). A cell runs in a fresh context (every state of
:mod:`mpt.autograd.context` at its default: grad mode on, no autocast region, dropout generator
``(0, 0)``, no hooks) with Numba on one thread, so its result does not depend on the process, the
worker or the order the cells run in: the grid's ``study.json`` on a cluster is bit for bit the
serial one's, wall times aside (``tests/test_study_grid.py``).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass, field

from mpt._checks import check_int, check_real
from mpt.amp.recipes import get_recipe
from mpt.autograd.context import Snapshot, replay
from mpt.study.aggregate import Comparison, SeedStats, aggregate, compare_with
from mpt.study.config import StudyConfig
from mpt.study.run import RecipeRun, StudyResult, _corpus, run_recipe
from mpt.tasks import map_tasks

__all__ = ["ModelSize", "MODEL_SIZES", "model_size", "SEED_DERIVATION", "derive_seed",
           "cell_seed", "GridCell", "GridConfig", "GridResult", "run_cell", "run_grid"]


@dataclass(frozen=True)
class ModelSize:
    """A GPT shape of the grid: ``name`` (a label) and ``d_model``, ``n_layers``, ``n_heads``."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise TypeError(f"model size name must be a non-empty str; got {self.name!r}")
        for key in ("d_model", "n_layers", "n_heads"):
            object.__setattr__(self, key, check_int(key, getattr(self, key), min=1))
        if self.d_model % self.n_heads:
            raise ValueError(f"model size {self.name}: n_heads={self.n_heads} must divide "
                             f"d_model={self.d_model}")

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.d_model, self.n_layers, self.n_heads

    def label(self) -> str:
        """``"small (32:1:2)"``; an explicit triple is its own name."""
        triple = ":".join(map(str, self.shape))
        return triple if self.name == triple else f"{self.name} ({triple})"


#: The named sizes; ``base`` is the study's default network (the grid's default size is
#: ``small``: a grid runs every recipe several times).
MODEL_SIZES = {s.name: s for s in (ModelSize("tiny", 16, 1, 2), ModelSize("small", 32, 1, 2),
                                   ModelSize("base", 64, 2, 4), ModelSize("large", 128, 4, 8))}


def model_size(spec) -> ModelSize:
    """A :class:`ModelSize` from one, a name of :data:`MODEL_SIZES`, a triple ``(d_model,
    n_layers, n_heads)`` or its text ``"D:L:H"`` (named ``"D:L:H"``)."""
    if isinstance(spec, ModelSize):
        return spec
    if isinstance(spec, str) and spec in MODEL_SIZES:
        return MODEL_SIZES[spec]
    if isinstance(spec, str) and spec.count(":") == 2:
        parts = spec.split(":")
        if all(p.strip().isdigit() for p in parts):
            spec = tuple(int(p) for p in parts)
    if isinstance(spec, (tuple, list)) and len(spec) == 3:
        return ModelSize(":".join(str(v) for v in spec), *spec)
    raise ValueError(f"model size must be one of {', '.join(MODEL_SIZES)} or d_model:n_layers:"
                     f"n_heads (e.g. 64:2:4); got {spec!r}")


SEED_DERIVATION = "mpt.study.grid/1"


def derive_seed(*coordinates) -> int:
    """A seed in ``[0, 2**64)`` from grid coordinates (ints, strings, floats): the first 8 bytes,
    little-endian, of ``blake2b(C([SEED_DERIVATION, *coordinates]))`` with ``C`` the canonical
    JSON (no spaces, ASCII, no NaN/Inf)."""
    text = json.dumps([SEED_DERIVATION, *coordinates], separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)
    return int.from_bytes(hashlib.blake2b(text.encode("ascii"), digest_size=8).digest(), "little")


def cell_seed(seed: int) -> int:
    """The run seed of the cells of seed coordinate ``seed`` (module docstring)."""
    return derive_seed("seed", check_int("seed", seed, min=0))


@dataclass(frozen=True)
class GridCell:
    """One point of the grid; ``run_seed`` is :func:`cell_seed` of ``seed``."""

    recipe: str
    seed: int
    size: ModelSize
    lr: float

    @property
    def run_seed(self) -> int:
        return cell_seed(self.seed)

    def describe(self) -> dict:
        return {"recipe": self.recipe, "seed": self.seed, "run_seed": self.run_seed,
                "size": dataclasses.asdict(self.size), "lr": self.lr}


def _unique(name: str, values: tuple, key=lambda v: v) -> tuple:
    if not values:
        raise ValueError(f"{name} must name at least one value")
    seen = [key(v) for v in values]
    twice = sorted({repr(k) for k in seen if seen.count(k) > 1})
    if twice:
        raise ValueError(f"{name} holds the same value twice: {', '.join(twice)}")
    return values


def _sequence(name: str, values) -> tuple:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise TypeError(f"{name} must be a sequence; got {type(values).__name__} {values!r}")
    return tuple(values)


#: Fields of the study's config that the grid sets per cell.
_PER_CELL = ("recipes", "seed", "d_model", "n_layers", "n_heads", "lr", "min_lr", "quant")


@dataclass(frozen=True)
class GridConfig:
    """The axes of a grid and the workload of its cells (module docstring).

    ``recipes`` None: the study's default (every built-in recipe the target runs); ``baseline``:
    the recipe the others are compared with (None: ``"fp32"`` when in the grid, else the first
    recipe); ``study``: the rest of the workload (its recipes, seed, model size, learning rates
    and quant are replaced per cell).
    """

    recipes: tuple[str, ...] | None = None
    seeds: tuple[int, ...] = (0, 1, 2)
    sizes: tuple = ("small",)
    lrs: tuple[float, ...] = (3e-3,)
    study: StudyConfig = field(default_factory=lambda: StudyConfig(quant=False))
    baseline: str | None = None
    min_lr_ratio: float = 0.1

    def __post_init__(self):
        if not isinstance(self.study, StudyConfig):
            raise TypeError(f"study must be a StudyConfig; got {type(self.study).__name__}")
        recipes = None if self.recipes is None else _sequence("recipes", self.recipes)
        recipes = dataclasses.replace(self.study, recipes=recipes, quant=False).recipes
        seeds = tuple(check_int(f"seeds[{i}]", s, min=0, max=2**64 - 1)
                      for i, s in enumerate(_sequence("seeds", self.seeds)))
        sizes = tuple(model_size(s) for s in _sequence("sizes", self.sizes))
        lrs = tuple(check_real(f"lrs[{i}]", v, gt=0)
                    for i, v in enumerate(_sequence("lrs", self.lrs)))
        object.__setattr__(self, "recipes", _unique("recipes", recipes))
        object.__setattr__(self, "seeds", _unique("seeds", seeds))
        object.__setattr__(self, "sizes", _unique("sizes", sizes, lambda s: s.shape))
        _unique("sizes", sizes, lambda s: s.name)
        object.__setattr__(self, "lrs", _unique("lrs", lrs))
        object.__setattr__(self, "min_lr_ratio",
                           check_real("min_lr_ratio", self.min_lr_ratio, min=0, max=1))
        baseline = self.baseline
        if baseline is None:
            baseline = "fp32" if "fp32" in recipes else recipes[0]
        elif baseline not in recipes:
            raise ValueError(f"baseline must be one of the grid's recipes {list(recipes)}; got "
                             f"{baseline!r}")
        object.__setattr__(self, "baseline", baseline)
        for cell in self.cells()[::len(recipes)]:     # every size and lr checked by StudyConfig
            self.cell_config(cell)

    def cells(self) -> list[GridCell]:
        """Every cell, sizes outermost, then learning rates, seeds, and recipes innermost."""
        return [GridCell(r, s, size, lr) for size in self.sizes for lr in self.lrs
                for s in self.seeds for r in self.recipes]

    def cell_config(self, cell: GridCell) -> StudyConfig:
        """The study configuration of one cell (run it with ``run_recipe(config, cell.recipe)``)."""
        return dataclasses.replace(
            self.study, recipes=(cell.recipe,), seed=cell.run_seed, d_model=cell.size.d_model,
            n_layers=cell.size.n_layers, n_heads=cell.size.n_heads, lr=cell.lr,
            min_lr=cell.lr * self.min_lr_ratio, quant=False)

    def describe(self) -> dict:
        study = {k: v for k, v in self.study.describe().items() if k not in _PER_CELL}
        return {"recipes": list(self.recipes), "seeds": list(self.seeds),
                "sizes": [dataclasses.asdict(s) for s in self.sizes], "lrs": list(self.lrs),
                "baseline": self.baseline, "min_lr_ratio": self.min_lr_ratio,
                "seed_derivation": SEED_DERIVATION, "study": study}


def run_cell(config: GridConfig, cell: GridCell) -> RecipeRun:
    """Train one cell, in a fresh context (module docstring); the task of :func:`run_grid`."""
    with replay(Snapshot(())):
        return run_recipe(config.cell_config(cell), cell.recipe)


@dataclass
class GridResult:
    """The cells of a grid and their runs (``runs[i]`` is ``cells[i]``'s)."""

    config: GridConfig
    corpus: dict
    cells: list
    runs: list

    def stats(self) -> list[SeedStats]:
        """Final held-out loss over the seeds per (size, lr, recipe)
        (:mod:`~mpt.study.aggregate`)."""
        return aggregate((c.size.label(), c.lr, c.recipe, r.final_loss)
                         for c, r in zip(self.cells, self.runs))

    def comparisons(self) -> list[Comparison]:
        """Every recipe against the baseline at each size and learning rate."""
        return compare_with(self.stats(), self.config.baseline)

    def run_dict(self, i: int) -> dict:
        """Cell ``i``'s run as the study's ``study.json`` writes a run, with the cell's
        coordinates (``recipe`` is the recipe's name; ``to_dict()["recipes"]`` describes it)."""
        cell, run = self.cells[i], self.runs[i]
        single = StudyResult(self.config.cell_config(cell), self.corpus, {cell.recipe: run})
        return {**single.to_dict()["runs"][cell.recipe], **cell.describe()}

    def to_dict(self) -> dict:
        return {"grid": self.config.describe(), "corpus": self.corpus,
                "recipes": {name: get_recipe(name).describe() for name in self.config.recipes},
                "aggregate": {"metric": "final_loss", "baseline": self.config.baseline,
                              "spread": "max - min over the seeds",
                              "exceeds": "|mean - mean of the baseline| > the larger of the two "
                                         "spreads; null with fewer than two seeds",
                              "stats": [s.to_dict() for s in self.stats()],
                              "comparisons": [c.to_dict() for c in self.comparisons()]},
                "cells": [self.run_dict(i) for i in range(len(self.cells))]}


def run_grid(config: GridConfig = None, *, workers: int | None = None, scheduler=None,
             progress: bool = False) -> GridResult:
    """Run every cell of ``config`` (default ``GridConfig()``): serially in this process, on a
    local Dask cluster of ``workers`` processes, or on the cluster of ``scheduler`` (an address
    or a ``distributed.Client``) — one task per cell, the same bits in every case. A progress bar
    counts the cells when ``progress``."""
    config = GridConfig() if config is None else config
    if not isinstance(config, GridConfig):
        raise TypeError(f"config must be a GridConfig; got {type(config).__name__}")
    cells = config.cells()
    runs = map_tasks(functools.partial(run_cell, config), cells, workers=workers,
                     scheduler=scheduler, progress=progress, desc="grid", unit="cell")
    return GridResult(config, _corpus(config.study).describe(), cells, runs)
