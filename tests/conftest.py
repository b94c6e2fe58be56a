"""Shared test configuration: hypothesis profiles, the folder of hardware samples, file spies."""
import builtins
import io
import os
import threading

# Numba's OpenMP workers spin after each parallel kernel and steal the test thread's core on a
# small machine (3-10x slower suites measured on 2 cores); read when OpenMP starts, so set early.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import pathlib
from importlib.metadata import entry_points

import pytest
from hypothesis import HealthCheck, settings

# mpt's `golden` fixture: an installed mpt registers it through its pytest11 entry point; a
# checkout that is not installed registers it here (never both: pluggy refuses a second copy).
# The test mirrors mpt.golden.pytest_plugin.entry_point_active(), without importing the plugin
# before pytest does (it could no longer rewrite its asserts); an install of mpt 0.1 named the
# same plugin mpt.pytest_plugin.
if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") or not any(
        ep.value in ("mpt.golden.pytest_plugin", "mpt.pytest_plugin")
        for ep in entry_points(group="pytest11")):
    pytest_plugins = ["mpt.golden.pytest_plugin"]


@pytest.fixture
def opened(monkeypatch):
    """The absolute path of every file the test's thread opens (builtins.open, io.open as
    pathlib uses it, and os.open) while the test runs: to show that nothing outside a folder was
    read. Other threads are not the code under test (the session's Dask cluster polls /proc)."""
    paths = []
    real_open, real_os_open = builtins.open, os.open
    test_thread = threading.get_ident()

    def spy_open(file, *args, **kwargs):
        if isinstance(file, (str, bytes, os.PathLike)) and threading.get_ident() == test_thread:
            paths.append(os.path.abspath(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(path, *args, **kwargs):
        if threading.get_ident() == test_thread:
            paths.append(os.path.abspath(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(io, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    return paths


def file_state(*roots) -> dict:
    """Every file under ``roots`` (symbolic links listed, not followed): its bytes (or link
    target) and mtime, to show that no prior file changed."""
    found = {}
    for root in roots:
        for dirpath, dirnames, files in os.walk(root):
            links = [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
            for name in files + links:
                path = os.path.join(dirpath, name)
                data = os.readlink(path) if os.path.islink(path) else \
                    pathlib.Path(path).read_bytes()
                found[path] = (data, os.lstat(path).st_mtime_ns)
    return found


@pytest.fixture
def files():
    """:func:`file_state` as a fixture (tests cannot import conftest)."""
    return file_state

# "ci" is derandomized so a CI run is reproducible; "dev" explores new examples each run.
# Deadlines are off: the first call of a Numba kernel includes its compilation.
settings.register_profile(
    "ci", derandomize=True, deadline=None, max_examples=200,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

DATA = pathlib.Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def tensor_core_dumps():
    """Folder of real Tensor Core samples, part of the repository (its README gives the source,
    licence and layout). Missing data fails the tests that need it: it never skips them."""
    folder = DATA / "tensor_core_dumps"
    if not folder.is_dir():
        pytest.fail(f"hardware samples not found at {folder}: they are part of the repository")
    return folder


@pytest.fixture(scope="session")
def dask_client():
    """A client of a local Dask cluster of two worker processes (``mpt.tasks.dask_client``),
    shared by the tests that run tasks on Dask; they skip when dask is not installed (the
    ``dask`` extra; the ``test`` extra installs it)."""
    pytest.importorskip("distributed")
    from mpt.tasks import dask_client

    with dask_client(workers=2) as client:
        yield client
