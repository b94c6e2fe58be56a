"""Golden suites on disk: names never lead outside a folder, the manifest is checked whole (every
bad field is one GoldenError naming it), the suite digest pins manifest and files, and
``generate`` replaces only a suite it wrote. Each file test checks that nothing outside the folder
was read or written and that no prior file changed."""
import hashlib
import json
import os
import re

import numpy as np
import pytest

from mpt import golden
from mpt._io import default_mode
from mpt.cli import main

X = np.array([0.0, -0.0, 1.0, 1.5, 65520.0, 2.0**-25, np.inf, np.nan, -3.25], np.float32)


def _cases():
    cases = []
    for fmt in ("fp16", "bf16", "fp8_e4m3fn"):
        params = {"format": fmt, "mode": "nearest_even", "saturate": False, "subnormals": True}
        case = golden.Case(f"round-{fmt}", "round", params, {"x": X})
        case.outputs = golden.KINDS["round"](case.inputs, params)
        cases.append(case)
    return cases


@pytest.fixture
def suite(tmp_path):
    gdir = golden.write_suite(_cases(), tmp_path / "suite", suite="small")
    out = golden.run_mpt(gdir, tmp_path / "out")
    victim = tmp_path / "elsewhere" / "victim.npz"
    victim.parent.mkdir()
    victim.write_bytes(b"the user's own file")
    return gdir, out, victim


def _manifest(gdir):
    return json.loads((gdir / "manifest.json").read_text())


def _write_manifest(gdir, manifest, *, redigest=True):
    if redigest:
        manifest["digest"] = golden.manifest_digest(manifest)
    (gdir / "manifest.json").write_text(json.dumps(manifest))


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err, match):
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mpt golden: error:"), err
    assert re.search(match, lines[0]), lines[0]


# ---- names and files are plain base names -------------------------------------------------------
def _outside(victim):
    """Names that point outside the folder (the victim's stem, so ``<name>.npz`` is the victim)."""
    stem = str(victim.with_suffix(""))
    return [stem, "../elsewhere/victim", "sub/victim", "..", ".hidden", "", "a" * 201,
            "x\x00y", "a..b", "c:\\victim", "-rf"]


@pytest.mark.parametrize("which", ["name", "file"])
@pytest.mark.parametrize("index", range(11))
def test_names_outside_the_folder_are_refused_before_anything_is_touched(
        suite, capsys, opened, which, index, files):
    gdir, out, victim = suite
    bad = _outside(victim)[index]
    manifest = _manifest(gdir)
    entry = manifest["cases"][1]
    entry[which] = bad if which == "name" else bad + ".npz"
    if which == "name" and bad:                      # file follows the name, as an attacker would
        entry["file"] = bad + ".npz"
    _write_manifest(gdir, manifest)
    before = files(gdir, out, victim.parent)
    opened.clear()
    pattern = re.escape(f"cases[1].{which}")
    with pytest.raises(golden.GoldenError, match=pattern):
        golden.read_manifest(gdir)
    with pytest.raises(golden.GoldenError, match=pattern):
        golden.verify(gdir, out)
    with pytest.raises(golden.GoldenError, match=pattern):
        golden.load_suite(gdir)
    for action in ("run", "verify"):
        code, _, err = _cli(capsys, "golden", action, "--golden", gdir, "--outputs", out)
        assert code == 2
        _one_line_error(err, pattern)
    code, _, err = _cli(capsys, "golden", "run", "--golden", gdir, "--outputs", gdir.parent / "new")
    assert code == 2 and not (gdir.parent / "new").exists()
    # only the manifest was opened: no case file, no output, nothing outside
    assert set(opened) == {str(gdir / "manifest.json")}
    assert files(gdir, out, victim.parent) == before           # nothing written anywhere


def test_the_reported_attack_no_longer_writes_outside(suite, capsys, files):
    """The issue's repro: one case's name set to an absolute path in a copied suite."""
    gdir, out, victim = suite
    manifest = _manifest(gdir)
    manifest["cases"][0]["name"] = str(victim.with_suffix(""))
    _write_manifest(gdir, manifest, redigest=False)                # as the issue did it
    before = files(victim.parent)
    code, _, err = _cli(capsys, "golden", "run", "--golden", gdir, "--outputs", out)
    assert code == 2 and "cases[0].name must be a plain file name" in err
    assert files(victim.parent) == before


