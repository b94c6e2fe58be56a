"""L5: golden outputs — generate them with mpt, verify any backend's outputs against them.

A *suite* is a folder::

    manifest.json        schema, versions, and per case: kind, parameters, contract, and for
                         every array its dtype, shape and sha256; the sha256 of each case file;
                         the suite's digest
    <case>.npz           the case's inputs ("in.<name>") and mpt's outputs ("out.<name>")

Arrays are stored as plain numpy arrays, except ml_dtypes ones (bf16, fp8, ...) which are stored as
their unsigned bit patterns and viewed back through the dtype named in the manifest, so files load
with ``allow_pickle=False``. Before anything is loaded, the file's sha256 is checked against the
manifest, then each array's: a corrupted or edited file is reported, never used.

**Manifest** (``schema_version`` 2). A JSON object with exactly these fields:

- ``schema_version``: 2; ``suite``: a string; ``versions``: an object of strings (the mpt, numpy
  and ml_dtypes that wrote it); ``digest``: the suite digest (below);
- ``cases``: a non-empty list of objects with exactly ``name`` (a plain file name:
  ``[A-Za-z0-9][A-Za-z0-9_.-]*``, at most 200 characters, no ``..``; unique ignoring case),
  ``kind`` (a registered kind, or ``"pytest"`` for the fixture's cases), ``params`` (an object),
  ``contract`` (``{"max_ulp": int in [0, 2**64), "text": "bit-exact" | "<= N ULP"}``), ``file``
  (always ``<name>.npz``), ``file_sha256`` and ``arrays`` (``"in.<x>"``/``"out.<y>"`` → ``{"dtype",
  "shape", "sha256"}``, at least one output).

The whole manifest is checked before any case file is opened or any output written; a manifest
that breaks a rule raises :class:`GoldenError` naming the field (``cases[3].contract.max_ulp
must be an integer; got 1e+30``). JSON with NaN/Infinity or a repeated key is refused. Files are
read only from inside their folder: case files by their checked base name, never through a
symbolic link.

**Suite digest.** ``digest = sha256(C(manifest without its "digest" field))`` in hex, where
``C`` is the canonical JSON serialisation ``json.dumps(obj, sort_keys=True, separators=(",",
":"), ensure_ascii=True, allow_nan=False)`` encoded as ASCII. The manifest holds the sha256 of
every case file (and of every array), so the digest pins the manifest and, through those hashes,
every byte of the suite. ``read_manifest`` refuses a manifest whose stored digest does not match
(edited by hand); ``verify(..., expect_digest=HEX)`` (CLI ``--expect-digest``) refuses a suite
that is not the pinned one, and every case file is checked against its hash as it is loaded;
:func:`suite_digest` checks manifest and files and returns the digest.

A *backend's outputs* folder holds ``<case>.npz`` with one array per output name, either in the
output's dtype, as its unsigned bit patterns, or as wider floats that hold the values exactly
(what ``torch.Tensor.float()`` writes). ``verify`` compares them case by case under each case's
contract: bit-exact, or at most N ULP of the output format. A report that compared no case never
passes.

**Writing.** :func:`write_suite` writes a new suite into a temporary folder beside the target
and swaps it in. It refuses a path that is a file or a symbolic link and a non-empty folder that
holds no suite; it replaces an existing suite only with ``force=True``, only when that folder
holds nothing but the suite's files, and then deletes only the files the old manifest lists.

Case *kinds* map inputs and parameters to outputs (``KINDS``: ``round`` here, mma, gemm,
fake_quant, optim, grad_scaler, attention and train_steps in :mod:`mpt.golden_cases`); ``run_mpt``
recomputes every case with mpt itself, so ``generate → run_mpt → verify`` must be bit-exact
everywhere. Integer and boolean outputs (masks, counters) must be equal. The committed default
suite (``reference_results/default``) is mpt's numerics regression test: ``generate`` must
reproduce every array hash (tests/test_golden.py); regenerate it when numerics change on purpose.
PyTorch's side: :mod:`mpt.golden_torch`.
"""
from __future__ import annotations

import io
import json
import os
import re
import shutil
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from mpt._io import (BASE_NAME, check_base_name, default_mode, dtype_from_name, is_sha256,
                     load_json)
