"""L0: a process setting for speed (never bits): keep freed memory in the heap for reuse.

A training step of mpt allocates and frees hundreds of numpy temporaries of 0.1-10 MB each
(activations, gradients, GEMM panels). glibc's malloc serves blocks above its mmap threshold
(128 KiB, raised dynamically to at most 32 MiB) with fresh ``mmap`` pages and returns them with
``munmap`` on free, and it trims the heap's free top back to the OS: each new temporary is then
first touched page by page, up to one page fault per 4 KiB, and on two threads the faults and
the TLB shootdowns of each ``munmap`` stall both cores. Measured on a 2-core AMD EPYC (Zen 4)
VM, the fp32 GPT step of ``benchmarks/bench_train_step.py`` took 6,000-7,400 minor page faults
and 14-18 ms of system time per step; with :func:`retain_freed_memory` it took 3 faults and
1 ms, and the step 33-35 ms instead of 42-46 on two threads.

:func:`retain_freed_memory` raises the mmap threshold and the trim threshold with ``mallopt``
(glibc only), so that freed blocks stay in the heap, already mapped, for the next allocation of
the same size. The cost is resident memory: up to ``trim_threshold`` bytes of free heap stay
mapped, plus what fragmentation keeps. It changes the process for every library in it, so mpt
never calls it on import: the ``mpt`` command, the Dask workers of ``mpt.tasks`` and the
training-step benchmark call it; a script of your own can call it once at the start.
"""
from __future__ import annotations

import ctypes
import functools
import platform
import sys

from mpt._checks import check_int

__all__ = ["MiB", "retain_freed_memory"]

MiB = 1 << 20
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3   # glibc's <malloc.h>


@functools.cache
def _mallopt():
    """glibc's ``mallopt``, or None on another C library (musl, macOS, Windows)."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt


def retain_freed_memory(mmap_threshold: int = 32 * MiB, trim_threshold: int = 256 * MiB,
                        top_pad: int = 64 * MiB) -> bool:
    """Keep freed memory of this process in glibc's heap (module docstring); True if set.

    ``mmap_threshold``: blocks of at least this many bytes are still mapped and unmapped one by
    one (32 MiB, glibc's own dynamic maximum); ``trim_threshold``: the heap returns its free top
    to the OS only beyond this many bytes; ``top_pad``: bytes added to each growth of the heap
    (address space only: pages are mapped when first touched). Setting them turns off glibc's
    dynamic threshold. Returns False, changing nothing, where the C library is not glibc. Raises
    ValueError if glibc refuses a value.
    """
    settings = {name: (param, check_int(f"retain_freed_memory: {name}", value, min=0,
                                        max=2**31 - 1))      # mallopt takes a C int
                for name, param, value in (("mmap_threshold", _M_MMAP_THRESHOLD, mmap_threshold),
                                           ("trim_threshold", _M_TRIM_THRESHOLD, trim_threshold),
                                           ("top_pad", _M_TOP_PAD, top_pad))}
    mallopt = _mallopt()
    if mallopt is None:
        return False
    for name, (param, value) in settings.items():
        if mallopt(param, value) != 1:
            raise ValueError(f"retain_freed_memory: glibc's mallopt refused {name}={value}")
    return True
