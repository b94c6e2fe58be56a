"""L5: golden outputs — generate them with mpt, verify any backend's outputs against them.

A *suite* is a folder::

    manifest.json        schema, versions, and per case: kind, parameters, contract, and for
                         every array its dtype, shape and sha256; the sha256 of each case file
    <case>.npz           the case's inputs ("in.<name>") and mpt's outputs ("out.<name>")

Arrays are stored as plain numpy arrays, except ml_dtypes ones (bf16, fp8, ...) which are stored as
their unsigned bit patterns and viewed back through the dtype named in the manifest, so files load
with ``allow_pickle=False``. Before anything is loaded, the file's sha256 is checked against the
manifest, then each array's: a corrupted or edited file is reported, never used.

A *backend's outputs* folder holds ``<case>.npz`` with one array per output name, either in the
output's dtype, as its unsigned bit patterns, or as wider floats that hold the values exactly
(what ``torch.Tensor.float()`` writes). ``verify`` compares them case by case under each case's
contract: bit-exact, or at most N ULP of the output format.

Case *kinds* map inputs and parameters to outputs (``KINDS``: ``round`` here, mma, gemm,
fake_quant, optim, grad_scaler, attention and train_steps in :mod:`mpt.golden_cases`); ``run_mpt``
recomputes every case with mpt itself, so ``generate → run_mpt → verify`` must be bit-exact
everywhere. Integer and boolean outputs (masks, counters) must be equal. The committed default
suite (``reference_results/default``) is mpt's numerics regression test: ``generate`` must
reproduce every array hash (tests/test_golden.py); regenerate it when numerics change on purpose.
PyTorch's side: :mod:`mpt.golden_torch`.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import ml_dtypes
import numpy as np

from mpt._io import atomic_write_bytes as _atomic_write_bytes
from mpt._io import dtype_from_name, storable
from mpt._io import sha256 as _sha256
from mpt._version import __version__
from mpt import golden_cases
from mpt.formats import FORMATS, get_format
from mpt.rounding import round as mpt_round
from mpt.testing import as_bits, ulp_distance

__all__ = [
    "SCHEMA_VERSION", "Case", "KINDS", "SUITES", "register_kind", "generate", "write_suite",
    "load_suite", "run_mpt", "verify", "GoldenError", "save_npz", "load_case", "describe_array",
    "read_manifest", "passed", "format_report", "write_json_atomic",
]

SCHEMA_VERSION = 1


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
        return "bit-exact" if self.max_ulp == 0 else f"<= {self.max_ulp} ULP"


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


# ---- storage -------------------------------------------------------------------------------------
def _dtype_from_name(name: str) -> np.dtype:
    try:
        return dtype_from_name(name)
    except ValueError as exc:
        raise GoldenError(f"{exc} in manifest") from None


def describe_array(a: np.ndarray) -> dict:
    a = np.asarray(a, order="C")
    return {"dtype": a.dtype.name, "shape": list(a.shape), "sha256": _sha256(a.tobytes())}


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> str:
    """Write ``arrays`` atomically; return the file's sha256."""
    _atomic_write_bytes(path, lambda fh: np.savez(fh, **{k: storable(v)
                                                          for k, v in arrays.items()}))
    return _sha256(path.read_bytes())


