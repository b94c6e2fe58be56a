"""L5: training checkpoints — everything a :class:`mpt.training.Trainer` needs to continue bit for
bit: the model copy, the optimizer (FP32 masters and states, step counts), the loss scaler
(scale, growth tracker, records), every FP8 layer's delayed-scaling state (scales and amax
histories), the dropout generator (``mpt.get_rng_state``), the step and the metrics history.
(Data batches and the learning rate are functions of the step; stochastic rounding is keyed by
the optimizer's step count: nothing else holds state.)

**Layout.** A checkpoint is a folder with ``manifest.json`` and ``state-<hash>.npz``. The npz holds
the arrays (formats numpy cannot store natively — bf16, fp8 — as their unsigned bit patterns); the
manifest holds the JSON state, each array's dtype, shape and SHA-256, the npz file's SHA-256, and
its own SHA-256 (of its canonical JSON without that field).

**Atomicity.** The npz is written first under a new, content-addressed name (temp file + rename),
then the manifest is replaced (temp file + rename): the manifest swap is the commit, so a reader
always finds a complete pair and a crash leaves the previous checkpoint intact. Old npz files
(``state-<16 hex digits>.npz``, mpt's own names) are removed after the commit. A folder whose
``manifest.json`` is not an mpt checkpoint is refused, never overwritten.

**Loading** (``np.load(..., allow_pickle=False)``) reads the two files only from inside the folder
(a symbolic link is refused, never followed; the npz name must be the content-addressed one the
manifest's hash gives), checks every hash, dtype and shape, and that the checkpoint matches the
trainer (same recipe, config, parameter names, shapes and formats, FP8 layers, scaler), before it
changes anything: a truncated, tampered or mismatched checkpoint raises :class:`CheckpointError`
naming what is wrong and leaves the trainer untouched.
"""
from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path

import numpy as np

from mpt._io import atomic_write_bytes, dtype_from_name, load_json, read_in_folder, sha256
from mpt._io import storable
from mpt.functional import get_rng_state, set_rng_state
from mpt.training import StepMetrics

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError"]

FORMAT = "mpt-train-state"
VERSION = 1
_MANIFEST = "manifest.json"
_NPZ_NAME = re.compile(r"state-[0-9a-f]{16}\.npz")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: damaged, tampered with, or for another trainer."""


# ---- what a trainer holds ------------------------------------------------------------------------
def _collect(trainer) -> tuple[dict, dict]:
    """(arrays by name, JSON state) of a trainer."""
    arrays = {f"model/{k}": v for k, v in trainer.model.state_dict().items()}
    opt = trainer.optimizer.state_dict()
    for index, state in opt["state"].items():
        for key, value in state.items():
            arrays[f"optimizer/{index}/{key}"] = value
    fp8 = {}
    for layer_name, layer in trainer.fp8_layers.items():
        fp8[layer_name] = {}
        for role, s in layer.fp8_state_dict().items():
            fp8[layer_name][role] = s["format"]
            arrays[f"fp8/{layer_name}/{role}/scale"] = s["scale"]
            arrays[f"fp8/{layer_name}/{role}/amax_history"] = s["amax_history"]
    state = {
        "recipe": trainer.recipe.describe(), "config": _jsonable(trainer.config.describe()),
        "step": trainer.step_count,
        "optimizer": {"param_groups": _jsonable(opt["param_groups"]), "steps": opt["steps"],
                      "state_keys": {str(i): sorted(s) for i, s in opt["state"].items()}},
        "scaler": None if trainer.scaler is None else trainer.scaler.state_dict(),
        "rng": list(get_rng_state()), "fp8": fp8,
        "history": [m.to_dict() for m in trainer.history],
    }
    return arrays, state


def _jsonable(x):
    """Tuples become lists (what JSON gives back), so saved and live values compare equal."""
    return json.loads(json.dumps(x))


# ---- saving --------------------------------------------------------------------------------------
def _check_target(folder: Path) -> None:
    """``folder`` may receive a checkpoint: a folder (or nothing yet) whose ``manifest.json``, if
    any, is an mpt checkpoint's."""
    if folder.exists() and not folder.is_dir():
        raise CheckpointError(f"checkpoint path {folder} is a file, not a folder")
    if not os.path.lexists(folder / _MANIFEST):
        return
    try:
        manifest = load_json(read_in_folder(folder, _MANIFEST, CheckpointError), _MANIFEST,
                             CheckpointError, allow_nan=True)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder} holds a {_MANIFEST} that is not an mpt checkpoint's "
                              f"({exc}); refusing to replace it") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{folder / _MANIFEST} is not an mpt checkpoint's manifest; "
                              "refusing to replace it")