from mpt._io import atomic_write_bytes as _atomic_write_bytes
from mpt._io import field as _field
from mpt._io import NATIVE_DTYPES, read_in_folder, storable
from mpt._io import sha256 as _sha256
from mpt._version import __version__
from mpt import golden_cases
from mpt.formats import FORMATS, get_format
from mpt.rounding import round as mpt_round
from mpt.testing import as_bits, ulp_distance

__all__ = [
    "SCHEMA_VERSION", "MANIFEST", "FIXTURE_KIND", "Case", "KINDS", "SUITES", "register_kind",
    "generate", "write_suite", "load_suite", "run_mpt", "verify", "GoldenError", "save_npz",
    "load_case", "describe_array", "read_manifest", "passed", "format_report",
    "write_json_atomic", "suite_digest", "manifest_digest", "check_digest", "build_manifest",
    "write_case", "write_manifest", "outputs_folder", "compute_outputs", "ARRAY_NAME",
    "check_target",
]

SCHEMA_VERSION = 2
MANIFEST = "manifest.json"
#: The kind of the cases the ``golden`` pytest fixture stores: outputs of a test, which mpt
#: cannot recompute (``run_mpt`` refuses them; ``verify`` compares them like any other).
FIXTURE_KIND = "pytest"


class GoldenError(ValueError):
    """A golden suite or an outputs folder is missing, malformed or tampered with."""


@dataclass
class Case:
    """One golden case: a kind of computation, its parameters, inputs, outputs and contract."""

    name: str
    kind: str
    params: dict
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    max_ulp: int = 0  # 0: bit-exact; otherwise the ULP bound of the output format

    @property
    def contract(self) -> str:
        return _contract_text(self.max_ulp)


# ---- kinds -------------------------------------------------------------------------------------
#: kind name -> function(inputs, params) -> outputs, computed with mpt.
KINDS: dict[str, Callable[[dict, dict], dict]] = {}


def register_kind(name: str, compute: Callable[[dict, dict], dict]) -> None:
    """Register how a kind of case is computed (used by ``generate`` and ``run_mpt``)."""
    if not callable(compute):
        raise TypeError(f"compute must be callable; got {type(compute).__name__}")
    KINDS[name] = compute


def _compute_round(inputs, params):
    return {"y": mpt_round(inputs["x"], params["format"], params["mode"],
                           saturate=params["saturate"], subnormals=params["subnormals"],
                           random_bits=inputs.get("random_bits"))}


register_kind("round", _compute_round)
for _kind, _compute in golden_cases.COMPUTE.items():
    register_kind(_kind, _compute)


# ---- suites --------------------------------------------------------------------------------------
def _special_float32() -> np.ndarray:
    """Zeros, Infs, NaN, and the limits and midpoints of every 8/16-bit float format."""
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 1.5, 2.5, 3.5]
    for f in FORMATS.values():
        if f.kind != "float" or f.bits > 16:
            continue
        ulp_top = 2.0 ** (f.emax - f.mantissa_bits)
        for v in (f.max, f.min_normal, f.min_subnormal, f.max + ulp_top / 2, f.max + ulp_top,
                  f.min_subnormal / 2, f.min_subnormal * 1.5, f.min_normal - f.min_subnormal / 2):
            vals += [v, -v]
    with np.errstate(over="ignore"):
        return np.unique(np.array(vals, dtype=np.float32).view(np.uint32)).view(np.float32)


def _rounding_cases(rng: np.random.Generator, n_random: int) -> list[Case]:
    specials = _special_float32()
    cases = []
    for fmt in ("fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz", "tf32",
                "e8m0", "fp4_e2m1fn", "int8"):
        for mode in ("nearest_even", "nearest_away", "toward_zero", "up", "down", "stochastic"):
            if fmt in ("e8m0", "int8", "fp4_e2m1fn") and mode != "nearest_even":
                continue
            if get_format(fmt).kind == "int":  # NaN has no integer encoding: finite inputs
                x = np.concatenate([specials[np.isfinite(specials)],
                                    rng.uniform(-300, 300, n_random).astype(np.float32)])
            else:
                random = rng.integers(0, 2**32, n_random, dtype=np.uint64).astype(np.uint32)
                x = np.concatenate([specials, random.view(np.float32)])
            inputs = {"x": x}
            if mode == "stochastic":
                inputs["random_bits"] = rng.integers(0, 2**32, x.size, dtype=np.uint64) \
                    .astype(np.uint32)
            for saturate in (False, True) if fmt.startswith("fp8") and mode == "nearest_even" \
                    else (False,):
                params = {"format": fmt, "mode": mode, "saturate": saturate, "subnormals": True}
                name = f"round-{fmt}-{mode}" + ("-saturate" if saturate else "")
                cases.append(Case(name, "round", params, dict(inputs)))
    return cases


