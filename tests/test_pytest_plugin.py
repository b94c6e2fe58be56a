"""The `golden` pytest fixture (mpt.golden.pytest_plugin), run in isolated inner pytest sessions."""
import json

import numpy as np
import pytest

from mpt.golden.pytest_plugin import entry_point_active

pytest_plugins = ["pytester"]

TEST_FILE = """
import numpy as np
import ml_dtypes

X = np.linspace(-3, 3, 7, dtype=np.float32)

def test_op(golden):
    y = (X * np.float32(1.5)).astype(ml_dtypes.bfloat16)
    golden({"y": y, "mask": X > 0}, inputs={"x": X})

def test_ulp(golden):
    moved = (X.view(np.uint32) + np.uint32({bump})).view(np.float32)   # {bump} ULP from X
    golden(moved, name="moved", max_ulp=2)
"""


def _run(pytester, *args, bump="0"):
    pytester.makepyfile(test_user=TEST_FILE.replace("{bump}", bump))
    # the inner session loads the plugin the way this one did: entry point, else -p
    plugin = [] if entry_point_active() else ["-p", "mpt.golden.pytest_plugin"]
    return pytester.runpytest_inprocess(*plugin, *args)


def test_missing_case_fails_then_regen_writes_it_then_it_passes(pytester):
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*no golden case 'test_user.test_op'*--mpt-regen-golden*"])
    _run(pytester, "--mpt-regen-golden").assert_outcomes(passed=2)
    folder = pytester.path / "golden"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert [e["name"] for e in manifest["cases"]] == ["test_user.test_op",
                                                      "test_user.test_ulp.moved"]
    assert manifest["cases"][1]["contract"]["max_ulp"] == 2
    assert (folder / "test_user.test_op.npz").is_file()
    _run(pytester).assert_outcomes(passed=2)


def test_changed_outputs_fail_within_ulp_bound_passes(pytester):
    _run(pytester, "--mpt-regen-golden").assert_outcomes(passed=2)
    _run(pytester, bump="2").assert_outcomes(passed=2)        # 2 ULP: within the bound
    result = _run(pytester, bump="3")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*test_user.test_ulp.moved: output 'out' differs*<= 2 ULP*"])


def test_tampered_case_file_is_caught_by_its_hash(pytester):
    _run(pytester, "--mpt-regen-golden").assert_outcomes(passed=2)
    path = pytester.path / "golden" / "test_user.test_op.npz"
    data = bytearray(path.read_bytes())
    data[-40] ^= 1
    path.write_bytes(bytes(data))
    result = _run(pytester)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*does not match its manifest hash*"])


def test_changed_inputs_are_stale(pytester):
    _run(pytester, "--mpt-regen-golden").assert_outcomes(passed=2)
    pytester.makepyfile(test_user=TEST_FILE.replace("{bump}", "0").replace("-3, 3", "-3, 4"))
    plugin = [] if entry_point_active() else ["-p", "mpt.golden.pytest_plugin"]
    result = pytester.runpytest_inprocess(*plugin)
    result.stdout.fnmatch_lines(["*input 'x' changed*--mpt-regen-golden*"])


def test_fixture_is_registered_once_in_this_session(pytestconfig):
    manager = pytestconfig.pluginmanager
    plugins = [p for p in manager.get_plugins()
               if getattr(p, "__name__", "") == "mpt.golden.pytest_plugin"]
    assert len(plugins) == 1
    assert pytestconfig.getoption("--mpt-regen-golden") is False


def test_bad_arguments(golden):
    with pytest.raises(TypeError, match="outputs must be"):
        golden({})
    with pytest.raises(ValueError, match="max_ulp"):
        golden({"y": 1}, max_ulp=-1)


def test_regen_writes_a_checked_suite_with_a_digest(pytester):
    from mpt import golden as suites

    _run(pytester, "--mpt-regen-golden").assert_outcomes(passed=2)
    folder = pytester.path / "golden"
    manifest = suites.read_manifest(folder)                    # every field and the digest
    assert manifest["digest"] == suites.suite_digest(folder)
    assert {e["kind"] for e in manifest["cases"]} == {suites.FIXTURE_KIND}
    pytester.makepyfile(test_pin=f"""
def test_pin(golden):
    assert golden.digest == {manifest["digest"]!r}
""")
    plugin = [] if entry_point_active() else ["-p", "mpt.golden.pytest_plugin"]
    pytester.runpytest_inprocess(*plugin, "test_pin.py").assert_outcomes(passed=1)


def test_a_hand_edited_contract_fails(pytester):
    _run(pytester, "--mpt-regen-golden").assert_outcomes(passed=2)
    path = pytester.path / "golden" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["cases"][1]["contract"] = {"max_ulp": 1000, "text": "<= 1000 ULP"}
    path.write_text(json.dumps(manifest))
    result = _run(pytester, bump="3")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*does not match its digest*"])


@pytest.mark.parametrize("outputs", [{"a/b": 1}, {"..": 1}, {"": 1}, {1: 1}])
def test_array_names_must_be_plain(golden, outputs):
    with pytest.raises(ValueError, match="outputs: names must match"):
        golden({k: np.zeros(1) if v else v for k, v in outputs.items()})
