"""L5: verifying a backend's outputs against a golden suite, case by case, under each case's
contract."""
from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import numpy as np

from mpt._io import read_in_folder
from mpt._tables import text_table
from mpt.golden.manifest import Case, GoldenError, check_digest, read_manifest
from mpt.golden.suite import load_case
from mpt.testing import as_bits, ulp_distance

__all__ = ["verify", "passed", "format_report"]


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
    n_ok = sum(1 for r in rows if passed([r]))
    return text_table(table) + f"\n{n_ok} of {len(rows)} cases pass"