#: suite name -> function(rng) -> cases (inputs only; outputs are computed by ``generate``).
SUITES: dict[str, Callable[[np.random.Generator], list[Case]]] = {
    "default": lambda rng: _rounding_cases(rng, 256) + [
        Case(*c) for c in golden_cases.default_cases(rng)],
}


def generate(suite: str = "default", seed: int = 0) -> list[Case]:
    """Build the cases of ``suite`` deterministically from ``seed`` and compute mpt's outputs."""
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {sorted(SUITES)}; got {suite!r}")
    cases = SUITES[suite](np.random.default_rng(seed))
    for case in cases:
        case.outputs = KINDS[case.kind](case.inputs, case.params)
    return cases


# ---- the manifest -------------------------------------------------------------------------------
_TOP_FIELDS = ("schema_version", "suite", "versions", "cases", "digest")
_ENTRY_FIELDS = ("name", "kind", "params", "contract", "file", "file_sha256", "arrays")
#: The name of an input or output array (stored under the key ``in.<name>`` / ``out.<name>``).
ARRAY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}")
_ARRAY_KEY = re.compile(rf"(in|out)\.{ARRAY_NAME.pattern}")
_MAX_ULP_LIMIT = 2**64  # ULP distances are uint64


def _contract_text(max_ulp: int) -> str:
    return "bit-exact" if max_ulp == 0 else f"<= {max_ulp} ULP"


