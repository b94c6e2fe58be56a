"""L5: a grid's results over its seeds, and which recipe differences exceed the seeds' spread.

**Statistics.** For each (model size, learning rate, recipe) the final held-out losses of the ``n``
seeds give ``mean`` (``math.fsum`` of the values divided by ``n``: the exactly rounded sum, so the
mean does not depend on the order of the seeds), ``min``, ``max`` and the **spread**
``max − min``, the range over the seeds (0 for one seed).

**Which differences exceed the spread.** At each size and learning rate every recipe is compared
with the baseline recipe: ``difference = mean(recipe) − mean(baseline)``, and the difference
*exceeds the spread* when ``|difference| > max(spread(recipe), spread(baseline))`` — the two
recipes' means are further apart than the seeds of either scatter. With one seed (or fewer seeds
than two for either recipe) there is no spread to measure, and no decision (``exceeds`` is None).

Why the range and not the sample standard deviation: a grid affords few seeds (3–5), where a
standard deviation is itself a noisy estimate and a threshold on it (2σ, say) assumes a normal
distribution; the range assumes nothing, and adding a seed can only widen it. It is a screen, not
a significance test: "exceeds" says the recipe moved the loss by more than changing the seed
does, which is what the study's single-run claims ("close to fp32", "ends worse") mean.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

__all__ = ["SeedStats", "Comparison", "seed_stats", "aggregate", "compare", "compare_with"]


@dataclass(frozen=True)
class SeedStats:
    """One (size, lr, recipe) over its seeds: ``n``, ``mean``, ``min``, ``max``; ``spread`` is
    ``max − min``."""

    size: str
    lr: float
    recipe: str
    n: int
    mean: float
    min: float
    max: float

    @property
    def spread(self) -> float:
        return self.max - self.min

    def to_dict(self) -> dict:
        return {**asdict(self), "spread": self.spread}


@dataclass(frozen=True)
class Comparison:
    """``recipe`` against ``baseline`` at one size and learning rate: ``difference`` of the
    means, ``spread`` the larger of the two spreads, ``exceeds`` whether ``|difference| >
    spread`` (None with fewer than two seeds)."""

    size: str
    lr: float
    recipe: str
    baseline: str
    difference: float
    spread: float
    exceeds: bool | None

    def to_dict(self) -> dict:
        return asdict(self)


def seed_stats(size: str, lr: float, recipe: str, values) -> SeedStats:
    """The statistics of one (size, lr, recipe) from its values over the seeds."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"{recipe} at size {size}, lr {lr:g}: no values to aggregate")
    return SeedStats(size, lr, recipe, len(values), math.fsum(values) / len(values), min(values),
                     max(values))


def aggregate(rows) -> list[SeedStats]:
    """:class:`SeedStats` of ``(size, lr, recipe, value)`` rows grouped by (size, lr, recipe),
    in the order each group first appears."""
    groups: dict[tuple, list] = {}
    for size, lr, recipe, value in rows:
        groups.setdefault((size, lr, recipe), []).append(value)
    return [seed_stats(*key, values) for key, values in groups.items()]


def compare(stats: SeedStats, base: SeedStats) -> Comparison:
    """``stats``' recipe against ``base``'s (same size and learning rate; module docstring)."""
    if (stats.size, stats.lr) != (base.size, base.lr):
        raise ValueError(f"compare needs one size and learning rate; got {stats.size}/"
                         f"{stats.lr:g} and {base.size}/{base.lr:g}")
    difference = stats.mean - base.mean
    spread = max(stats.spread, base.spread)
    exceeds = abs(difference) > spread if min(stats.n, base.n) >= 2 else None
    return Comparison(stats.size, stats.lr, stats.recipe, base.recipe, difference, spread,
                      exceeds)


def compare_with(stats: list[SeedStats], baseline: str) -> list[Comparison]:
    """Every recipe but ``baseline`` against it, at each size and learning rate where the
    baseline ran, in the order of ``stats``."""
    bases = {(s.size, s.lr): s for s in stats if s.recipe == baseline}
    return [compare(s, bases[(s.size, s.lr)]) for s in stats
            if s.recipe != baseline and (s.size, s.lr) in bases]