@pytest.mark.parametrize("target", ["case", "manifest", "output"])
def test_symbolic_links_are_refused_never_followed(suite, tmp_path, opened, target, files):
    gdir, out, victim = suite
    name = "round-bf16.npz"
    folder = out if target == "output" else gdir
    file = "manifest.json" if target == "manifest" else name
    copy = victim.parent / file                     # an identical copy: its hash would pass
    copy.write_bytes((folder / file).read_bytes())
    (folder / file).unlink()
    (folder / file).symlink_to(copy)
    before = files(gdir, out, victim.parent)
    opened.clear()
    if target == "manifest":
        with pytest.raises(golden.GoldenError, match="symbolic link"):
            golden.verify(gdir, out)
    else:
        rows = {r["case"]: r for r in golden.verify(gdir, out)}
        row = rows["round-bf16"]
        assert row["verdict"] == ("corrupt golden" if target == "case" else "bad output")
        assert "symbolic link" in row["detail"]
        assert not golden.passed(rows.values())
        assert [r["verdict"] for n, r in rows.items() if n != "round-bf16"] == ["bit-exact"] * 2
    if target == "case":
        with pytest.raises(golden.GoldenError, match="symbolic link"):
            golden.run_mpt(gdir, out)
    seen = list(opened)
    assert str(copy) not in seen and not any(p.startswith(str(victim.parent)) for p in seen)
    assert files(gdir, out, victim.parent) == before


def test_outputs_folder_must_not_be_the_golden_folder(suite, capsys, files):
    gdir, _, _ = suite
    before = files(gdir)
    code, _, err = _cli(capsys, "golden", "run", "--golden", gdir, "--outputs", gdir)
    assert code == 2
    _one_line_error(err, "is the golden folder")
    assert files(gdir) == before


def test_a_fifo_is_not_read(suite):
    gdir, out, _ = suite
    (out / "round-fp16.npz").unlink()
    os.mkfifo(out / "round-fp16.npz")                 # a blocking read would hang the test
    rows = {r["case"]: r for r in golden.verify(gdir, out)}
    assert rows["round-fp16"]["verdict"] == "bad output"
    assert "not a regular file" in rows["round-fp16"]["detail"]


# ---- the digest ----------------------------------------------------------------------------------
def test_digest_is_the_documented_hash_of_the_manifest(suite, capsys):
    gdir, out, _ = suite
    manifest = _manifest(gdir)
    body = {k: v for k, v in manifest.items() if k != "digest"}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                           allow_nan=False).encode("ascii")
    digest = hashlib.sha256(canonical).hexdigest()
    assert manifest["digest"] == digest == golden.suite_digest(gdir)
    # the manifest holds every file's sha256: the digest pins every byte of the suite
    for entry in manifest["cases"]:
        assert hashlib.sha256((gdir / entry["file"]).read_bytes()).hexdigest() == \
            entry["file_sha256"]
    code, text, _ = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out,
                         "--expect-digest", digest.upper())
    assert code == 0 and f"suite digest: {digest} (as expected)" in text


def test_a_loosened_contract_is_caught(suite, capsys):
    gdir, out, _ = suite
    pinned = golden.suite_digest(gdir)
    manifest = _manifest(gdir)
    manifest["cases"][0]["contract"] = {"max_ulp": 1e30, "text": "<= 1e+30 ULP"}
    _write_manifest(gdir, manifest, redigest=False)
    with pytest.raises(golden.GoldenError, match=r"cases\[0\]\.contract\.max_ulp must be an "
                                                 r"integer; got 1e\+30"):
        golden.verify(gdir, out)
    # a well-formed loosening, hand-edited: the stored digest no longer matches
    manifest["cases"][0]["contract"] = {"max_ulp": 1000, "text": "<= 1000 ULP"}
    _write_manifest(gdir, manifest, redigest=False)
    with pytest.raises(golden.GoldenError, match="does not match its digest"):
        golden.verify(gdir, out)
    # ... and with the digest recomputed: a different suite, which the pin refuses
    _write_manifest(gdir, manifest)
    assert golden.passed(golden.verify(gdir, out))
    with pytest.raises(golden.GoldenError, match=f"has digest .* not the expected {pinned}"):
        golden.verify(gdir, out, expect_digest=pinned)
    code, text, err = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out,
                           "--expect-digest", pinned)
    assert code == 2 and text == ""
    _one_line_error(err, "not the suite that was pinned")


