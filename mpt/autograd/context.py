"""L2: one home for the thread-local state that changes what ops compute.

Grad mode, the autocast region, the stack of module cast policies, the dropout generator and
the autograd hooks (the memory ledger) are each a :class:`State`: a named, thread-local value
registered here when its module is imported. Values are immutable (bools, tuples, frozen
dataclasses), so a :func:`snapshot` of every state is a plain frozen mapping, and
:func:`replay` re-enters one — what gradient checkpointing does when it recomputes a segment in
the backward pass: every op then sees exactly the state it saw in the forward pass, and every
state is put back when the replay ends.

A state registered with ``replayed=False`` (the autocast cast cache) is not part of a snapshot:
a replay starts it from ``fresh()`` instead (a new, empty cache), and restores it afterwards.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

__all__ = ["State", "Snapshot", "snapshot", "replay", "states"]


class _Values(threading.local):
    def __init__(self):
        self.values = {}


_VALUES = _Values()
_STATES: dict[str, "State"] = {}


class State:
    """A named piece of thread-local state: :meth:`get`, :meth:`set` and :meth:`scoped`.

    ``default``: the value in a thread that never set it; ``replayed``: whether
    :func:`snapshot` keeps it; ``fresh``: for a state that is not replayed, a function giving its
    value during a replay (called after the replayed states are set; default: ``default``).
    Names are unique.
    """

    def __init__(self, name: str, default, *, replayed: bool = True, fresh=None):
        if name in _STATES:
            raise ValueError(f"state {name!r} is already registered")
        self.name, self.default, self.replayed = name, default, replayed
        self.fresh = fresh or (lambda: default)
        _STATES[name] = self

    def get(self):
        return _VALUES.values.get(self.name, self.default)

    def set(self, value):
        """Make ``value`` current in this thread; returns the previous value."""
        previous = self.get()
        _VALUES.values[self.name] = value
        return previous

    @contextlib.contextmanager
    def scoped(self, value):
        """Context manager: ``value`` inside the block, the previous value after it."""
        previous = self.set(value)
        try:
            yield value
        finally:
            self.set(previous)

    def __repr__(self) -> str:
        return f"State({self.name!r}, {self.get()!r})"


def states() -> dict[str, State]:
    """Every registered state by name, in registration order."""
    return dict(_STATES)


@dataclass(frozen=True)
class Snapshot:
    """The values of the replayed states at one moment: ``(name, value)`` pairs."""

    values: tuple

    def __getitem__(self, name):
        return dict(self.values)[name]


def snapshot() -> Snapshot:
    """The current value of every replayed state."""
    return Snapshot(tuple((s.name, s.get()) for s in _STATES.values() if s.replayed))


@contextlib.contextmanager
def replay(snap: Snapshot, *, skip=()):
    """Context manager: inside the block every state has its value in ``snap`` (a state the
    snapshot does not hold has its default, a non-replayed one its ``fresh()`` value), except the
    states named in ``skip``, which keep their current values; every state is restored on exit."""
    if not isinstance(snap, Snapshot):
        raise TypeError(f"snap must be a Snapshot from mpt.autograd.context.snapshot(); got "
                        f"{type(snap).__name__}")
    unknown = set(skip) - set(_STATES)
    if unknown:
        raise ValueError(f"skip names unknown states {sorted(unknown)}; states: "
                         f"{', '.join(_STATES)}")
    saved = dict(_VALUES.values)
    values = dict(snap.values)
    try:
        for state in _STATES.values():
            if state.replayed and state.name not in skip:
                state.set(values.get(state.name, state.default))
        for state in _STATES.values():
            if not state.replayed and state.name not in skip:
                state.set(state.fresh())
        yield
    finally:
        _VALUES.values = saved
