"""mpt.runtime.retain_freed_memory: freed blocks stay mapped for reuse (glibc), and the function
says what it did everywhere else."""
import resource

import numpy as np
import pytest

from mpt import runtime
from mpt.runtime import MiB, retain_freed_memory

GLIBC = runtime._mallopt() is not None


@pytest.mark.skipif(not GLIBC, reason="mallopt is glibc's")
def test_a_freed_block_above_glibcs_own_maximum_is_reused_without_page_faults():
    # 48 MiB is above glibc's dynamic mmap threshold (at most 32 MiB): by default every such
    # block is a fresh mapping, faulted in at first touch: 12,288 pages of 4 KiB, or at least
    # 24 of 2 MiB where numpy asks for transparent huge pages (5,361 faults over ten rounds on
    # the 2-core CI VM). Kept in the heap, the rounds after the first reuse mapped pages: fewer
    # faults than one fresh block would take even in huge pages (0 measured).
    nbytes = 48 * MiB
    try:
        assert retain_freed_memory(mmap_threshold=2 * nbytes, trim_threshold=4 * nbytes) is True
        np.ones(nbytes // 4, np.float32)                  # the heap grows once
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            assert np.ones(nbytes // 4, np.float32)[-1] == 1
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        retain_freed_memory()                             # the defaults again
    assert faults < nbytes // (2 * MiB), faults


def test_another_c_library_is_left_alone(monkeypatch):
    monkeypatch.setattr(runtime, "_mallopt", lambda: None)
    assert retain_freed_memory() is False


def test_a_refused_setting_names_itself(monkeypatch):
    calls = []

    def mallopt(param, value):
        calls.append((param, value))
        return int(param != runtime._M_TRIM_THRESHOLD)    # glibc: 1 if set, 0 if refused
    monkeypatch.setattr(runtime, "_mallopt", lambda: mallopt)
    with pytest.raises(ValueError, match="refused trim_threshold=268435456"):
        retain_freed_memory()
    assert calls == [(runtime._M_MMAP_THRESHOLD, 32 * MiB), (runtime._M_TRIM_THRESHOLD, 256 * MiB)]


@pytest.mark.parametrize("kwargs, error", [
    (dict(mmap_threshold=-1), ValueError), (dict(trim_threshold=2**31), ValueError),
    (dict(top_pad=1.5), TypeError), (dict(mmap_threshold=True), TypeError)])
def test_bad_values_are_refused_before_anything_is_set(monkeypatch, kwargs, error):
    monkeypatch.setattr(runtime, "_mallopt", lambda: pytest.fail("mallopt was called"))
    with pytest.raises(error, match=f"retain_freed_memory: {next(iter(kwargs))} must be an int"):
        retain_freed_memory(**kwargs)