def _canonical(obj) -> bytes:
    """The canonical serialisation that digests are taken over (module docstring)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def manifest_digest(manifest: dict) -> str:
    """The suite digest: sha256 of the canonical manifest without its ``digest`` field."""
    return _sha256(_canonical({k: v for k, v in manifest.items() if k != "digest"}))


def _fail(where: str, message: str):
    raise GoldenError(f"{where} {message}")


def _check_name(name, where: str) -> str:
    return check_base_name(name, where, GoldenError)


def _check_names(names: list[str], where: str) -> None:
    """Every case name a plain file name, and no two equal ignoring case (one folder holds them
    all, and some file systems ignore case)."""
    seen = {}
    for i, name in enumerate(names):
        _check_name(name, f"{where}[{i}].name")
        if name.lower() in seen:
            _fail(f"{where}[{i}].name", f"{name!r} repeats case {seen[name.lower()]}")
        seen[name.lower()] = i


def _known_fields(obj: dict, allowed: tuple, where: str) -> None:
    unknown = sorted(set(obj) - set(allowed))
    if unknown:
        _fail(where or "manifest", f"has unknown fields {unknown}")


def _check_arrays(arrays: dict, where: str) -> None:
    if not arrays:
        _fail(where, "is empty")
    for key, meta in arrays.items():
        here = f"{where}.{key}"
        if not _ARRAY_KEY.fullmatch(key) or ".." in key:
            _fail(where, f"key {key!r} is not 'in.<name>' or 'out.<name>' "
                         f"({_ARRAY_KEY.pattern}, no '..')")
        _field(arrays, key, "dict", where, GoldenError)
        _known_fields(meta, ("dtype", "shape", "sha256"), here)
        dtype = _field(meta, "dtype", "str", here, GoldenError)
        try:
            dtype_from_name(dtype)
        except ValueError as exc:
            _fail(f"{here}.dtype", str(exc))
        shape = _field(meta, "shape", "list", here, GoldenError)
        if len(shape) > 64 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                      for n in shape):
            _fail(f"{here}.shape", f"must be a list of at most 64 non-negative integers; got "
                                   f"{shape!r}")
        _field(meta, "sha256", "sha256", here, GoldenError)
    if not any(k.startswith("out.") for k in arrays):
        _fail(where, "has no output ('out.<name>')")


def _check_entry(entry, where: str) -> None:
    """One case of the manifest (schema: module docstring); GoldenError naming the field."""
    if not isinstance(entry, dict):
        _fail(where, f"must be an object; got {type(entry).__name__}")
    _known_fields(entry, _ENTRY_FIELDS, where)
    name = _check_name(_field(entry, "name", "str", where, GoldenError), f"{where}.name")
    kind = _field(entry, "kind", "str", where, GoldenError)
    if kind not in KINDS and kind != FIXTURE_KIND:
        _fail(f"{where}.kind", f"{kind!r} is not a known kind ({', '.join(sorted(KINDS))}, "
                               f"{FIXTURE_KIND})")
    _field(entry, "params", "dict", where, GoldenError)
    contract = _field(entry, "contract", "dict", where, GoldenError)
    _known_fields(contract, ("max_ulp", "text"), f"{where}.contract")
    max_ulp = _field(contract, "max_ulp", "int", f"{where}.contract", GoldenError)
    if not 0 <= max_ulp < _MAX_ULP_LIMIT:
        _fail(f"{where}.contract.max_ulp", f"must be in [0, 2**64); got {max_ulp}")
    text = _field(contract, "text", "str", f"{where}.contract", GoldenError)
    if text != _contract_text(max_ulp):
        _fail(f"{where}.contract.text", f"{text!r} does not say max_ulp {max_ulp} "
                                        f"({_contract_text(max_ulp)!r})")
    file = _field(entry, "file", "str", where, GoldenError)
    if file != f"{name}.npz":
        _fail(f"{where}.file", f"must be the case name plus '.npz' ({name + '.npz'!r}); got "
                               f"{file!r}")
    _field(entry, "file_sha256", "sha256", where, GoldenError)
    _check_arrays(_field(entry, "arrays", "dict", where, GoldenError), f"{where}.arrays")


def _check_manifest(manifest) -> None:
    """The whole manifest, before any case file is opened (schema: module docstring)."""
    if not isinstance(manifest, dict):
        _fail("manifest", f"must be a JSON object; got {type(manifest).__name__}")
    version = _field(manifest, "schema_version", "int", "", GoldenError)
    if version != SCHEMA_VERSION:
        _fail("schema_version", f"{version} is not {SCHEMA_VERSION}: the suite was written by "
                                "another mpt version (regenerate it: mpt golden generate --force)")
    _known_fields(manifest, _TOP_FIELDS, "")
    _field(manifest, "suite", "str", "", GoldenError)
    versions = _field(manifest, "versions", "dict", "", GoldenError)
    for key in versions:
        _field(versions, key, "str", "versions", GoldenError)
    cases = _field(manifest, "cases", "list", "", GoldenError)
    if not cases:
        _fail("cases", "is empty: a suite without cases verifies nothing")
    for i, entry in enumerate(cases):
        _check_entry(entry, f"cases[{i}]")
    _check_names([e["name"] for e in cases], "cases")
    _field(manifest, "digest", "sha256", "", GoldenError)


def build_manifest(entries: list[dict], suite: str) -> dict:
    """The manifest of a suite with these case entries, checked, with its digest."""
    manifest = {"schema_version": SCHEMA_VERSION, "suite": suite,
                "versions": {"mpt": __version__, "numpy": np.__version__,
                             "ml_dtypes": ml_dtypes.__version__},
                "cases": entries}
    try:
        manifest["digest"] = manifest_digest(manifest)
    except ValueError as exc:  # NaN or Inf among the params
        raise GoldenError(f"params must be plain JSON (no NaN or Inf): {exc}") from None
    _check_manifest(manifest)
    return manifest


def read_manifest(golden_dir) -> dict:
    """The checked manifest of a suite: every field (module docstring), then its digest; raises
    :class:`GoldenError` naming the file and the field. Opens nothing but ``manifest.json``."""
    golden_dir = Path(golden_dir)
    path = golden_dir / MANIFEST
    if not os.path.lexists(path):
        raise GoldenError(f"no {MANIFEST} in golden folder {golden_dir}")
    manifest = load_json(read_in_folder(golden_dir, MANIFEST, GoldenError), str(path),
                         GoldenError)
    try:
        _check_manifest(manifest)
    except GoldenError as exc:
        raise GoldenError(f"{path}: {exc}") from None
    if manifest["digest"] != manifest_digest(manifest):
        raise GoldenError(f"{path} does not match its digest: it was edited after it was written")
    return manifest


def suite_digest(golden_dir) -> str:
    """The digest of the suite in ``golden_dir`` (module docstring), after checking that the
    manifest matches it and that every case file matches its sha256 in the manifest."""
    golden_dir = Path(golden_dir)
    manifest = read_manifest(golden_dir)
    for entry in manifest["cases"]:
        _case_bytes(golden_dir, entry)
    return manifest["digest"]


def check_digest(text) -> str:
    """``text`` as a suite digest (64 hex digits, any case), lowercase; else ValueError."""
    if not isinstance(text, str) or not is_sha256(text.strip().lower()):
        raise ValueError(f"expect_digest must be a suite digest (64 hex digits); got {text!r}")
    return text.strip().lower()


# ---- storage -------------------------------------------------------------------------------------
def describe_array(a: np.ndarray) -> dict:
    a = np.asarray(a, order="C")
    return {"dtype": a.dtype.name, "shape": list(a.shape), "sha256": _sha256(a.tobytes())}


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> str:
    """Write ``arrays`` atomically; return the file's sha256."""
    buffer = io.BytesIO()
    np.savez(buffer, **{k: storable(v) for k, v in arrays.items()})
    data = buffer.getvalue()
    _atomic_write_bytes(Path(path), lambda fh: fh.write(data))
    return _sha256(data)


