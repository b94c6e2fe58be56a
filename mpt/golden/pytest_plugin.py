"""L5: the ``golden`` pytest fixture — compare a function's outputs with a stored golden case.

Registered through the ``pytest11`` entry point ``mpt`` when mpt is installed; a checkout that is
not installed lists it in ``conftest.py`` (``pytest_plugins``) when :func:`entry_point_active` is
false, so that it is never registered twice. Usage::

    def test_my_kernel(golden):
        x = ...
        golden({"y": my_kernel(x)}, inputs={"x": x})           # bit-exact
        golden({"z": other(x)}, name="other", max_ulp=2)       # within 2 ULP of the format

Cases live in a ``golden/`` folder beside the test file: ``<module>.<test>[.<name>].npz`` and one
``manifest.json`` in the format of :mod:`mpt.golden` (sha256 of the file and of every array, the
contract, the suite digest), so an edited or corrupted file fails the test instead of being
trusted; ``golden.digest`` is the folder's suite digest (:func:`mpt.golden.suite_digest`), for a
test that pins it. Output and input names are letters, digits, ``_``, ``.`` and ``-``. Float outputs
are compared with :func:`mpt.testing.assert_bits_equal` (``max_ulp=0``: −0 ≠ +0, NaN payloads
must match) or :func:`mpt.testing.assert_ulp_close`; integer and bool outputs must be equal.
Stored inputs, when given, must equal the test's bit for bit (else the case is stale). A missing
case fails; ``pytest --mpt-regen-golden`` writes (or rewrites) every case the run reaches.
"""
from __future__ import annotations

import os
import re
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import pytest

from mpt._checks import check_int
from mpt.golden.manifest import (ARRAY_NAME, FIXTURE_KIND, MANIFEST, Case, GoldenError,
                                 build_manifest, read_manifest, suite_digest)
from mpt.golden.suite import load_case, write_case, write_manifest
from mpt.testing import assert_bits_equal, assert_ulp_close

__all__ = ["GoldenFixture", "entry_point_active", "golden"]

REGEN_FLAG = "--mpt-regen-golden"


def entry_point_active() -> bool:
    """Whether pytest will load this plugin from mpt's installed ``pytest11`` entry point."""
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(ep.value in (__name__, "mpt.pytest_plugin")  # (the 0.1 name)
               for ep in entry_points(group="pytest11"))


def pytest_addoption(parser):
    parser.getgroup("mpt").addoption(
        REGEN_FLAG, action="store_true", default=False,
        help="write the golden cases of the `golden` fixture instead of comparing with them")


class GoldenFixture:
    """Compare outputs with (or, with ``--mpt-regen-golden``, store them as) a golden case."""

    def __init__(self, folder: Path, case_stem: str, regen: bool):
        self.folder, self.case_stem, self.regen = folder, case_stem, regen

    def __call__(self, outputs, *, inputs=None, max_ulp: int = 0, name: str | None = None):
        if isinstance(outputs, np.ndarray):
            outputs = {"out": outputs}
        if not isinstance(outputs, dict) or not outputs:
            raise TypeError("outputs must be an array or a non-empty dict of name -> array")
        max_ulp = check_int("max_ulp", max_ulp, min=0)
        for role, arrays in (("outputs", outputs), ("inputs", inputs or {})):
            bad = [k for k in arrays
                   if not isinstance(k, str) or not ARRAY_NAME.fullmatch(k) or ".." in k]
            if bad:
                raise ValueError(f"{role}: names must match {ARRAY_NAME.pattern} (no '..'); got "
                                 f"{bad}")
        case = Case(self.case_stem + (f".{_safe(name)}" if name else ""), FIXTURE_KIND, {},
                    {k: np.asarray(v) for k, v in (inputs or {}).items()},
                    {k: np.asarray(v) for k, v in outputs.items()}, max_ulp)
        if self.regen:
            self._store(case)
        else:
            self._compare(case)

    @property
    def digest(self) -> str:
        """The suite digest of this test file's golden folder (every file checked)."""
        return suite_digest(self.folder)

    # ---- storage -----------------------------------------------------------------------------
    def _cases(self) -> list[dict]:
        if not os.path.lexists(self.folder / MANIFEST):
            return []
        return read_manifest(self.folder)["cases"]

    def _store(self, case: Case) -> None:
        entries = self._cases()                  # a broken folder fails before anything is written
        self.folder.mkdir(parents=True, exist_ok=True)
        entry = write_case(self.folder, case)
        entries = sorted([e for e in entries if e["name"] != case.name] + [entry],
                         key=lambda e: e["name"])
        write_manifest(self.folder, build_manifest(entries, "pytest"))

    def _compare(self, case: Case) -> None:
        hint = f"run pytest {REGEN_FLAG} to (re)write it"
        try:
            entry = next((e for e in self._cases() if e["name"] == case.name), None)
            if entry is None:
                pytest.fail(f"no golden case {case.name!r} in {self.folder}: {hint}",
                            pytrace=False)
            stored = load_case(self.folder, entry)
        except GoldenError as exc:
            pytest.fail(f"golden case {case.name!r}: {exc}", pytrace=False)
        for role, mine, theirs in (("inputs", case.inputs, stored.inputs),
                                   ("outputs", case.outputs, stored.outputs)):
            if (role == "outputs" or mine) and sorted(mine) != sorted(theirs):
                pytest.fail(f"golden case {case.name!r} stores {role} {sorted(theirs)}, the test "
                            f"gives {sorted(mine)}: {hint}", pytrace=False)
        for key, x in case.inputs.items():
            _assert_equal(x, stored.inputs[key], 0, f"{case.name}: input {key!r} changed ({hint})")
        for key, y in case.outputs.items():
            _assert_equal(y, stored.outputs[key], case.max_ulp,
                          f"{case.name}: output {key!r} differs from the golden case "
                          f"({stored.contract})")


def _assert_equal(actual, desired, max_ulp, msg):
    if actual.dtype != desired.dtype or actual.shape != desired.shape:
        raise AssertionError(f"{msg}: dtype/shape {actual.dtype}{actual.shape} != "
                             f"{desired.dtype}{desired.shape}")
    if desired.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, desired, err_msg=msg)
    elif max_ulp == 0:
        assert_bits_equal(actual, desired, err_msg=msg)
    else:
        assert_ulp_close(actual, desired, max_ulp=max_ulp, err_msg=msg)


def _safe(text: str) -> str:
    """A file-name-safe rendering of a test or case name (a plain base name, no '..')."""
    return re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9_.-]+", "_", text)).strip("_.-")


@pytest.fixture
def golden(request) -> GoldenFixture:
    """Compare outputs with the golden case stored for this test (see the module docstring)."""
    path = Path(request.node.path)
    return GoldenFixture(path.parent / "golden", _safe(f"{path.stem}.{request.node.name}"),
                         request.config.getoption(REGEN_FLAG))