def test_a_changed_case_file_fails_the_pin(suite):
    gdir, out, _ = suite
    pinned = golden.suite_digest(gdir)
    path = gdir / "round-fp16.npz"
    with np.load(path) as data:
        arrays = {k: data[k].copy() for k in data.files}
    arrays["in.x"][2] = 2.0
    np.savez(path, **arrays)
    with pytest.raises(golden.GoldenError, match="does not match its manifest hash"):
        golden.suite_digest(gdir)
    rows = golden.verify(gdir, out, expect_digest=pinned)       # same manifest, changed file
    assert rows[0]["verdict"] == "corrupt golden" and not golden.passed(rows)


@pytest.mark.parametrize("bad", ["", "abc", "0" * 63, "g" * 64, 42, None])
def test_expect_digest_must_be_a_digest(suite, capsys, bad):
    gdir, out, _ = suite
    if bad is None:
        assert golden.passed(golden.verify(gdir, out, expect_digest=None))
        return
    with pytest.raises(ValueError, match="expect_digest must be a suite digest"):
        golden.verify(gdir, out, expect_digest=bad)
    if isinstance(bad, str):
        code, _, err = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out,
                            f"--expect-digest={bad}")
        assert code == 2
        _one_line_error(err, "expect_digest")


# ---- the manifest loader, fuzzed -----------------------------------------------------------------
#: (path of a field, a value of a wrong type) for every field of the schema
FIELDS = [
    (("schema_version",), "2"), (("suite",), 1), (("versions",), []),
    (("cases",), {}), (("digest",), "xyz"),
    (("cases", 0), "round-fp16"),
    (("cases", 0, "name"), 1), (("cases", 0, "kind"), None), (("cases", 0, "params"), []),
    (("cases", 0, "contract"), "bit-exact"), (("cases", 0, "contract", "max_ulp"), "0"),
    (("cases", 0, "contract", "text"), 0), (("cases", 0, "file"), ["x"]),
    (("cases", 0, "file_sha256"), "0" * 63), (("cases", 0, "arrays"), ["in.x"]),
    (("cases", 0, "arrays", "in.x"), "float32"),
    (("cases", 0, "arrays", "in.x", "dtype"), 4), (("cases", 0, "arrays", "in.x", "shape"), 9),
    (("cases", 0, "arrays", "out.y", "sha256"), None),
]


def _where(path):
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _parent(manifest, path):
    obj = manifest
    for part in path[:-1]:
        obj = obj[part]
    return obj


@pytest.mark.parametrize("path, wrong", FIELDS, ids=[_where(p) for p, _ in FIELDS])
@pytest.mark.parametrize("how", ["missing", "wrong type"])
def test_every_missing_or_mistyped_field_is_named(suite, capsys, path, wrong, how, files):
    gdir, out, _ = suite
    manifest = _manifest(gdir)
    parent = _parent(manifest, path)
    if how == "missing":
        if isinstance(parent, list):
            parent.clear()                               # cases: [] (the suite is empty)
            expected = "cases is empty"
        else:
            del parent[path[-1]]
            expected = f"{_where(path)} is missing"
            if path[-1] in ("in.x", "out.y"):             # an array dropped from the manifest
                expected = "cases[0].arrays" if path[-1] == "out.y" else None
    else:
        parent[path[-1]] = wrong
        expected = _where(path) + (" must be" if path != ("cases", 0) else "")
    if path == ("digest",) and how == "missing":
        (gdir / "manifest.json").write_text(json.dumps(manifest))
    else:
        _write_manifest(gdir, manifest, redigest=path != ("digest",))
    before = files(gdir, out)
    if expected is None:                               # in.x unlisted: the file disagrees
        rows = golden.verify(gdir, out)
        assert rows[0]["verdict"] == "corrupt golden" and "manifest lists" in rows[0]["detail"]
        return
    with pytest.raises(golden.GoldenError, match=re.escape(expected)):
        golden.read_manifest(gdir)
    code, _, err = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out)
    assert code == 2
    _one_line_error(err, re.escape(expected))
    assert files(gdir, out) == before