def save_checkpoint(trainer, path) -> Path:
    """Write ``trainer``'s complete state into the folder ``path`` (created if missing)
    atomically (module docstring); returns the manifest's path."""
    folder = Path(path)
    _check_target(folder)
    folder.mkdir(parents=True, exist_ok=True)
    arrays, state = _collect(trainer)
    keys = {name: f"a{i}" for i, name in enumerate(arrays)}
    buffer = io.BytesIO()
    np.savez(buffer, **{keys[n]: storable(a) for n, a in arrays.items()})
    data = buffer.getvalue()
    digest = sha256(data)
    npz_name = f"state-{digest[:16]}.npz"
    atomic_write_bytes(folder / npz_name, lambda fh: fh.write(data))
    body = {"format": FORMAT, "version": VERSION, "npz": npz_name, "npz_sha256": digest,
            "arrays": {n: {"key": keys[n], "dtype": a.dtype.name, "shape": list(a.shape),
                           "sha256": sha256(a.tobytes())}
                       for n, a in arrays.items()},
            "state": state}
    manifest = dict(body, manifest_sha256=_manifest_digest(body))
    text = json.dumps(manifest, indent=1, sort_keys=True)
    atomic_write_bytes(folder / _MANIFEST, lambda fh: fh.write(text.encode()))
    for old in folder.iterdir():
        if _NPZ_NAME.fullmatch(old.name) and old.name != npz_name:
            old.unlink()
    return folder / _MANIFEST


def _manifest_digest(body: dict) -> str:
    return sha256(json.dumps(body, sort_keys=True).encode())


# ---- loading -------------------------------------------------------------------------------------
def _dtype(name: str) -> np.dtype:
    try:
        return dtype_from_name(name)
    except ValueError as exc:
        raise CheckpointError(f"{exc} in the manifest") from None


def _read_manifest(folder: Path) -> dict:
    path = folder / _MANIFEST
    if not os.path.lexists(path):
        raise CheckpointError(f"no {_MANIFEST} in checkpoint folder {folder}")
    manifest = load_json(read_in_folder(folder, _MANIFEST, CheckpointError), str(path),
                         CheckpointError, allow_nan=True)   # a diverged run's losses are NaN
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an mpt training checkpoint")
    if manifest.get("version") != VERSION:
        raise CheckpointError(f"{path} has version {manifest.get('version')!r}; this mpt reads "
                              f"version {VERSION}")
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if manifest.get("manifest_sha256") != _manifest_digest(body):
        raise CheckpointError(f"{path} was modified after it was written (its SHA-256 does not "
                              "match)")
    digest = manifest.get("npz_sha256")
    if not isinstance(digest, str) or manifest.get("npz") != f"state-{digest[:16]}.npz":
        raise CheckpointError(f"{path}: npz must be the content-addressed name "
                              f"'state-<npz_sha256[:16]>.npz'; got {manifest.get('npz')!r}")
    return manifest


def _read_arrays(folder: Path, manifest: dict) -> dict:
    path = folder / manifest["npz"]
    data = read_in_folder(folder, manifest["npz"], CheckpointError)
    if sha256(data) != manifest["npz_sha256"]:
        raise CheckpointError(f"{path} does not match the SHA-256 in the manifest (truncated or "
                              "tampered with)")
    arrays = {}
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path} is not an npz file: {exc}") from None
    with npz:
        for name, meta in manifest["arrays"].items():
            if meta["key"] not in npz.files:
                raise CheckpointError(f"array {name!r} is missing from {path}")
            raw = npz[meta["key"]]
            dtype = _dtype(meta["dtype"])
            if raw.dtype.itemsize != dtype.itemsize:
                raise CheckpointError(f"array {name!r} is stored as {raw.dtype}, which cannot "
                                      f"hold {dtype}")
            arr = raw.view(dtype)
            if list(arr.shape) != meta["shape"] or sha256(arr.tobytes()) != meta["sha256"]:
                raise CheckpointError(f"array {name!r} does not match its shape or SHA-256")
            arrays[name] = arr
    return arrays


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise CheckpointError(message)