def write_case(folder: Path, case: Case) -> dict:
    """Write ``<case.name>.npz`` into ``folder``; return the case's manifest entry."""
    _check_name(case.name, "case name")
    arrays = {**{f"in.{k}": v for k, v in case.inputs.items()},
              **{f"out.{k}": v for k, v in case.outputs.items()}}
    return {"name": case.name, "kind": case.kind, "params": case.params,
            "contract": {"max_ulp": case.max_ulp, "text": case.contract},
            "file": f"{case.name}.npz",
            "file_sha256": save_npz(Path(folder) / f"{case.name}.npz", arrays),
            "arrays": {k: describe_array(v) for k, v in arrays.items()}}


def write_manifest(folder: Path, manifest: dict) -> None:
    """Write a manifest from :func:`build_manifest` into ``folder`` atomically."""
    text = json.dumps(manifest, indent=1, sort_keys=True, allow_nan=False)
    _atomic_write_bytes(Path(folder) / MANIFEST, lambda fh: fh.write(text.encode()))


def _old_suite_files(folder: Path) -> list[str] | None:
    """The files of the golden suite in ``folder`` (its manifest and the case files it lists),
    or None when ``folder`` does not hold a readable mpt suite of this or an older schema."""
    try:
        manifest = load_json(read_in_folder(folder, MANIFEST, GoldenError), MANIFEST,
                             GoldenError, allow_nan=True)
        files = [e["file"] for e in manifest["cases"]]
        ok = manifest["schema_version"] in range(1, SCHEMA_VERSION + 1) and all(
            isinstance(f, str) and BASE_NAME.fullmatch(f) and ".." not in f for f in files)
    except (GoldenError, KeyError, TypeError):
        return None
    return [MANIFEST, *files] if ok else None


def check_target(out_dir, *, force: bool = False) -> list[str] | None:
    """Whether :func:`write_suite` may write into ``out_dir`` (raises :class:`GoldenError` if not);
    returns the files it would remove once the new suite is in place (None: no folder yet)."""
    out_dir = Path(out_dir)
    if out_dir.is_symlink():
        raise GoldenError(f"{out_dir} is a symbolic link; give the folder itself")
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise GoldenError(f"{out_dir} is a file, not a folder; refusing to replace it")
    present = sorted(os.listdir(out_dir))
    if not present:
        return []
    listed = _old_suite_files(out_dir)
    if listed is None:
        raise GoldenError(f"{out_dir} is not empty and holds no mpt golden suite; refusing to "
                          "write into it (give a new or empty folder)")
    if not force:
        raise GoldenError(f"{out_dir} already holds a golden suite; replace it with force=True "
                          "(mpt golden generate --force)")
    extra = [n for n in present
             if n not in listed or not stat.S_ISREG(os.lstat(out_dir / n).st_mode)]
    if extra:
        raise GoldenError(f"{out_dir} holds {len(extra)} files that are not part of its golden "
                          f"suite (e.g. {extra[:3]}); mpt deletes only what it wrote: move them "
                          "away first")
    return present