BAD_VALUES = [
    (("schema_version",), 1, "schema_version 1 is not 2"),
    (("schema_version",), 3, "schema_version 3 is not 2"),
    (("schema_version",), True, "schema_version must be an integer"),
    (("cases", 0, "kind"), "gemv", r"cases[0].kind 'gemv' is not a known kind"),
    (("cases", 0, "arrays", "in.x", "dtype"), "object", "cases[0].arrays.in.x.dtype"),
    (("cases", 0, "arrays", "in.x", "dtype"), "float8_e9m9", "cases[0].arrays.in.x.dtype"),
    (("cases", 0, "arrays", "in.x", "dtype"), "<U4", "cases[0].arrays.in.x.dtype"),
    (("cases", 0, "arrays", "in.x", "shape"), [-1], "cases[0].arrays.in.x.shape"),
    (("cases", 0, "arrays", "in.x", "shape"), [1.5], "cases[0].arrays.in.x.shape"),
    (("cases", 0, "arrays", "in.x", "shape"), [True], "cases[0].arrays.in.x.shape"),
    (("cases", 0, "arrays", "in.x", "shape"), ["9"], "cases[0].arrays.in.x.shape"),
    (("cases", 0, "arrays", "in.x", "shape"), [1] * 65, "cases[0].arrays.in.x.shape"),
    (("cases", 0, "contract", "max_ulp"), -1, "cases[0].contract.max_ulp must be in"),
    (("cases", 0, "contract", "max_ulp"), 2**64, "cases[0].contract.max_ulp must be in"),
    (("cases", 0, "contract", "max_ulp"), True, "cases[0].contract.max_ulp must be an integer"),
    (("cases", 0, "contract", "text"), "<= 3 ULP", "cases[0].contract.text"),
    (("cases", 0, "file"), "round-bf16.npz", "cases[0].file must be the case name"),
    (("cases", 0, "file_sha256"), "A" * 64, "cases[0].file_sha256"),
    (("cases", 0, "extra"), 1, "cases[0] has unknown fields ['extra']"),
    (("extra",), 1, "manifest has unknown fields ['extra']"),
    (("cases", 0, "contract", "rtol"), 0.1, "cases[0].contract has unknown fields"),
    (("cases", 0, "arrays", "in.x", "strides"), [4], "cases[0].arrays.in.x has unknown fields"),
    (("cases", 0, "arrays", "x"), {}, "key 'x' is not 'in.<name>'"),
    (("cases", 0, "arrays", "in./etc"), {}, "key 'in./etc' is not"),
    (("cases", 0, "arrays", "out.a..b"), {}, "key 'out.a..b' is not"),
    (("cases", 1, "name"), "ROUND-fp16", "cases[1].name 'ROUND-fp16' repeats case 0"),
]


@pytest.mark.parametrize("path, value, match", BAD_VALUES,
                         ids=[f"{_where(p)}={v!r}"[:60] for p, v, _ in BAD_VALUES])
def test_bad_values_are_named(suite, capsys, path, value, match):
    gdir, out, _ = suite
    manifest = _manifest(gdir)
    _parent(manifest, path)[path[-1]] = value
    if path == ("cases", 1, "name"):
        manifest["cases"][1]["file"] = value + ".npz"
    _write_manifest(gdir, manifest)
    with pytest.raises(golden.GoldenError, match=re.escape(match)):
        golden.read_manifest(gdir)
    code, _, err = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out)
    assert code == 2
    _one_line_error(err, re.escape(match))


def test_no_output_array_and_empty_arrays_are_refused(suite):
    gdir, _, _ = suite
    manifest = _manifest(gdir)
    del manifest["cases"][0]["arrays"]["out.y"]
    _write_manifest(gdir, manifest)
    with pytest.raises(golden.GoldenError, match=r"cases\[0\]\.arrays has no output"):
        golden.read_manifest(gdir)
    manifest["cases"][0]["arrays"] = {}
    _write_manifest(gdir, manifest)
    with pytest.raises(golden.GoldenError, match=r"cases\[0\]\.arrays is empty"):
        golden.read_manifest(gdir)


@pytest.mark.parametrize("text, match", [
    (b"[]", "manifest must be a JSON object"),
    (b"{", "is not valid JSON"),
    (b"\xff\xfe", "is not valid JSON"),
    (b'{"schema_version": 2, "schema_version": 2}', "repeats the key 'schema_version'"),
    (b'{"schema_version": NaN}', "holds NaN"),
    (b'{"schema_version": -Infinity}', "holds -Infinity"),
    (b"", "is not valid JSON"),
])
def test_unreadable_manifests_are_one_line_errors(suite, capsys, text, match):
    gdir, out, _ = suite
    (gdir / "manifest.json").write_bytes(text)
    with pytest.raises(golden.GoldenError, match=re.escape(match)):
        golden.read_manifest(gdir)
    code, _, err = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out)
    assert code == 2
    _one_line_error(err, re.escape(match))


