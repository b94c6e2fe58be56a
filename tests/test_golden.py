"""Golden suites: generate → run → verify is bit-exact; corruption and bit flips are caught."""
import json

import numpy as np
import pytest

from mpt import golden
from mpt.formats import get_format
from mpt.cli import main


def as_bits(a):
    return np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    cases = golden.generate("default", seed=0)
    gdir = golden.write_suite(cases, root / "suite", suite="default")
    out = golden.run_mpt(gdir, root / "mpt-out")
    return cases, gdir, out


def test_generation_is_deterministic(suite):
    cases, _, _ = suite
    again = golden.generate("default", seed=0)
    assert [c.name for c in again] == [c.name for c in cases]
    for a, b in zip(cases, again):
        for key in a.outputs:
            assert np.array_equal(as_bits(a.outputs[key]), as_bits(b.outputs[key]))


def test_load_round_trips_every_array(suite):
    cases, gdir, _ = suite
    loaded = golden.load_suite(gdir)
    for a, b in zip(cases, loaded):
        assert a.params == b.params and a.kind == b.kind
        for key in a.inputs:
            assert a.inputs[key].dtype == b.inputs[key].dtype
            assert np.array_equal(as_bits(a.inputs[key]), as_bits(b.inputs[key]))


def test_mpt_outputs_verify_bit_exact(suite):
    _, gdir, out = suite
    rows = golden.verify(gdir, out)
    assert rows and all(r["verdict"] == "bit-exact" for r in rows)
    assert golden.passed(rows)


def _copy(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def test_one_flipped_bit_is_reported(suite, tmp_path):
    cases, gdir, out = suite
    bad = _copy(out, tmp_path / "bad")
    name = "round-fp16-nearest_even"
    with np.load(bad / f"{name}.npz") as data:
        y = data["y"].copy()
    bits = y.view(np.uint16)
    bits[300] ^= 1
    np.savez(bad / f"{name}.npz", y=y)
    rows = {r["case"]: r for r in golden.verify(gdir, bad)}
    row = rows[name]
    assert row["verdict"] == "mismatch" and row["first_index"] == [300]
    assert row["n_differ"] == 1 and row["worst_ulp"] in (1, "inf")
    assert int(row["actual_bits"], 16) ^ int(row["desired_bits"], 16) == 1
    assert not golden.passed(rows.values())
    assert sum(r["verdict"] != "bit-exact" for r in rows.values()) == 1


def test_changed_input_file_is_caught_by_hash(suite, tmp_path):
    _, gdir, out = suite
    tampered = _copy(gdir, tmp_path / "tampered")
    name = "round-bf16-up"
    path = tampered / f"{name}.npz"
    with np.load(path) as data:
        arrays = {k: data[k].copy() for k in data.files}
    arrays["in.x"][0] = 42.0
    np.savez(path, **arrays)
    rows = {r["case"]: r for r in golden.verify(tampered, out)}
    assert rows[name]["verdict"] == "corrupt golden"
    assert "does not match its manifest hash" in rows[name]["detail"]
    with pytest.raises(golden.GoldenError, match="does not match its manifest hash"):
        golden.load_suite(tampered)


def test_missing_and_malformed_outputs(suite, tmp_path):
    _, gdir, out = suite
    partial = _copy(out, tmp_path / "partial")
    (partial / "round-fp16-up.npz").unlink()
    np.savez(partial / "round-fp16-down.npz", z=np.zeros(3))
    rows = {r["case"]: r for r in golden.verify(gdir, partial)}
    assert rows["round-fp16-up"]["verdict"] == "missing"
    assert rows["round-fp16-down"]["verdict"] == "bad output"
    rows = {r["case"]: r for r in golden.verify(gdir, partial, allow_missing=True)}
    assert rows["round-fp16-up"]["verdict"] == "skipped"


def test_exact_wider_floats_are_accepted(suite, tmp_path):
    """A backend may write bf16 outputs as float32 (what torch's .float() gives) if exact."""
    cases, gdir, out = suite
    wide = _copy(out, tmp_path / "wide")
    name = "round-bf16-nearest_even"
    with np.load(wide / f"{name}.npz") as data:
        y = data["y"].view(get_format("bf16").dtype)
    with np.errstate(invalid="ignore"):
        np.savez(wide / f"{name}.npz", y=y.astype(np.float32))
    assert {r["case"]: r for r in golden.verify(gdir, wide)}[name]["verdict"] == "bit-exact"


def test_cli_round_trip_and_exit_codes(suite, tmp_path, capsys):
    _, gdir, out = suite
    report = tmp_path / "report.json"
    assert main(["golden", "verify", "--golden", str(gdir), "--outputs", str(out),
                 "--report", str(report)]) == 0
    assert "cases pass" in capsys.readouterr().out
    assert all(r["verdict"] == "bit-exact" for r in json.loads(report.read_text()))
    assert main(["golden", "verify", "--golden", str(tmp_path / "nope"),
                 "--outputs", str(out)]) == 2
    assert "no manifest.json" in capsys.readouterr().err