def _check_matches(trainer, arrays: dict, state: dict) -> None:
    """Everything the checkpoint restores fits ``trainer`` (raises before any change)."""
    live_arrays, live = _collect(trainer)
    _require(state["recipe"] == live["recipe"],
             f"checkpoint is for recipe {state['recipe'].get('name')!r}, the trainer runs "
             f"{live['recipe']['name']!r} (or a different variant of it)")
    _require(state["config"] == live["config"], "checkpoint was written with a different "
             "TrainConfig: resuming would not continue the same run")
    for name, a in live_arrays.items():
        if name.startswith(("model/", "fp8/")):
            _require(name in arrays, f"checkpoint has no {name!r}")
            _require(arrays[name].dtype == a.dtype and arrays[name].shape == a.shape,
                     f"{name!r} is {arrays[name].dtype} {arrays[name].shape} in the checkpoint, "
                     f"{a.dtype} {a.shape} in the trainer")
    expected = {n for n in live_arrays if n.startswith(("model/", "fp8/"))}
    saved = {n for n in arrays if n.startswith(("model/", "fp8/"))}
    _require(saved == expected, f"checkpoint holds other parameters or FP8 layers: "
             f"{sorted(saved ^ expected)}")
    _require(state["fp8"] == live["fp8"], "checkpoint's FP8 layers or formats differ")
    _require((state["scaler"] is None) == (trainer.scaler is None),
             "checkpoint and trainer disagree on loss scaling")
    params = [p for _, p in trainer.optimizer.named_parameters()]
    _require(len(state["optimizer"]["param_groups"]) == len(trainer.optimizer.param_groups),
             "checkpoint has a different number of optimizer parameter groups")
    for index, keys in state["optimizer"]["state_keys"].items():
        i = int(index)
        _require(0 <= i < len(params), f"optimizer state for parameter {i} of {len(params)}")
        for key in keys:
            a = arrays.get(f"optimizer/{index}/{key}")
            _require(a is not None and a.dtype == np.float32
                     and a.shape in ((), params[i].shape),
                     f"optimizer state {key!r} of parameter {i} is missing or has the wrong "
                     "dtype or shape")


def load_checkpoint(trainer, path) -> None:
    """Restore ``trainer`` from the checkpoint folder ``path`` (module docstring); raises
    :class:`CheckpointError` — with the trainer unchanged — if anything does not check out."""
    folder = Path(path)
    manifest = _read_manifest(folder)
    try:
        arrays = _read_arrays(folder, manifest)
        state = manifest["state"]
        _check_matches(trainer, arrays, state)
        history = [StepMetrics.from_dict(m) for m in state["history"]]
    except (KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{folder / _MANIFEST} is malformed: {exc!r}") from None
    opt = state["optimizer"]
    trainer.optimizer.load_state_dict({
        "state": {int(i): {k: arrays[f"optimizer/{i}/{k}"] for k in keys}
                  for i, keys in opt["state_keys"].items()},
        "param_groups": [dict(g, betas=tuple(g["betas"])) for g in opt["param_groups"]],
        "steps": opt["steps"]})
    trainer.model.load_state_dict({k[len("model/"):]: v for k, v in arrays.items()
                                   if k.startswith("model/")})
    for layer_name, layer in trainer.fp8_layers.items():
        layer.load_fp8_state_dict({
            role: {"format": fmt, "scale": arrays[f"fp8/{layer_name}/{role}/scale"],
                   "amax_history": arrays[f"fp8/{layer_name}/{role}/amax_history"]}
            for role, fmt in state["fp8"][layer_name].items()})
    if trainer.scaler is not None:
        trainer.scaler.load_state_dict(state["scaler"])
    set_rng_state(tuple(state["rng"]))
    trainer.step_count = int(state["step"])
    trainer.history = history
