"""L2: conversion rules — how a target rounds op results into narrower formats, beyond RNE.

Every op rounds its result once into its format with ``round_to`` (:mod:`mpt.autograd.tensor`).
On most chips that is round-to-nearest-even; some convert differently, and a recipe run on them
says so with :class:`ConversionRules` in effect (``with conversion_rules(rules):``; the trainer
sets them around each step from the recipe and its target):

* ``flush_subnormals``: formats whose conversions flush a subnormal result to zero, sign kept
  (a TPU's f32→bf16: rounded first, then flushed — ``mpt.round(..., subnormals=False)``);
* ``stochastic``: formats whose conversions round stochastically instead (Neuron's
  ``NEURON_RT_STOCHASTIC_ROUNDING_EN=1``, on under ``XLA_USE_BF16``). The random source is mpt's
  Philox stream — keyed by ``seed``; conversion number ``n`` of ``step`` (counted in this
  thread from where the rules were set) uses stream ``2^63 | step·2^32 | n``, element i word i
  (the optimizer's stochastic copy-down uses streams below 2^63, so the two never share words).

The counter is a replayed context state: gradient checkpointing recomputes a segment with the
streams of its forward pass, so the recomputed values are the forward's, bit for bit. Only
``"nearest_even"`` conversions are changed; an op that asks for another mode keeps it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from mpt._checks import check_int
from mpt.autograd.context import State
from mpt.formats import get_format
from mpt.rounding import round as _round

__all__ = ["ConversionRules", "conversion_rules", "current_rules", "convert"]


@dataclass(frozen=True)
class ConversionRules:
    """The rules of the module docstring: format names, the Philox ``seed`` and ``step``."""

    flush_subnormals: tuple[str, ...] = ()
    stochastic: tuple[str, ...] = ()
    seed: int = 0
    step: int = 0

    def __post_init__(self):
        for name in ("flush_subnormals", "stochastic"):
            object.__setattr__(self, name,
                               tuple(get_format(f).name for f in getattr(self, name)))
        check_int("seed", self.seed, min=0, max=2**64 - 1)
        check_int("step", self.step, min=0, max=2**31 - 1)

    @property
    def formats(self) -> frozenset:
        return frozenset(self.flush_subnormals) | frozenset(self.stochastic)


_RULES = State("conversion_rules", None)
_COUNT = State("conversion_count", 0)


@contextlib.contextmanager
def conversion_rules(rules: ConversionRules | None):
    """Context manager: ``rules`` (None: plain RNE) for every conversion in the block, the
    stochastic-rounding count starting at 0."""
    if rules is not None and not isinstance(rules, ConversionRules):
        raise TypeError(f"rules must be a ConversionRules or None; got {type(rules).__name__}")
    with _RULES.scoped(rules), _COUNT.scoped(0):
        yield rules


def current_rules() -> ConversionRules | None:
    return _RULES.get()


def convert(x: np.ndarray, fmt, rules: ConversionRules) -> np.ndarray:
    """x (float32/float64) rounded to ``fmt`` under ``rules`` (a format they name)."""
    if fmt.name in rules.stochastic:
        count = _COUNT.set(_COUNT.get() + 1)                      # this conversion's number
        stream = (1 << 63) | (rules.step << 32) | (count & 0xFFFFFFFF)
        return np.asarray(_round(x, fmt, "stochastic", seed=rules.seed, stream=stream,
                                 subnormals=fmt.name not in rules.flush_subnormals))
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(_round(x, fmt, subnormals=False))