def test_load_case_checks_the_entry_it_is_given(suite):
    gdir, _, victim = suite
    entry = _manifest(gdir)["cases"][0]
    entry["file"] = str(victim)
    with pytest.raises(golden.GoldenError, match=r"\.file must be the case name"):
        golden.load_case(gdir, entry)


def test_empty_suite_and_empty_reports_fail(suite, capsys):
    gdir, out, _ = suite
    rows = golden.verify(gdir, out)
    assert golden.passed(rows)
    assert not golden.passed([])
    assert not golden.passed([{**r, "verdict": "skipped"} for r in rows])
    manifest = _manifest(gdir)
    manifest["cases"] = []
    _write_manifest(gdir, manifest)
    code, _, err = _cli(capsys, "golden", "verify", "--golden", gdir, "--outputs", out)
    assert code == 2
    _one_line_error(err, "cases is empty")
    with pytest.raises(golden.GoldenError, match="cases must be a non-empty list"):
        golden.write_suite([], gdir.parent / "empty")
    assert not (gdir.parent / "empty").exists()


def test_bad_params_are_one_line_errors(suite, capsys, files):
    gdir, out, _ = suite
    manifest = _manifest(gdir)
    del manifest["cases"][2]["params"]["mode"]
    _write_manifest(gdir, manifest)
    before = files(out)
    code, _, err = _cli(capsys, "golden", "run", "--golden", gdir, "--outputs", out)
    assert code == 2
    _one_line_error(err, r"case 'round-fp8_e4m3fn' \(round\): its params or inputs do not fit")
    assert files(out) == before                   # every case is computed before any is written


def test_fixture_cases_are_not_recomputed(suite, files):
    gdir, out, _ = suite
    manifest = _manifest(gdir)
    manifest["cases"][1]["kind"] = golden.FIXTURE_KIND
    _write_manifest(gdir, manifest)
    before = files(out)
    with pytest.raises(golden.GoldenError, match="which mpt does not compute"):
        golden.run_mpt(gdir, out)
    assert files(out) == before
    assert golden.passed(golden.verify(gdir, out))          # verify compares them all the same


# ---- writing a suite -----------------------------------------------------------------------------
def _siblings(path):
    return sorted(p.name for p in path.parent.iterdir())


def test_write_refuses_a_file_a_link_and_a_foreign_folder(tmp_path, capsys, monkeypatch, files):
    monkeypatch.setitem(golden.SUITES, "small", lambda rng: _cases())
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "data.npz").write_bytes(b"mine")
    (foreign / "manifest.json").write_text('{"something": "else"}')
    link = tmp_path / "link"
    link.symlink_to(foreign)
    before = files(tmp_path)
    for target, match in ((file, "is a file"), (foreign, "holds no mpt golden suite"),
                          (link, "symbolic link")):
        for force in (False, True):
            with pytest.raises(golden.GoldenError, match=match):
                golden.write_suite(_cases(), target, force=force)
            code, _, err = _cli(capsys, "golden", "generate", "--suite", "small", "--out", target,
                                *(["--force"] if force else []))
            assert code == 2
            _one_line_error(err, match)
    assert files(tmp_path) == before
    assert _siblings(file) == ["foreign", "link", "notes.txt"]    # no temporary folder left


def test_an_existing_suite_is_replaced_only_with_force(tmp_path, capsys, monkeypatch, files):
    monkeypatch.setitem(golden.SUITES, "small", lambda rng: _cases())
    old_cases = _cases()
    old_cases[0].name = "old-only"
    gdir = golden.write_suite(old_cases, tmp_path / "g")
    before = files(tmp_path)
    with pytest.raises(golden.GoldenError, match="already holds a golden suite"):
        golden.write_suite(_cases(), gdir)
    code, _, err = _cli(capsys, "golden", "generate", "--suite", "small", "--out", gdir)
    assert code == 2
    _one_line_error(err, "--force")
    assert files(tmp_path) == before
    # a file mpt did not write: refused even with --force, nothing changed
    (gdir / "README").write_text("my notes")
    before = files(tmp_path)
    code, _, err = _cli(capsys, "golden", "generate", "--suite", "small", "--out", gdir, "--force")
    assert code == 2
    _one_line_error(err, r"not part of its golden suite \(e.g. \['README'\]\)")
    assert files(tmp_path) == before
    (gdir / "README").unlink()
    code, text, _ = _cli(capsys, "golden", "generate", "--suite", "small", "--out", gdir,
                         "--force")
    assert code == 0 and f"suite digest: {golden.suite_digest(gdir)}" in text
    assert sorted(p.name for p in gdir.iterdir()) == sorted(
        ["manifest.json"] + [f"{c.name}.npz" for c in _cases()])    # old-only.npz is gone
    assert _siblings(gdir) == ["g"]
    assert (gdir.stat().st_mode & 0o777) == default_mode(0o777)


