"""L2: autograd hooks — observers told what the engine keeps (the memory ledger is one).

An observer has two methods: ``saved(items)``, called with what a recorded op passed to
``ctx.save_for_backward``, and ``grad(array)``, called with every gradient array the engine
stores into a tensor's ``.grad``. Observers are a thread-local :class:`~mpt.autograd.context.State`
(``"autograd_hooks"``), so a checkpointed segment's recomputation reports to the observers of its
forward pass. The engine knows nothing of what observers do with it.
"""
from __future__ import annotations

from mpt.autograd.context import State

__all__ = ["HOOKS", "observers", "add_observer", "remove_observer", "notify_saved",
           "notify_grad"]

HOOKS = State("autograd_hooks", ())


def observers() -> tuple:
    """The observers active in this thread, oldest first."""
    return HOOKS.get()


def add_observer(observer) -> None:
    """Start telling ``observer`` (``saved``/``grad`` methods) what the engine keeps."""
    if not (callable(getattr(observer, "saved", None))
            and callable(getattr(observer, "grad", None))):
        raise TypeError(f"observer must have saved(items) and grad(array) methods; got "
                        f"{type(observer).__name__}")
    HOOKS.set(HOOKS.get() + (observer,))


def remove_observer(observer) -> None:
    HOOKS.set(tuple(x for x in HOOKS.get() if x is not observer))


def notify_saved(items) -> None:
    for observer in HOOKS.get():
        observer.saved(items)


def notify_grad(array) -> None:
    for observer in HOOKS.get():
        observer.grad(array)