def _check_cases(cases: list) -> None:
    """What must hold before :func:`write_suite` writes anything."""
    if not isinstance(cases, list) or not cases:
        raise GoldenError("cases must be a non-empty list of Case")
    for i, case in enumerate(cases):
        if not isinstance(case, Case):
            raise GoldenError(f"cases[{i}] must be a Case; got {type(case).__name__}")
        if case.kind not in KINDS and case.kind != FIXTURE_KIND:
            raise GoldenError(f"cases[{i}].kind {case.kind!r} is not a known kind")
    _check_names([c.name for c in cases], "cases")


def write_suite(cases: list[Case], out_dir, *, suite: str = "custom", force: bool = False) -> Path:
    """Write cases and their manifest into the folder ``out_dir``, never half written.

    ``out_dir`` may be new or empty. A folder that already holds a golden suite is replaced only
    with ``force=True``, and only if it holds nothing but that suite's files; a file, a symbolic
    link or a non-empty folder without a suite is refused (:class:`GoldenError`). The suite is
    written into a temporary folder beside ``out_dir`` and swapped in; only then are the old
    suite's files (its manifest and the case files it lists) removed. Returns ``out_dir``.
    """
    _check_cases(cases)
    out_dir = Path(os.path.abspath(out_dir))
    old_files = check_target(out_dir, force=force)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.new-"))
    try:
        os.chmod(tmp, default_mode(0o777))
        write_manifest(tmp, build_manifest([write_case(tmp, c) for c in cases], suite))
        if old_files is None:
            os.replace(tmp, out_dir)
            return out_dir
        old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.old-"))
        os.rmdir(old)
        os.replace(out_dir, old)
        try:
            os.replace(tmp, out_dir)
        except BaseException:
            os.replace(old, out_dir)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for name in old_files:
        os.unlink(old / name)
    try:
        os.rmdir(old)
    except OSError:
        raise GoldenError(f"wrote the new suite to {out_dir}; files mpt did not write appeared "
                          f"in the old one meanwhile and were kept in {old}") from None
    return out_dir


def _case_bytes(golden_dir: Path, entry: dict) -> bytes:
    """The case file's bytes, read from inside ``golden_dir`` and checked against its sha256."""
    data = read_in_folder(golden_dir, entry["file"], GoldenError)
    if _sha256(data) != entry["file_sha256"]:
        raise GoldenError(f"case file {entry['file']} does not match its manifest hash "
                          "(corrupted or edited)")
    return data


def load_case(golden_dir: Path, entry: dict) -> Case:
    """Load one case after checking its entry, the file hash, then every array's dtype, shape
    and hash."""
    _check_entry(entry, f"case {entry.get('name') if isinstance(entry, dict) else entry!r}")
    data = _case_bytes(Path(golden_dir), entry)
    inputs, outputs = {}, {}
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise GoldenError(f"case file {entry['file']} is not an npz file: {exc}") from None
    with npz as data:
        if sorted(data.files) != sorted(entry["arrays"]):
            raise GoldenError(f"{entry['file']} holds {sorted(data.files)}, manifest lists "
                              f"{sorted(entry['arrays'])}")
        for key, meta in entry["arrays"].items():
            dtype = dtype_from_name(meta["dtype"])
            try:
                raw = data[key]
            except ValueError as exc:                   # an object array: never unpickled
                raise GoldenError(f"array {key} of {entry['file']} cannot be loaded: {exc}") \
                    from None
            if raw.dtype not in NATIVE_DTYPES or raw.dtype.itemsize != dtype.itemsize:
                raise GoldenError(f"array {key} of {entry['file']} is stored as {raw.dtype}, "
                                  f"which cannot hold {dtype.name}")
            arr = raw if raw.dtype == dtype else raw.view(dtype)
            if list(arr.shape) != meta["shape"] or _sha256(arr.tobytes()) != meta["sha256"]:
                raise GoldenError(f"array {key} of {entry['file']} does not match its manifest")
            role, name = key.split(".", 1)
            (inputs if role == "in" else outputs)[name] = arr
    return Case(entry["name"], entry["kind"], entry["params"], inputs, outputs,
                entry["contract"]["max_ulp"])


def load_suite(golden_dir) -> list[Case]:
    """Load and check every case of a golden folder (raises GoldenError on the first problem):
    the whole manifest is checked before any case file is opened."""
    golden_dir = Path(golden_dir)
    return [load_case(golden_dir, e) for e in read_manifest(golden_dir)["cases"]]


