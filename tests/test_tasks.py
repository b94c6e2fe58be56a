"""mpt.tasks: tasks run serially or on Dask give the same results in item order; the chunks of a
sweep cover every input once; progress with and without tqdm."""
import builtins

import numpy as np
import pytest

from mpt.tasks import Progress, chunks, dask_client, map_tasks


def square_and_threads(x):
    import os

    import numba

    return x * x, numba.get_num_threads(), os.environ.get("OMP_WAIT_POLICY")


def fail_on_three(x):
    if x == 3:
        raise ValueError("task 3 fails")
    return x


def test_serial_map_runs_in_order_in_this_process():
    seen = []
    assert map_tasks(lambda x: seen.append(x) or -x, range(5)) == [0, -1, -2, -3, -4]
    assert seen == [0, 1, 2, 3, 4]
    assert map_tasks(abs, []) == []


@pytest.mark.parametrize("total, size", [(0, 4), (3, 4), (8, 4), (9, 4), (1 << 20, 1 << 16),
                                         ((1 << 20) + 5, 1 << 16)])
def test_chunks_cover_every_input_exactly_once(total, size):
    ranges = chunks(total, size)
    assert all(0 < hi - lo <= size for lo, hi in ranges)
    seen = np.zeros(total, np.int64)
    for lo, hi in ranges:
        seen[lo:hi] += 1
    assert (seen == 1).all()
    assert [lo for lo, _ in ranges] == sorted(lo for lo, _ in ranges)
    assert len(ranges) == -(-total // size)


def test_the_float32_sweep_chunks():
    ranges = chunks(1 << 32, 1 << 24)
    assert len(ranges) == 256 and ranges[0] == (0, 1 << 24) and ranges[-1][1] == 1 << 32
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))   # contiguous, no overlap


def test_bad_arguments():
    with pytest.raises(ValueError, match="size must be a positive int"):
        chunks(10, 0)
    with pytest.raises(ValueError, match="workers must be"):
        map_tasks(abs, [1], workers=0)
    with pytest.raises(TypeError, match="workers must be"):
        map_tasks(abs, [1], workers=2.0)
    with pytest.raises(ValueError, match="not both"):
        map_tasks(abs, [1], workers=2, scheduler="tcp://localhost:1")
    with pytest.raises(ValueError, match="task 3 fails"):
        map_tasks(fail_on_three, range(5))


def test_without_dask_a_clear_import_error(monkeypatch):
    real_import = builtins.__import__

    def no_dask(name, *args, **kwargs):
        if name.split(".")[0] in ("dask", "distributed"):
            raise ImportError("no dask here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dask)
    with pytest.raises(ImportError, match=r"pip install 'mpt\[dask\]'"):
        map_tasks(abs, [1], workers=2)
    assert map_tasks(abs, [-1, 2]) == [1, 2]        # serial needs nothing


def test_dask_results_come_back_in_item_order(dask_client):
    items = list(range(12))
    got = map_tasks(square_and_threads, items, scheduler=dask_client)
    assert [g[0] for g in got] == [x * x for x in items]
    assert {g[1] for g in got} == {1}                 # Numba on one thread in every task
    assert {g[2] for g in got} == {"PASSIVE"}         # idle OpenMP threads sleep
    with pytest.raises(ValueError, match="task 3 fails"):
        map_tasks(fail_on_three, range(5), scheduler=dask_client)
    with pytest.raises(TypeError, match="scheduler must be an address"):
        map_tasks(abs, [1], scheduler=3)


def kind_and_size(item):
    return type(item).__name__, len(item)


def test_dask_passes_every_item_unopened(dask_client):
    """Items that Dask could read as task specs (a tuple that starts with a function, lists and
    dicts holding functions) reach the function as they are, as in the serial run."""
    items = [(len, "abc"), [abs, -1, 2], {"f": len}, (sum, [1, 2])]
    expected = [("tuple", 2), ("list", 3), ("dict", 1), ("tuple", 2)]
    assert map_tasks(kind_and_size, items) == expected
    assert map_tasks(kind_and_size, items, scheduler=dask_client) == expected


def test_dask_client_needs_somewhere_to_run():
    with pytest.raises(ValueError, match="needs workers"):
        with dask_client():
            pass


def test_progress_without_tqdm_prints_one_line(monkeypatch, capsys):
    real_import = builtins.__import__

    def no_tqdm(name, *args, **kwargs):
        if name.split(".")[0] == "tqdm":
            raise ImportError("no tqdm here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tqdm)
    assert map_tasks(abs, [-1, -2, 3], progress=True, desc="demo", unit="case") == [1, 2, 3]
    err = capsys.readouterr().err
    assert err.startswith("demo: 3/3 cases (") and err.count("\n") == 1   # stderr is no terminal
    with Progress("quiet", 2, enabled=False) as bar:
        bar.update(2)
    assert bar.done == 2 and capsys.readouterr().err == ""


def test_progress_with_tqdm(capsys):
    pytest.importorskip("tqdm")
    with Progress("bar", 4, unit="cell") as bar:
        bar.update(3, loss="1.5")
        bar.update()
    err = capsys.readouterr().err
    assert "bar" in err and "4/4" in err and "loss=1.5" in err
