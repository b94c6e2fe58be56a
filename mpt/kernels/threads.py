"""L1: run Numba kernels on the calling thread alone where worker threads cost more than they give.

A parallel region wakes Numba's worker threads: microseconds on an idle machine, a scheduler time
slice (milliseconds) on a busy one, far more than a small kernel's work. Every kernel in mpt
splits its work so that the bits never depend on the thread count, so this changes time only.
"""
from __future__ import annotations

import contextlib

import numba

__all__ = ["one_thread"]


@contextlib.contextmanager
def one_thread(enabled: bool = True):
    """Inside the block (when ``enabled``), Numba kernels run on the calling thread alone
    (nothing to change when they already do: setting the count costs microseconds)."""
    if not enabled or numba.get_num_threads() == 1:
        yield
        return
    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(saved)