def outputs_folder(golden_dir, outputs_dir) -> Path:
    """``outputs_dir``, created if missing, to hold a backend's ``<case>.npz`` files: a folder,
    and not the golden folder itself (whose case files the outputs would replace)."""
    outputs_dir = Path(outputs_dir)
    if outputs_dir.exists() and not outputs_dir.is_dir():
        raise GoldenError(f"outputs folder {outputs_dir} is a file")
    if outputs_dir.is_dir() and os.path.samefile(outputs_dir, golden_dir):
        raise GoldenError(f"outputs folder {outputs_dir} is the golden folder; give another one")
    outputs_dir.mkdir(parents=True, exist_ok=True)
    return outputs_dir


def compute_outputs(compute: Callable[[dict, dict], dict], case: Case) -> dict:
    """``compute(case.inputs, case.params)``; params or inputs it cannot use raise GoldenError."""
    try:
        return compute(case.inputs, case.params)
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
        raise GoldenError(f"case {case.name!r} ({case.kind}): its params or inputs do not fit "
                          f"the kind: {exc!r}") from None


def run_mpt(golden_dir, outputs_dir) -> Path:
    """Recompute every golden case with mpt and write a backend outputs folder."""
    cases = load_suite(golden_dir)
    for case in cases:
        if case.kind not in KINDS:
            raise GoldenError(f"case {case.name!r} has kind {case.kind!r}, which mpt does not "
                              "compute (its outputs come from a test)")
    outputs = [compute_outputs(KINDS[case.kind], case) for case in cases]  # all, then write
    outputs_dir = outputs_folder(golden_dir, outputs_dir)
    for case, arrays in zip(cases, outputs):
        save_npz(outputs_dir / f"{case.name}.npz", arrays)
    return outputs_dir


# ---- verification ------------------------------------------------------------------------------
def _as_declared(received: np.ndarray, like: np.ndarray) -> np.ndarray:
    """A backend array in the golden output's dtype: same dtype, bit patterns, or exact values."""
    if received.dtype == like.dtype:
        return received
    if received.dtype == np.dtype(f"u{like.dtype.itemsize}"):  # the bit patterns
        return received.view(like.dtype)
    if received.dtype.kind == "f" and like.dtype.kind in "fV":
        with np.errstate(over="ignore", invalid="ignore"):
            converted = received.astype(like.dtype)
            back = converted.astype(received.dtype)
        same = (back == received) | (np.isnan(back) & np.isnan(received))
        if same.all():
            return converted
        raise GoldenError(f"values of dtype {received.dtype} are not exactly representable "
                          f"in {like.dtype.name}")
    raise GoldenError(f"dtype {received.dtype} cannot hold outputs of dtype {like.dtype.name}")


def _compare_exact(actual: np.ndarray, desired: np.ndarray) -> dict:
    """Integer and boolean outputs (masks, counters): equal or a mismatch, no ULPs."""
    differ = actual != desired
    if not differ.any():
        return {"verdict": "bit-exact", "worst_ulp": 0}
    first = np.unravel_index(int(np.flatnonzero(differ)[0]), differ.shape)
    return {"verdict": "mismatch", "n_differ": int(differ.sum()),
            "first_index": [int(i) for i in first], "actual_bits": str(actual[first].item()),
            "desired_bits": str(desired[first].item())}


def _compare(actual: np.ndarray, desired: np.ndarray, max_ulp: int) -> dict:
    if actual.shape != desired.shape:
        return {"verdict": "mismatch", "detail": f"shape {actual.shape} != {desired.shape}"}
    if desired.dtype.kind in "biu":
        return _compare_exact(actual, desired)
    abits, dbits = as_bits(actual), as_bits(desired)
    differ = abits != dbits
    if not differ.any():
        return {"verdict": "bit-exact", "worst_ulp": 0}
    dist = ulp_distance(actual, desired)
    first = np.unravel_index(int(np.flatnonzero(differ)[0]), differ.shape)
    width = 2 * actual.dtype.itemsize
    worst = int(dist.max())
    row = {"worst_ulp": worst if worst != np.iinfo(np.uint64).max else "inf",
           "n_differ": int(differ.sum()), "first_index": [int(i) for i in first],
           "actual_bits": f"0x{int(abits[first]):0{width}x}",
           "desired_bits": f"0x{int(dbits[first]):0{width}x}"}
    # A bit-exact contract fails on any differing pattern, even at distance 0 (−0 vs +0, NaN
    # payload).
    ok = max_ulp > 0 and worst <= max_ulp
    row["verdict"] = f"within {worst} ULP" if ok else "mismatch"
    return row


