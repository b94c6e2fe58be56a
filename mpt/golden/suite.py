"""L5: golden suites — case kinds, generating and writing a suite, loading its cases, running
mpt on them."""
from __future__ import annotations

import io
import json
import os
import shutil
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np

from mpt._io import BASE_NAME, NATIVE_DTYPES
from mpt._io import atomic_write_bytes as _atomic_write_bytes
from mpt._io import default_mode, dtype_from_name, load_json, read_in_folder
from mpt._io import sha256 as _sha256
from mpt._io import storable
from mpt.autograd.context import Snapshot, replay
from mpt.formats import FORMATS, get_format
from mpt.golden import cases as golden_cases
from mpt.golden.manifest import (FIXTURE_KIND, KINDS, MANIFEST, SCHEMA_VERSION, Case, GoldenError,
                                 _case_bytes, _check_entry, _check_name, _check_names,
                                 build_manifest, read_manifest, register_kind)
from mpt.rounding import round as round_format
from mpt.tasks import map_tasks

__all__ = ["KINDS", "SUITES", "register_kind", "generate", "write_suite", "load_suite", "run_mpt",
           "save_npz", "load_case", "describe_array", "write_case", "write_manifest",
           "outputs_folder", "compute_outputs", "check_target", "write_json_atomic"]

# ---- kinds -------------------------------------------------------------------------------------


def _compute_round(inputs, params):
    return {"y": round_format(inputs["x"], params["format"], params["mode"],
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


def generate(suite: str = "default", seed: int = 0, *, workers: int | None = None,
             scheduler=None, progress: bool = False) -> list[Case]:
    """Build the cases of ``suite`` deterministically from ``seed`` and compute mpt's outputs.

    The inputs are drawn here, in order, from one generator; the outputs are one task per case
    (:func:`mpt.tasks.map_tasks`): serially in this process (the default), on a local Dask
    cluster of ``workers`` processes, or on the cluster of ``scheduler`` (an address or a
    ``distributed.Client``). A task is the case's kind function applied to its inputs and
    parameters, which depends on nothing else, so the outputs — and the suite
    :func:`write_suite` writes from them — are the same bits in every case. ``progress``: a
    progress bar of the cases.
    """
    if suite not in SUITES:
        raise ValueError(f"suite must be one of {sorted(SUITES)}; got {suite!r}")
    cases = SUITES[suite](np.random.default_rng(seed))
    tasks = [(KINDS[case.kind], case.inputs, case.params) for case in cases]
    outputs = map_tasks(_case_outputs, tasks, workers=workers, scheduler=scheduler,
                        progress=progress, desc=f"golden {suite}", unit="case")
    for case, out in zip(cases, outputs):
        case.outputs = out
    return cases


def _case_outputs(task) -> dict:
    """The task of one case: ``compute(inputs, params)`` in a fresh context (no autocast region,
    grad mode or dropout counter of the calling process carries over); the kind's function
    travels with the task, so a worker needs no registry."""
    compute, inputs, params = task
    with replay(Snapshot(())):
        return compute(inputs, params)


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




def write_json_atomic(path, obj) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(path, lambda fh: fh.write(json.dumps(obj, indent=1).encode()))
