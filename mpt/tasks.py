"""L0: independent tasks, run serially in this process or on a Dask cluster, with a progress bar.

A long computation of mpt — the cells of a study grid (``mpt.study.grid``), the cases of a golden
suite (``mpt.golden.generate``), the chunks of an exhaustive sweep (:func:`chunks`) — is a list of
independent tasks ``fn(item)``. :func:`map_tasks` runs them:

* **serially**, in this process, in the order of the items (the default: nothing to install);
* on a **local cluster** of ``workers`` processes started for the call
  (``dask.distributed.LocalCluster``, the ``dask`` extra: ``pip install 'mpt[dask]'``). Each
  worker process runs one task at a time, with Numba on one thread and
  ``OMP_WAIT_POLICY=PASSIVE`` (:data:`WORKER_ENV`), so that N workers keep N cores busy;
* on an **existing cluster**: ``scheduler`` is its scheduler's address (``"tcp://host:8786"``)
  or a ``distributed.Client`` already connected to it (which is left open; :func:`dask_client`
  opens one, to share a local cluster between several calls).

On Dask every task runs Numba on one thread: the parallelism is the cluster's, one task per
worker thread (a local cluster has one thread per process).

The results come back as a list in the order of the items, whatever order the tasks finish in,
so whatever a caller makes of them (sums, tables, files) it makes in one fixed order. A result
is the same bits wherever it ran as long as ``fn`` is a pure function of its item: mpt's kernels
give the same bits for every machine and thread count, and the callers in mpt start each task
from a fresh context (``mpt.autograd.context``), so no dropout counter, autocast region or hook
left in a process carries over. Items, results and ``fn`` travel by pickle (``fn`` by
cloudpickle: a module-level function or a ``functools.partial`` of one). Every worker of an
existing cluster needs the same mpt, numpy, ml_dtypes and numba as the client: bits are promised
for the same versions only.

:class:`Progress` is the progress display of every long run: a tqdm bar when tqdm is installed
(the ``progress`` extra), else a plain line on stderr.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from typing import Callable, Sequence

from mpt._checks import check_int
from mpt.runtime import retain_freed_memory

__all__ = ["WORKER_ENV", "Progress", "map_tasks", "chunks", "dask_client"]

#: Environment of the worker processes of a local cluster: Numba's OpenMP threads sleep when idle
#: instead of spinning on a core another worker needs (read when the OpenMP runtime starts, at the
#: first parallel kernel of a task).
WORKER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


class Progress:
    """Progress of ``total`` units of work, shown on stderr while ``enabled``.

    With tqdm installed: a tqdm bar (``desc``, ``unit``; :meth:`update` may set a postfix). Without
    it: on a terminal one line rewritten at most twice a second, and a final summary line in any
    case (only that one when stderr is not a terminal). :meth:`close` ends it, with ``summary``
    as the final line when tqdm is absent (default: ``"desc: n/total units (t s)"``).
    """

    def __init__(self, desc: str, total: int, enabled: bool = True, unit: str = "task"):
        self.desc, self.total, self.unit, self.enabled = desc, total, unit, enabled
        self.done, self.bar, self._shown = 0, None, 0.0
        self._start = time.perf_counter()
        if enabled:
            try:
                from tqdm import tqdm  # optional: the 'progress' extra
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=desc, unit=unit, leave=True, file=sys.stderr)

    def update(self, n: int = 1, **postfix) -> None:
        """``n`` more units done; ``postfix`` (name=text) is shown beside the count."""
        self.done += n
        if not self.enabled:
            return
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(postfix, refresh=False)
            self.bar.update(n)
            return
        now = time.monotonic()
        if sys.stderr.isatty() and (now - self._shown > 0.5 or self.done == self.total):
            self._shown = now
            extra = "".join(f" {k} {v}" for k, v in postfix.items())
            print(f"\r{self.desc} {self.done}/{self.total} {self.unit}s{extra}", end="",
                  file=sys.stderr, flush=True)

    def close(self, summary: str | None = None) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            return
        if summary is None:
            summary = (f"{self.desc}: {self.done}/{self.total} {self.unit}s "
                       f"({time.perf_counter() - self._start:.1f} s)")
        print(("\r" if sys.stderr.isatty() else "") + summary, file=sys.stderr, flush=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def chunks(total: int, size: int) -> list[tuple[int, int]]:
    """The half-open ranges ``[lo, hi)`` of ``size`` inputs (the last one shorter) that cover
    ``range(total)`` in order, each input exactly once: the tasks of an exhaustive sweep."""
    total = check_int("total", total, min=0)
    size = check_int("size", size, min=1)
    return [(lo, min(lo + size, total)) for lo in range(0, total, size)]


def _check_where(workers, scheduler) -> int | None:
    if workers is not None and scheduler is not None:
        raise ValueError("give workers (a local cluster) or scheduler (an existing one), not both")
    return check_int("workers", workers, min=1, optional=True)


def map_tasks(fn: Callable, items: Sequence, *, workers: int | None = None, scheduler=None,
              progress: bool = False, desc: str = "tasks", unit: str = "task") -> list:
    """``[fn(item) for item in items]``, serially or as one Dask task per item (module docstring).

    ``workers``: run on a local cluster of that many processes; ``scheduler``: the address of an
    existing cluster, or a ``distributed.Client``; neither: serially in this process. A progress
    bar counts the finished tasks when ``progress``. The first exception a task raises is raised
    here (the other tasks are cancelled). ImportError when Dask is asked for but not installed.
    """
    workers = _check_where(workers, scheduler)
    items = list(items)
    bar = Progress(desc, len(items), progress, unit)
    try:
        if workers is None and scheduler is None:
            results = []
            for item in items:
                results.append(fn(item))
                bar.update()
            return results
        with dask_client(workers, scheduler) as client:
            return _run_on(client, functools.partial(_on_one_thread, fn),
                           [_Opaque(item) for item in items], bar)
    finally:
        bar.close()


class _Opaque:
    """An item as Dask must carry it: unopened. Dask reads a tuple whose first element is
    callable as a task to run (dask 2024.x runs ``(f, x)`` and passes ``f(x)`` on) and looks
    inside lists and dicts; an instance of this class it passes through as it is."""

    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value


def _on_one_thread(fn, item: _Opaque):
    """``fn(item.value)`` with Numba's kernels on the calling thread alone, in a worker process
    that keeps freed memory (:func:`mpt.runtime.retain_freed_memory`): the bits never depend on
    the thread count or the heap, this changes the time only."""
    import numba

    retain_freed_memory()
    saved = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return fn(item.value)
    finally:
        numba.set_num_threads(saved)


def _run_on(client, fn, items, bar) -> list:
    from distributed import as_completed

    futures = client.map(fn, items, pure=False)
    try:
        for future in as_completed(futures):
            if future.status == "error":
                future.result()          # raises the task's exception
            bar.update()
        return client.gather(futures)
    finally:
        client.cancel(futures)


@contextlib.contextmanager
def dask_client(workers: int | None = None, scheduler=None):
    """Context manager: a ``distributed.Client`` of a local cluster of ``workers`` processes
    (one thread each, :data:`WORKER_ENV`), or of the cluster of ``scheduler`` (an address, or a
    Client passed through); closes what it opened on exit.

    ``with dask_client(workers=4) as client: ...`` keeps one cluster for several
    :func:`map_tasks` calls (``scheduler=client``). ImportError without dask and distributed.
    """
    workers = _check_where(workers, scheduler)
    if workers is None and scheduler is None:
        raise ValueError("dask_client needs workers (a local cluster) or scheduler")
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise ImportError("running tasks on Dask needs dask and distributed: "
                          "pip install 'mpt[dask]'") from None
    if scheduler is not None and not isinstance(scheduler, (str, Client)):
        raise TypeError(f"scheduler must be an address (str) or a distributed.Client; got "
                        f"{type(scheduler).__name__}")
    if isinstance(scheduler, Client):
        yield scheduler
    elif scheduler is not None:
        with Client(scheduler) as client:
            yield client
    else:
        # dashboard on a free port: some releases serve HTTP even without a dashboard, and warn
        # when the default port 8787 is taken (by another cluster)
        with _environ_kept(), LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                env=dict(WORKER_ENV)) as cluster, Client(cluster) as client:
            yield client


@contextlib.contextmanager
def _environ_kept():
    """Puts this process's environment back as it was on exit: a local cluster's nannies set
    variables for their workers (``distributed.nanny.pre-spawn-environ``: OMP_NUM_THREADS=1,
    PYTHONHASHSEED, ...) in the process that starts them."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        for key in set(os.environ) - set(saved):
            del os.environ[key]
        os.environ.update(saved)
