"""L5: the golden suite's manifest — its schema, the checks that run before any file is read,
and the suite digest (the package docstring states the rules)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from mpt._io import check_base_name, dtype_from_name
from mpt._io import field as _field
from mpt._io import is_sha256, load_json, read_in_folder
from mpt._io import sha256 as _sha256
from mpt._version import __version__

__all__ = ["SCHEMA_VERSION", "MANIFEST", "FIXTURE_KIND", "ARRAY_NAME", "GoldenError", "Case",
           "manifest_digest", "build_manifest", "read_manifest", "suite_digest", "check_digest"]

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


# ---- kinds (registered by mpt.golden.suite and mpt.golden.cases) ---------------------------------
#: kind name -> function(inputs, params) -> outputs, computed with mpt.
KINDS: dict[str, Callable[[dict, dict], dict]] = {}


def register_kind(name: str, compute: Callable[[dict, dict], dict]) -> None:
    """Register how a kind of case is computed (used by ``generate`` and ``run_mpt``)."""
    if not callable(compute):
        raise TypeError(f"compute must be callable; got {type(compute).__name__}")
    KINDS[name] = compute


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


def _case_bytes(golden_dir: Path, entry: dict) -> bytes:
    """The case file's bytes, read from inside ``golden_dir`` and checked against its sha256."""
    data = read_in_folder(golden_dir, entry["file"], GoldenError)
    if _sha256(data) != entry["file_sha256"]:
        raise GoldenError(f"case file {entry['file']} does not match its manifest hash "
                          "(corrupted or edited)")
    return data
