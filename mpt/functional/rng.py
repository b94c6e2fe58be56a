"""L3: the dropout generator — a thread-local (seed, counter) context state.

Each dropout call takes Philox stream ``counter`` under ``seed`` and advances the counter, so a run
is reproducible and :func:`set_rng_state` replays it (checkpoint recomputation replays it through
the context registry, ``mpt.autograd.context``).
"""
from __future__ import annotations

from mpt._checks import check_int
from mpt.autograd.context import State

__all__ = ["RNG", "manual_seed", "get_rng_state", "set_rng_state", "next_stream"]

#: The dropout generator: (seed, counter), thread-local; each dropout call takes Philox stream
#: ``counter`` under ``seed`` (a context state, replayed by checkpoint recomputation).
RNG = State("dropout_rng", (0, 0))


def manual_seed(seed: int) -> None:
    """Seed the dropout generator (Philox key) and restart its per-call counter at 0."""
    RNG.set((check_int("seed", seed, min=0, max=2**64 - 1), 0))


def get_rng_state() -> tuple:
    """``(seed, counter)``: the next dropout call uses Philox stream ``counter`` under ``seed``."""
    return RNG.get()


def set_rng_state(state: tuple) -> None:
    """Restore a state from :func:`get_rng_state` (e.g. to recompute a checkpointed forward)."""
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"state must be a (seed, counter) pair from get_rng_state(); got {state!r}")
    seed, counter = state
    counter = check_int("state counter", counter, min=0)
    manual_seed(seed)
    RNG.set((int(seed), counter))


def next_stream() -> tuple:
    """The (seed, stream) of the next dropout call; advances the counter."""
    seed, counter = RNG.get()
    RNG.set((seed, counter + 1))
    return seed, counter