def write_suite(cases: list[Case], out_dir, *, suite: str = "custom") -> Path:
    """Write cases and their manifest into ``out_dir`` (replaced whole, never half written)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}."))
    try:
        entries = []
        for case in cases:
            arrays = {**{f"in.{k}": v for k, v in case.inputs.items()},
                      **{f"out.{k}": v for k, v in case.outputs.items()}}
            entries.append({
                "name": case.name, "kind": case.kind, "params": case.params,
                "contract": {"max_ulp": case.max_ulp, "text": case.contract},
                "file": f"{case.name}.npz",
                "file_sha256": save_npz(tmp / f"{case.name}.npz", arrays),
                "arrays": {k: describe_array(v) for k, v in arrays.items()},
            })
        manifest = {
            "schema_version": SCHEMA_VERSION, "suite": suite,
            "versions": {"mpt": __version__, "numpy": np.__version__,
                         "ml_dtypes": ml_dtypes.__version__},
            "cases": entries,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def read_manifest(golden_dir: Path) -> dict:
    path = golden_dir / "manifest.json"
    if not path.is_file():
        raise GoldenError(f"no manifest.json in golden folder {golden_dir}")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise GoldenError(f"{path} is not valid JSON: {exc}") from None
    if manifest.get("schema_version") != SCHEMA_VERSION:
        raise GoldenError(f"{path}: schema_version {manifest.get('schema_version')!r} is not "
                          f"{SCHEMA_VERSION}")
    return manifest


def load_case(golden_dir: Path, entry: dict) -> Case:
    """Load one case after checking the file hash, then every array's dtype, shape and hash."""
    path = golden_dir / entry["file"]
    if not path.is_file():
        raise GoldenError(f"case file {entry['file']} is missing")
    if _sha256(path.read_bytes()) != entry["file_sha256"]:
        raise GoldenError(f"case file {entry['file']} does not match its manifest hash "
                          "(corrupted or edited)")
    inputs, outputs = {}, {}
    with np.load(path, allow_pickle=False) as data:
        if sorted(data.files) != sorted(entry["arrays"]):
            raise GoldenError(f"{entry['file']} holds {sorted(data.files)}, manifest lists "
                              f"{sorted(entry['arrays'])}")
        for key, meta in entry["arrays"].items():
            dtype = _dtype_from_name(meta["dtype"])
            raw = data[key]
            arr = raw if raw.dtype == dtype else raw.view(dtype)
            if list(arr.shape) != meta["shape"] or _sha256(arr.tobytes()) != meta["sha256"]:
                raise GoldenError(f"array {key} of {entry['file']} does not match its manifest")
            role, name = key.split(".", 1)
            (inputs if role == "in" else outputs)[name] = arr
    return Case(entry["name"], entry["kind"], entry["params"], inputs, outputs,
                entry["contract"]["max_ulp"])


def load_suite(golden_dir) -> list[Case]:
    """Load and check every case of a golden folder (raises GoldenError on the first problem)."""
    golden_dir = Path(golden_dir)
    return [load_case(golden_dir, e) for e in read_manifest(golden_dir)["cases"]]


def run_mpt(golden_dir, outputs_dir) -> Path:
    """Recompute every golden case with mpt and write a backend outputs folder."""
    outputs_dir = Path(outputs_dir)
    outputs_dir.mkdir(parents=True, exist_ok=True)
    for case in load_suite(golden_dir):
        save_npz(outputs_dir / f"{case.name}.npz", KINDS[case.kind](case.inputs, case.params))
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


def verify(golden_dir, outputs_dir, *, allow_missing: bool = False) -> list[dict]:
    """Compare a backend's outputs with a golden suite, case by case; one report row per case.

    Row keys: case, kind, contract, verdict ("bit-exact", "within N ULP", "mismatch", "missing",
    "corrupt golden", "bad output"), and for differences worst_ulp, n_differ, first_index,
    actual_bits, desired_bits. ``passed(rows)`` tells whether the backend passed.
    """
    golden_dir, outputs_dir = Path(golden_dir), Path(outputs_dir)
    rows = []
    for entry in read_manifest(golden_dir)["cases"]:
        row = {"case": entry["name"], "kind": entry["kind"], "contract": entry["contract"]["text"]}
        try:
            case = load_case(golden_dir, entry)
        except GoldenError as exc:
            rows.append({**row, "verdict": "corrupt golden", "detail": str(exc)})
            continue
        path = outputs_dir / f"{case.name}.npz"
        if not path.is_file():
            rows.append({**row, "verdict": "skipped" if allow_missing else "missing"})
            continue
        try:
            with np.load(path, allow_pickle=False) as data:
                received = {k: data[k] for k in data.files}
            missing = sorted(set(case.outputs) - set(received))
            if missing:
                raise GoldenError(f"outputs {missing} are missing from {path.name}")
            worst = {"verdict": "bit-exact", "worst_ulp": 0}
            for key, desired in case.outputs.items():
                result = _compare(_as_declared(received[key], desired), desired, case.max_ulp)
                if result["verdict"] == "mismatch" or worst["verdict"] == "bit-exact":
                    worst = {**result, "output": key}
                if result["verdict"] == "mismatch":
                    break
            rows.append({**row, **worst})
        except (GoldenError, ValueError, OSError) as exc:
            rows.append({**row, "verdict": "bad output", "detail": str(exc)})
    return rows


def passed(rows: list[dict]) -> bool:
    """Whether every case is bit-exact, within its ULP contract, or an allowed skip."""
    return all(r["verdict"] in ("bit-exact", "skipped") or r["verdict"].startswith("within")
               for r in rows)


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
