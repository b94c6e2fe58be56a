"""L2: the memory ledger — live bytes of arrays by role and format, and their peak.

A :class:`MemoryLedger` counts the bytes of the numpy buffers it tracks, each under one role:

``"weights"``      parameters (:meth:`MemoryLedger.track_module`)
``"grads"``        their gradients (``track_module``, and every ``.grad`` the autograd engine
                   creates while the ledger is active)
``"optimizer"``    optimizer state (:meth:`MemoryLedger.track_optimizer`)
``"activations"``  arrays saved for backward (every ``ctx.save_for_backward`` of a recorded op
                   while the ledger is active)

and in a format (the tensor's, or the format whose storage dtype the array has; other dtypes by
their numpy name, e.g. ``"bool"``). Accounting rules:

* A buffer is counted once, with the bytes of its whole base array (a view keeps its base alive),
  under the role it was first tracked with: register the model (and the optimizer) before a step
  so that a weight saved by an op stays a weight.
* A buffer leaves the ledger when numpy frees it (a weak-reference finalizer), so the count is
  what is live now; :attr:`MemoryLedger.peak` and :attr:`MemoryLedger.peak_by_role` are the maxima
  since creation or :meth:`MemoryLedger.reset_peak` (call it at the start of a step).
* Only tracked arrays count: transient buffers inside a kernel or a Function (the naive
  attention's score matrix before it is saved, a GEMM's packed panels) do not.

Use it as a context manager to receive the autograd hooks (one active ledger per thread; the
innermost wins)::

    with mpt.memory.MemoryLedger() as ledger:
        ledger.track_module(model)
        ledger.reset_peak()
        model.loss(x, y).backward()
    print(ledger.report())
"""
from __future__ import annotations

import weakref

import numpy as np

from mpt.autograd.hooks import add_observer, observers, remove_observer
from mpt.formats import get_format

__all__ = ["ROLES", "MemoryLedger", "active_ledger", "record_saved", "record_grad"]

ROLES = ("weights", "grads", "optimizer", "activations")


def active_ledger():
    """The ledger receiving the autograd hooks in this thread (None outside any ``with``)."""
    ledgers = [x for x in observers() if isinstance(x, MemoryLedger)]
    return ledgers[-1] if ledgers else None


def _root(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory of ``array`` (its outermost ndarray base)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _format_name(array: np.ndarray) -> str:
    try:
        return get_format(array.dtype).name
    except (ValueError, TypeError):
        return array.dtype.name


def _release(ledger_ref, key):
    ledger = ledger_ref()
    if ledger is not None:
        ledger._forget(key)


class MemoryLedger:
    """Live bytes by (role, format) of the arrays it tracks, and the peak (module docstring)."""

    def __init__(self):
        self._entries: dict = {}   # id(root buffer) -> (role, format, bytes, finalizer)
        self._live: dict = {}      # (role, format) -> bytes
        self.peak = 0
        self.peak_by_role = dict.fromkeys(ROLES, 0)

    # ---- registering -----------------------------------------------------------------------------
    def track(self, x, role: str, format=None) -> int:
        """Count ``x`` (a Tensor, an ndarray, or None) under ``role``; returns the bytes newly
        counted (0 if its buffer is already tracked). ``format`` overrides the format name."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(map(repr, ROLES))}; got {role!r}")
        if x is None:
            return 0
        fmt = getattr(x, "format", None)
        array = getattr(x, "data", x) if fmt is not None else x
        if not isinstance(array, np.ndarray):
            raise TypeError(f"track needs a Tensor or an ndarray; got {type(x).__name__}")
        root = _root(array)
        key = id(root)
        if key in self._entries:
            return 0
        name = get_format(format).name if format is not None else (
            fmt.name if fmt is not None else _format_name(array))
        finalizer = weakref.finalize(root, _release, weakref.ref(self), key)
        self._entries[key] = (role, name, root.nbytes, finalizer)
        self._live[role, name] = self._live.get((role, name), 0) + root.nbytes
        self._update_peak()
        return root.nbytes

    def track_module(self, module) -> "MemoryLedger":
        """Track a module's parameters (``"weights"``) and their current grads (``"grads"``)."""
        for p in module.parameters():
            self.track(p, "weights")
            self.track(p.grad, "grads")
        return self

    def track_optimizer(self, optimizer) -> "MemoryLedger":
        """Track every array in ``optimizer.state`` (momenta, second moments, master weights)."""
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, np.ndarray) or hasattr(value, "format"):
                    self.track(value, "optimizer")
        return self

    def _forget(self, key) -> None:
        role, name, nbytes, _ = self._entries.pop(key)
        self._live[role, name] -= nbytes

    def _update_peak(self) -> None:
        self.peak = max(self.peak, self.live())
        for role in ROLES:
            self.peak_by_role[role] = max(self.peak_by_role[role], self.live(role))

    # ---- reading ---------------------------------------------------------------------------------
    def live(self, role: str | None = None, format=None) -> int:
        """Bytes live now, optionally of one role and/or one format."""
        name = None if format is None else get_format(format).name
        return sum(b for (r, f), b in self._live.items()
                   if (role is None or r == role) and (name is None or f == name))

    def by_role(self) -> dict:
        """{role: live bytes}."""
        return {role: self.live(role) for role in ROLES}

    def by_format(self) -> dict:
        """{(role, format): live bytes} for every non-empty pair."""
        return {key: b for key, b in sorted(self._live.items()) if b}

    def reset_peak(self) -> None:
        """Restart the peaks at the bytes live now (the start of a step)."""
        self.peak = self.live()
        self.peak_by_role = {role: self.live(role) for role in ROLES}

    def report(self) -> str:
        """A table: live and peak bytes per role, live bytes per (role, format)."""
        lines = [f"{'role':<12} {'live':>14} {'peak':>14}"]
        for role in ROLES:
            lines.append(f"{role:<12} {self.live(role):>14,} {self.peak_by_role[role]:>14,}")
        lines.append(f"{'total':<12} {self.live():>14,} {self.peak:>14,}")
        for (role, name), b in self.by_format().items():
            lines.append(f"  {role}/{name}: {b:,}")
        return "\n".join(lines)

    # ---- the active ledger -----------------------------------------------------------------------
    def __enter__(self) -> "MemoryLedger":
        add_observer(self)
        return self

    def __exit__(self, *exc) -> None:
        remove_observer(self)

    # ---- the autograd hooks (mpt.autograd.hooks): only the innermost ledger counts --------------
    def saved(self, items) -> None:
        """Count what a recorded op saved for backward — ndarrays and objects with a ``.format``
        and ``.data`` (Tensors, FP8 tensors with their scale) — as activations. A buffer already
        counted (a weight saved by its op) is not counted twice."""
        if active_ledger() is self:
            for item in items:
                if isinstance(item, np.ndarray) or hasattr(item, "format"):
                    self.track(item, "activations")

    def grad(self, array) -> None:
        """Count a gradient array the engine stored into a tensor's ``.grad``."""
        if active_ledger() is self:
            self.track(array, "grads")


def record_saved(items) -> None:
    """Tell the active ledger (if any) what an op saved for backward
    (:meth:`MemoryLedger.saved`)."""
    ledger = active_ledger()
    if ledger is not None:
        ledger.saved(items)


def record_grad(array: np.ndarray) -> None:
    """Tell the active ledger (if any) about a gradient array (:meth:`MemoryLedger.grad`)."""
    ledger = active_ledger()
    if ledger is not None:
        ledger.grad(array)
