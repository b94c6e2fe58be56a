"""L1: how kernels use threads.

:func:`one_thread` runs Numba kernels on the calling thread alone where worker threads cost more
than they give. A parallel region wakes Numba's worker threads: microseconds on an idle machine, a
scheduler time slice (milliseconds) on a busy one, far more than a small kernel's work.

:func:`run_tasks` spreads the independent tasks of a large serial kernel over Python threads
instead of a ``prange`` loop. Numba compiles a ``prange`` body into a gufunc and two wrappers,
three more LLVM modules, and links the whole callee into each, which LLVM then optimizes and
emits again: for the flash-attention tasks (about 3 MB of LLVM IR each) that was two thirds of
their compile time. A kernel run this way releases the GIL (``nogil=True``).

Every kernel in mpt splits its work so that the bits never depend on the thread count, so both
change time only.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import os

import numba

__all__ = ["one_thread", "run_tasks"]


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


@functools.lru_cache(maxsize=None)
def _pool():
    """The worker threads of :func:`run_tasks` (started on first use, as many as Numba's)."""
    return concurrent.futures.ThreadPoolExecutor(max(numba.config.NUMBA_NUM_THREADS - 1, 1),
                                                 thread_name_prefix="mpt-tasks")


# A forked child inherits the pool object but not its threads: tasks submitted there would never
# run. The child starts a pool of its own instead.
os.register_at_fork(after_in_child=_pool.cache_clear)


def run_tasks(kernel, ntasks: int, *args) -> None:
    """Run tasks 0..ntasks-1 as ``kernel(first, step, ntasks, *args)`` calls, one per thread (the
    calling thread takes the first; ``numba.get_num_threads()`` threads at most, so
    :func:`one_thread` applies): ``kernel`` runs tasks first, first + step, ... below ntasks
    (round robin: with a causal mask, late query blocks cost more). ``kernel`` must be an
    ``njit(nogil=True)`` function whose tasks are independent. Its exceptions reach the caller."""
    n = max(min(numba.get_num_threads(), ntasks), 1)
    others = [_pool().submit(kernel, first, n, ntasks, *args) for first in range(1, n)]
    try:
        kernel(0, n, ntasks, *args)
    finally:
        for future in others:
            future.result()
