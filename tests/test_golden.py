"""Golden suites: generate → run → verify is bit-exact; corruption and bit flips are caught."""
import json
import pathlib

import numpy as np
import pytest

import mpt
from mpt import golden
from mpt.cli import main
from mpt.engines import mma_models
from mpt.formats import get_format


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


COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "reference_results" / "default"


def _array_hashes(manifest):
    return {e["name"]: (e["kind"], e["params"], e["contract"],
                        {k: v["sha256"] for k, v in e["arrays"].items()})
            for e in manifest["cases"]}


def test_generate_reproduces_the_committed_suite_bit_for_bit(suite):
    """The regression test of mpt's numerics: regenerate the committed default suite and compare
    every array's sha256 (inputs and outputs). When mpt changes its numerics on purpose, run
    ``mpt golden generate --force`` to refresh reference_results/default and commit it with the
    change."""
    _, gdir, _ = suite
    fresh = _array_hashes(json.loads((gdir / "manifest.json").read_text()))
    committed = _array_hashes(json.loads((COMMITTED / "manifest.json").read_text()))
    assert sorted(fresh) == sorted(committed)
    changed = [name for name in fresh if fresh[name] != committed[name]]
    assert not changed, f"{len(changed)} cases differ from the committed suite, e.g. {changed[:5]}"


def test_committed_suite_loads_and_is_small():
    cases = golden.load_suite(COMMITTED)                       # every hash checked on load
    manifest = golden.read_manifest(COMMITTED)                 # schema 2, its digest matches
    assert golden.suite_digest(COMMITTED) == manifest["digest"]
    assert {c.kind for c in cases} == set(golden.KINDS)
    size = sum(f.stat().st_size for f in COMMITTED.iterdir())
    assert size < 4 * 2**20


def test_default_suite_covers_every_mma_preset_and_format(suite):
    cases, _, _ = suite
    seen = {(c.params["model"], c.params["in_format"]) for c in cases if c.kind == "mma"}
    software = {c.params["model"] for c in cases if c.kind == "gemm" and c.params.get("options")
                is not None}
    for name, model in mma_models().items():
        for cfg in model.configs:
            if cfg.param("software"):              # only mpt.gemm runs it: a gemm case
                assert name in software, name
                continue
            assert all((name, f) in seen for f in cfg.inputs), name
    assert max(c.inputs["a"].shape[-1] for c in cases if c.kind == "mma") == 4096
    promoted = [c for c in cases if c.kind == "gemm" and c.params["promote_every"] == 128]
    assert promoted and any(c.params["split_k"] > 1 for c in cases if c.kind == "gemm")


def test_flipped_mask_and_counter_outputs_are_mismatches(suite, tmp_path):
    _, gdir, out = suite
    bad = _copy(out, tmp_path / "bad")
    name = "fake_quant-per_tensor-qint8"
    with np.load(bad / f"{name}.npz") as data:
        arrays = {k: data[k].copy() for k in data.files}
    arrays["mask"][7] = ~arrays["mask"][7]
    np.savez(bad / f"{name}.npz", **arrays)
    name2 = "grad_scaler-interval4"
    with np.load(bad / f"{name2}.npz") as data:
        arrays = {k: data[k].copy() for k in data.files}
    arrays["growth_tracker"][3] += 1
    np.savez(bad / f"{name2}.npz", **arrays)
    rows = {r["case"]: r for r in golden.verify(gdir, bad)}
    assert rows[name]["verdict"] == "mismatch" and rows[name]["output"] == "mask"
    assert rows[name]["first_index"] == [7]
    assert rows[name2]["verdict"] == "mismatch" and rows[name2]["first_index"] == [3]
    assert sum(r["verdict"] != "bit-exact" for r in rows.values()) == 2


def test_edge_cases_hold_specials(suite):
    cases, _, _ = suite
    case = next(c for c in cases if c.name == "mma-hopper-fp16-fp32-edge")
    a = case.inputs["a"]
    assert np.isnan(a).any() and np.isinf(a).any() and (a == 0).any()
    assert (np.abs(a[np.isfinite(a)]) == np.float16(2**-24)).any()           # subnormal
    d = case.outputs["d"]
    assert np.isnan(d[0]).all() and np.isnan(d[:, 0]).all()        # NaN in a's row, b's column
    assert np.isfinite(d[1:, 1:]).sum() >= 6


def test_amd_cases_keep_their_own_nans_and_formats(suite):
    """AMD's results carry no canonical NaN (NVIDIA's 0x7FFFFFFF); f64 cases are FP64 throughout;
    CDNA4's block-scale GEMM hands its E8M0 codes to the instruction (block_scale_a/b)."""
    cases = {c.name: c for c in suite[0]}
    d = cases["mma-cdna3-fp16-fp32-edge"].outputs["d"]
    nan_bits = d.view(np.uint32)[np.isnan(d)]
    assert nan_bits.size and not (nan_bits == 0x7FFFFFFF).any()
    assert (cases["mma-hopper-fp16-fp32-edge"].outputs["d"].view(np.uint32)[0] == 0x7FFFFFFF).all()
    f64 = cases["gemm-cdna2-fp64-splitk2"]
    assert f64.inputs["c"].dtype == np.float64 and f64.outputs["d"].dtype == np.float64
    scaled = cases["gemm-cdna4-fp4-e8m0-block-scales-splitk2"]
    assert scaled.inputs["block_scale_a"].dtype == mpt.get_format("e8m0").dtype
    assert scaled.inputs["block_scale_a"].shape == (4, 16) and "scale_a" not in scaled.inputs


def _one_of_each_kind(rng):
    """The default suite's inputs, reduced to the first case of each kind and every 16th case."""
    cases, kinds = golden.SUITES["default"](rng), set()
    keep = [c for i, c in enumerate(cases) if not (c.kind in kinds or kinds.add(c.kind))
            or i % 16 == 0]
    return keep


def test_generation_as_dask_tasks_writes_the_same_suite(dask_client, tmp_path, monkeypatch,
                                                         capsys):
    """One task per case on two worker processes, written by the one writer: the same
    manifest, byte for byte (so the same digest and the same hash of every array and file)."""
    monkeypatch.setitem(golden.SUITES, "sample", _one_of_each_kind)
    serial = golden.write_suite(golden.generate("sample", seed=3), tmp_path / "serial",
                                suite="sample")
    assert main(["golden", "generate", "--suite", "sample", "--seed", "3", "--quiet",
                 "--scheduler", dask_client.scheduler.address, "--out",
                 str(tmp_path / "dask")]) == 0
    assert "wrote" in capsys.readouterr().out
    manifest = (serial / "manifest.json").read_bytes()
    assert (tmp_path / "dask" / "manifest.json").read_bytes() == manifest
    entries = json.loads(manifest)["cases"]
    assert {e["kind"] for e in entries} == set(golden.KINDS) and len(entries) > 20
    assert golden.suite_digest(tmp_path / "dask") == json.loads(manifest)["digest"]