def verify(golden_dir, outputs_dir, *, allow_missing: bool = False,
           expect_digest: str | None = None) -> list[dict]:
    """Compare a backend's outputs with a golden suite, case by case; one report row per case.

    Row keys: case, kind, contract, verdict ("bit-exact", "within N ULP", "mismatch", "missing",
    "skipped", "corrupt golden", "bad output"), and for differences worst_ulp, n_differ,
    first_index, actual_bits, desired_bits. ``passed(rows)`` tells whether the backend passed.

    The manifest is checked whole first (a malformed one raises :class:`GoldenError`). With
    ``expect_digest`` (64 hex digits), a suite whose digest differs raises GoldenError before
    anything is compared; each case file is checked against its sha256 as it is loaded (a
    mismatch is a failing "corrupt golden" row), so a suite that passes is the pinned one.
    Output files are read only from inside ``outputs_dir``, never through a symbolic link.
    """
    expected = None if expect_digest is None else check_digest(expect_digest)
    golden_dir, outputs_dir = Path(golden_dir), Path(outputs_dir)
    manifest = read_manifest(golden_dir)
    if expected is not None and manifest["digest"] != expected:
        raise GoldenError(f"golden suite {golden_dir} has digest {manifest['digest']}, not the "
                          f"expected {expected}: it is not the suite that was pinned")
    rows = []
    for entry in manifest["cases"]:
        row = {"case": entry["name"], "kind": entry["kind"], "contract": entry["contract"]["text"]}
        try:
            case = load_case(golden_dir, entry)
        except GoldenError as exc:
            rows.append({**row, "verdict": "corrupt golden", "detail": str(exc)})
            continue
        file = f"{case.name}.npz"
        if not os.path.lexists(outputs_dir / file):
            rows.append({**row, "verdict": "skipped" if allow_missing else "missing"})
            continue
        try:
            rows.append({**row, **_compare_case(case, read_in_folder(outputs_dir, file,
                                                                     GoldenError))})
        except (GoldenError, ValueError, OSError, zipfile.BadZipFile) as exc:
            rows.append({**row, "verdict": "bad output", "detail": str(exc)})
    return rows


def _compare_case(case: Case, data: bytes) -> dict:
    """The worst comparison over a case's outputs, from the bytes of the backend's npz file."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        received = {k: npz[k] for k in npz.files}
    missing = sorted(set(case.outputs) - set(received))
    if missing:
        raise GoldenError(f"outputs {missing} are missing from {case.name}.npz")
    worst = {"verdict": "bit-exact", "worst_ulp": 0}
    for key, desired in case.outputs.items():
        result = _compare(_as_declared(received[key], desired), desired, case.max_ulp)
        if result["verdict"] == "mismatch" or worst["verdict"] == "bit-exact":
            worst = {**result, "output": key}
        if result["verdict"] == "mismatch":
            break
    return worst


def passed(rows: list[dict]) -> bool:
    """Whether at least one case was compared and every case is bit-exact, within its ULP
    contract, or an allowed skip (a report that compared nothing never passes)."""
    rows = list(rows)
    compared = [r for r in rows if r["verdict"] != "skipped"]
    return bool(compared) and all(
        r["verdict"] == "bit-exact" or r["verdict"].startswith("within") for r in compared)


def format_report(rows: list[dict]) -> str:
    """The verify report as an aligned text table."""
    head = ("case", "contract", "verdict", "worst ULP", "first index", "actual", "desired")
    table = [head] + [(
        r["case"], r["contract"], r["verdict"], str(r.get("worst_ulp", "")),
        ",".join(map(str, r.get("first_index", []))), r.get("actual_bits", ""),
        r.get("desired_bits", "")) for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip() for t in table]
    n_ok = sum(1 for r in rows if passed([r]))
    lines.append(f"{n_ok} of {len(rows)} cases pass")
    return "\n".join(lines)


def write_json_atomic(path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(path, lambda fh: fh.write(json.dumps(obj, indent=1).encode()))