def test_an_empty_folder_and_a_new_one_are_written(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new" / "deeper"):
        golden.write_suite(_cases(), target)
        assert golden.passed(golden.verify(target, golden.run_mpt(target, tmp_path / "o")))


def test_a_failed_write_leaves_the_old_suite(tmp_path, monkeypatch, files):
    gdir = golden.write_suite(_cases(), tmp_path / "g")
    before = files(tmp_path)
    calls = []

    def fail_on_second(path, arrays, real=golden.save_npz):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(path, arrays)

    monkeypatch.setattr(golden.suite, "save_npz", fail_on_second)
    with pytest.raises(OSError, match="disk full"):
        golden.write_suite(_cases(), gdir, force=True)
    assert files(tmp_path) == before and _siblings(gdir) == ["g"]


def test_bad_case_names_are_refused_before_writing(tmp_path, suite, files):
    _, _, victim = suite
    before = files(victim.parent)
    for bad in (str(victim.with_suffix("")), "../x", "a/b", ""):
        cases = _cases()
        cases[1].name = bad
        with pytest.raises(golden.GoldenError, match=re.escape("cases[1].name")):
            golden.write_suite(cases, tmp_path / "w")
        assert not (tmp_path / "w").exists()
    cases = _cases()
    cases[2].name = cases[0].name.upper()
    with pytest.raises(golden.GoldenError, match="repeats case 0"):
        golden.write_suite(cases, tmp_path / "w")
    assert files(victim.parent) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_object_arrays_are_never_unpickled_and_odd_dtypes_refused(suite):
    gdir, out, _ = suite
    path = gdir / "round-fp16.npz"
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files}
    for stored, match in ((np.array([{}, {}], dtype=object), "cannot be loaded"),
                          (np.array(["a", "b"], dtype="<U1"), "is stored as <U1")):
        np.savez(path, **{**arrays, "in.x": stored})
        manifest = _manifest(gdir)
        manifest["cases"][0]["file_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        _write_manifest(gdir, manifest)
        row = golden.verify(gdir, out)[0]
        assert row["verdict"] == "corrupt golden" and match in row["detail"], row
    np.savez(out / "round-bf16.npz", y=np.array([{}], dtype=object))
    row = golden.verify(gdir, out)[1]
    assert row["verdict"] == "bad output" and "Object arrays cannot be loaded" in row["detail"]


class _FakeAdapter:
    """Stands in for the PyTorch adapter (torch is optional): rounds with numpy's astype."""

    def __init__(self, torch, device):
        pass

    def round(self, inputs, params):
        if params["format"] != "fp16":
            return None
        with np.errstate(over="ignore"):
            return {"y": inputs["x"].astype(np.float16)}


def test_run_torch_checks_the_whole_suite_before_writing(suite, monkeypatch, files):
    from mpt import golden_torch

    gdir, _, victim = suite
    monkeypatch.setattr(golden_torch, "_import_torch", lambda: None)
    monkeypatch.setattr(golden_torch, "_Adapter", _FakeAdapter)
    out, written, skipped = golden_torch.run_torch(gdir, gdir.parent / "torch-out")
    assert (written, skipped) == (1, 2)
    assert sorted(p.name for p in out.iterdir()) == ["round-fp16.npz"]
    with pytest.raises(golden.GoldenError, match="is the golden folder"):
        golden_torch.run_torch(gdir, gdir)
    manifest = _manifest(gdir)
    manifest["cases"][0]["name"] = str(victim.with_suffix(""))
    manifest["cases"][0]["file"] = str(victim)
    _write_manifest(gdir, manifest)
    before = files(gdir.parent)
    with pytest.raises(golden.GoldenError, match=re.escape("cases[0].name")):
        golden_torch.run_torch(gdir, out)
    assert files(gdir.parent) == before
