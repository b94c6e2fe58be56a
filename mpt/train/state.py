"""L5: training checkpoints — everything a :class:`mpt.train.Trainer` needs to continue bit for
bit: the network copy, the optimizer (FP32 masters and states, step counts), the loss scaler
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
manifest's hash gives). It checks every hash, dtype and shape, then validates the *whole* state
against the trainer before it changes anything: the same recipe, config, parameter names, shapes,
formats and values of the parameters' formats; optimizer groups (``lr`` ≥ 0, ``betas`` in
[0, 1), ``eps`` and ``weight_decay`` ≥ 0, all finite), states (float32, right shapes, integral
step counts ≥ 0, ``exp_avg_sq`` ≥ 0) and step counts; the scaler (scale > 0 and finite in float32,
growth tracker in [0, growth_interval), its fixed hyper-parameters those of the trainer,
records well formed); FP8 scales (finite, > 0) and amax histories (no negative values); the RNG
state (two integers in [0, 2**64)); the step and the history. Only then is everything applied:
a truncated, tampered, malformed or mismatched checkpoint raises :class:`CheckpointError` naming
the field (``state.scaler.scale must be > 0 ...``) and leaves the trainer and the RNG bit for bit
as they were.
"""
from __future__ import annotations

import io
import json
import os
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mpt._io import (NATIVE_DTYPES, atomic_write_bytes, dtype_from_name, field, load_json,
                     read_in_folder, sha256, storable)
from mpt.amp.scaler import StaticLossScale
from mpt.functional import get_rng_state, set_rng_state
from mpt.nn.module import _check_loadable
from mpt.optim.optimizer import _format_of
from mpt.train.trainer import StepMetrics

__all__ = ["save_checkpoint", "load_checkpoint", "CheckpointError"]

FORMAT = "mpt-train-state"
VERSION = 2   # 2: the network's arrays are named "network/<parameter>" (1: "model/...")
_MANIFEST = "manifest.json"
_NPZ_NAME = re.compile(r"state-[0-9a-f]{16}\.npz")
_STATE_FIELDS = ("recipe", "config", "step", "optimizer", "scaler", "rng", "fp8", "history")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: damaged, tampered with, malformed, or for another
    trainer. Raised before the trainer is changed."""


# ---- what a trainer holds ------------------------------------------------------------------------
def _collect(trainer) -> tuple[dict, dict]:
    """(arrays by name, JSON state) of a trainer."""
    arrays = {f"network/{k}": v for k, v in trainer.network.state_dict().items()}
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


# ---- loading: the files --------------------------------------------------------------------------
def _fail(where: str, message: str):
    raise CheckpointError(f"{where} {message}")


def _get(obj, key: str, kinds: str, where: str):
    return field(obj, key, kinds, where, CheckpointError)


def _exact_fields(obj: dict, expected, where: str) -> None:
    missing = [k for k in expected if k not in obj]
    if missing:
        _fail(f"{where}.{missing[0]}", "is missing")
    unknown = sorted(set(obj) - set(expected))
    if unknown:
        _fail(where, f"has unknown fields {unknown}")


def _check_layout(manifest: dict) -> None:
    """The manifest's fields around the state: names, hashes and array descriptions."""
    _exact_fields(manifest, ("format", "version", "npz", "npz_sha256", "arrays", "state",
                             "manifest_sha256"), "manifest")
    _get(manifest, "manifest_sha256", "sha256", "")
    digest = _get(manifest, "npz_sha256", "sha256", "")
    npz = _get(manifest, "npz", "str", "")
    if npz != f"state-{digest[:16]}.npz":
        _fail("npz", f"must be the content-addressed name 'state-{digest[:16]}.npz'; got {npz!r}")
    keys = set()
    for name, meta in _get(manifest, "arrays", "dict", "").items():
        where = f"arrays[{name!r}]"
        if not isinstance(meta, dict):
            _fail(where, "must be an object")
        _exact_fields(meta, ("key", "dtype", "shape", "sha256"), where)
        key = _get(meta, "key", "str", where)
        if not re.fullmatch(r"a[0-9]{1,9}", key) or key in keys:
            _fail(f"{where}.key", f"must be a unique 'a<number>'; got {key!r}")
        keys.add(key)
        try:
            dtype_from_name(_get(meta, "dtype", "str", where))
        except ValueError as exc:
            _fail(f"{where}.dtype", str(exc))
        shape = _get(meta, "shape", "list", where)
        if len(shape) > 64 or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                      for n in shape):
            _fail(f"{where}.shape", f"must be a list of non-negative integers; got {shape!r}")
        _get(meta, "sha256", "sha256", where)
    _exact_fields(_get(manifest, "state", "dict", ""), _STATE_FIELDS, "state")


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
    try:
        _check_layout(manifest)
    except CheckpointError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if manifest["manifest_sha256"] != _manifest_digest(body):
        raise CheckpointError(f"{path} was modified after it was written (its SHA-256 does not "
                              "match)")
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
            try:
                raw = npz[meta["key"]]
            except ValueError as exc:                   # an object array: never unpickled
                raise CheckpointError(f"array {name!r} cannot be loaded: {exc}") from None
            dtype = dtype_from_name(meta["dtype"])
            if raw.dtype not in NATIVE_DTYPES or raw.dtype.itemsize != dtype.itemsize:
                raise CheckpointError(f"array {name!r} is stored as {raw.dtype}, which cannot "
                                      f"hold {dtype}")
            arr = raw.view(dtype)
            if list(arr.shape) != meta["shape"] or sha256(arr.tobytes()) != meta["sha256"]:
                raise CheckpointError(f"array {name!r} does not match its shape or SHA-256")
            arrays[name] = arr
    return arrays


# ---- loading: the state, checked whole against the trainer ---------------------------------------
@dataclass
class _Restore:
    """A checked checkpoint, in the forms the trainer's parts load."""

    params: dict
    optimizer: dict
    fp8: dict
    scaler: dict | None
    rng: tuple
    step: int
    history: list


def _array(arrays: dict, name: str, like: np.ndarray) -> np.ndarray:
    """``arrays[name]``, required to have the dtype and shape of ``like``."""
    if name not in arrays:
        _fail("arrays", f"have no {name!r}")
    a = arrays[name]
    if a.dtype != like.dtype or a.shape != like.shape:
        _fail(f"arrays[{name!r}]", f"is {a.dtype} {a.shape} in the checkpoint, {like.dtype} "
                                   f"{like.shape} in the trainer")
    return a


def _check_run(trainer, state: dict) -> None:
    recipe = _get(state, "recipe", "dict", "state")
    live = trainer.recipe.describe()
    if recipe != live:
        _fail("state.recipe", f"is {recipe.get('name')!r}; the trainer runs {live['name']!r} "
                              "(or a different variant of it)")
    if _get(state, "config", "dict", "state") != _jsonable(trainer.config.describe()):
        _fail("state.config", "differs from the trainer's TrainConfig: resuming would not "
                              "continue the same run")


def _check_network(trainer, arrays: dict) -> dict:
    params = dict(trainer.network.named_parameters())
    saved = {n[len("network/"):] for n in arrays if n.startswith("network/")}
    if saved != set(params):
        _fail("arrays", f"hold other network parameters than the trainer's: "
                        f"{sorted(saved ^ set(params))[:5]}")
    out = {}
    for name, p in params.items():
        out[name] = arrays[f"network/{name}"]
        try:
            _check_loadable(name, out[name], p)
        except (TypeError, ValueError) as exc:
            _fail(f"arrays['network/{name}']", f"does not fit the parameter: {exc}")
    return out


def _check_fp8(trainer, arrays: dict, state: dict) -> dict:
    live = {name: layer.fp8_state_dict() for name, layer in trainer.fp8_layers.items()}
    formats = {name: {role: s["format"] for role, s in states.items()}
               for name, states in live.items()}
    if _get(state, "fp8", "dict", "state") != formats:
        _fail("state.fp8", "lists other FP8 layers or formats than the trainer's")
    out = {}
    for name, states in live.items():
        out[name] = {}
        for role, s in states.items():
            base = f"fp8/{name}/{role}"
            scale = _array(arrays, f"{base}/scale", s["scale"])
            history = _array(arrays, f"{base}/amax_history", s["amax_history"])
            if not (np.isfinite(scale) and scale > 0):
                _fail(f"arrays[{base + '/scale'!r}]", f"must be finite and > 0; got {scale}")
            if (history < 0).any():
                _fail(f"arrays[{base + '/amax_history'!r}]", "holds negative values (an amax is "
                                                             ">= 0)")
            out[name][role] = {"format": s["format"], "scale": scale, "amax_history": history}
    return out


def _check_hyper(group: dict, key: str, live, where: str) -> None:
    """One optimizer hyper-parameter: in range if it is a known one, else the trainer's value."""
    if key in ("lr", "eps", "weight_decay", "momentum"):
        value = _get(group, key, "real", where)
        if value < 0:
            _fail(f"{where}.{key}", f"must be >= 0; got {value!r}")
    elif key == "dampening":
        _get(group, key, "real", where)
    elif key == "nesterov":
        _get(group, key, "bool", where)
    elif key == "betas":
        betas = _get(group, key, "list", where)
        if len(betas) != 2 or not all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                      and 0 <= b < 1 for b in betas):
            _fail(f"{where}.betas", f"must be two numbers in [0, 1); got {betas!r}")
    elif group[key] != live:
        _fail(f"{where}.{key}", f"is {group[key]!r} in the checkpoint, {live!r} in the trainer")


def _check_optimizer(trainer, arrays: dict, state: dict) -> tuple[dict, set]:
    """(the optimizer's state_dict to load, the names of its arrays)."""
    opt, where = trainer.optimizer, "state.optimizer"
    saved = _get(state, "optimizer", "dict", "state")
    _exact_fields(saved, ("param_groups", "steps", "state_keys"), where)
    steps = _get(saved, "steps", "int", where)
    if steps < 0:
        _fail(f"{where}.steps", f"must be >= 0; got {steps}")
    live_groups = _jsonable(opt.state_dict()["param_groups"])
    groups = _get(saved, "param_groups", "list", where)
    if len(groups) != len(live_groups):
        _fail(f"{where}.param_groups", f"has {len(groups)} groups; the trainer's optimizer has "
                                       f"{len(live_groups)}")
    for i, (group, live) in enumerate(zip(groups, live_groups)):
        if not isinstance(group, dict):
            _fail(f"{where}.param_groups[{i}]", "must be an object")
        _exact_fields(group, live, f"{where}.param_groups[{i}]")
        for key in group:
            _check_hyper(group, key, live[key], f"{where}.param_groups[{i}]")
    params = [p for _, p in opt.named_parameters()]
    momentum = [g.get("momentum", 0) != 0 for g in opt.param_groups for _ in g["params"]]
    states, names = {}, set()
    for index, keys in _get(saved, "state_keys", "dict", where).items():
        here = f"{where}.state_keys[{index!r}]"
        if not re.fullmatch(r"0|[1-9][0-9]{0,8}", index) or int(index) >= len(params):
            _fail(here, f"names no parameter (the optimizer has {len(params)})")
        i, p = int(index), params[int(index)]
        required = set(opt._init_state(p, _format_of(p).name != "fp32"))
        allowed = required | ({"momentum_buffer"} if momentum[i] else set())
        if not isinstance(keys, list) or len(set(map(str, keys))) != len(keys) \
                or not required <= set(keys) <= allowed:
            _fail(here, f"must list the states {sorted(required)} (+ momentum_buffer with "
                        f"momentum); got {keys!r}")
        states[i] = {}
        for key in keys:
            name = f"optimizer/{index}/{key}"
            like = np.zeros(() if key == "step" else p.data.shape, np.float32)
            a = states[i][key] = _array(arrays, name, like)
            names.add(name)
            if key == "step" and not (np.isfinite(a) and a >= 0 and a == np.floor(a)):
                _fail(f"arrays[{name!r}]", f"must be a whole number >= 0; got {a}")
            if key == "exp_avg_sq" and (a < 0).any():
                _fail(f"arrays[{name!r}]", "holds negative values (a mean of squares is >= 0)")
    return {"state": states, "steps": steps,
            "param_groups": [dict(g, betas=tuple(g["betas"])) if "betas" in g else dict(g)
                             for g in groups]}, names


_SCALER_FIXED = ("growth_factor", "backoff_factor", "growth_interval", "min_scale", "max_scale")
_RECORD_KINDS = {"step": "int", "scale": "real", "found_inf": "int", "skipped": "bool",
                 "first_overflow": "str|null", "new_scale": "real", "growth_tracker": "int"}


def _check_scaler(trainer, state: dict) -> dict | None:
    saved, scaler, where = state["scaler"], trainer.scaler, "state.scaler"
    if scaler is None:
        if saved is not None:
            _fail(where, "must be null: the trainer has no loss scaler")
        return None
    if not isinstance(saved, dict):
        _fail(where, "must be an object: the trainer has a loss scaler")
    live = scaler.state_dict()
    _exact_fields(saved, live, where)
    scale = _get(saved, "scale", "real", where)
    with np.errstate(over="ignore", under="ignore"):
        as_f32 = np.float32(scale)                      # what the scaler multiplies by
    if not (np.isfinite(as_f32) and as_f32 > 0):
        _fail(f"{where}.scale", f"must be > 0 and finite in float32; got {scale!r}")
    fixed = _SCALER_FIXED + (("scale",) if isinstance(scaler, StaticLossScale) else ())
    for key in fixed:
        if key in live and (type(saved[key]) is bool or saved[key] != live[key]):
            _fail(f"{where}.{key}", f"is {saved[key]!r} in the checkpoint, {live[key]!r} in the "
                                    "trainer (the recipe sets it)")
    tracker = _get(saved, "_growth_tracker", "int", where)
    interval = live.get("growth_interval", 1)          # a static scale never grows
    if not 0 <= tracker < interval:
        _fail(f"{where}._growth_tracker", f"must be in [0, {interval}); got {tracker}")
    if "updates" in live and _get(saved, "updates", "int", where) < 0:
        _fail(f"{where}.updates", f"must be >= 0; got {saved['updates']}")
    for i, record in enumerate(_get(saved, "records", "list", where) if "records" in live else []):
        here = f"{where}.records[{i}]"
        if not isinstance(record, dict):
            _fail(here, "must be an object")
        _exact_fields(record, _RECORD_KINDS, here)
        for key, kinds in _RECORD_KINDS.items():
            value = _get(record, key, kinds, here)
            if kinds == "int" and value < 0 or kinds == "real" and not value > 0:
                _fail(f"{here}.{key}", f"must be {'> 0' if kinds == 'real' else '>= 0'}; got "
                                       f"{value!r}")
    return saved


def _check_rng(state: dict) -> tuple:
    rng = _get(state, "rng", "list", "state")
    if len(rng) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                and 0 <= v < 2**64 for v in rng):
        _fail("state.rng", f"must be [seed, counter], two integers in [0, 2**64); got {rng!r}")
    return tuple(rng)


def _check_history(state: dict, step: int) -> list:
    out, last = [], 0
    for i, entry in enumerate(_get(state, "history", "list", "state")):
        where = f"state.history[{i}]"
        if not isinstance(entry, dict):
            _fail(where, "must be an object")
        n = _get(entry, "step", "int", where)
        if not last < n <= step:
            _fail(f"{where}.step", f"must be in ({last}, {step}] (steps increase, and none comes "
                                   f"after the checkpoint's step); got {n}")
        try:
            out.append(StepMetrics.from_dict(entry))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            _fail(where, f"is not a step's metrics: {exc!r}")
        last = n
    return out


def _check_state(trainer, arrays: dict, state: dict) -> _Restore:
    """Everything the checkpoint restores, checked against ``trainer`` (raises before any
    change)."""
    _check_run(trainer, state)
    step = _get(state, "step", "int", "state")
    if step < 0:
        _fail("state.step", f"must be >= 0; got {step}")
    params = _check_network(trainer, arrays)
    fp8 = _check_fp8(trainer, arrays, state)
    optimizer, optimizer_names = _check_optimizer(trainer, arrays, state)
    known = {f"network/{n}" for n in params} | optimizer_names | {
        f"fp8/{name}/{role}/{key}" for name, roles in fp8.items() for role in roles
        for key in ("scale", "amax_history")}
    extra = sorted(set(arrays) - known)
    if extra:
        _fail("arrays", f"hold {len(extra)} arrays the trainer has no place for, e.g. {extra[:3]}")
    return _Restore(params, optimizer, fp8, _check_scaler(trainer, state), _check_rng(state),
                    step, _check_history(state, step))


def _apply(trainer, restore: _Restore) -> None:
    """Load a checked state into every part of the trainer (each load re-checks what it needs,
    and all of it was checked already, so none of them raises)."""
    trainer.network.load_state_dict(restore.params)
    trainer.optimizer.load_state_dict(restore.optimizer)
    for name, layer in trainer.fp8_layers.items():
        layer.load_fp8_state_dict(restore.fp8[name])
    if trainer.scaler is not None:
        trainer.scaler.load_state_dict(restore.scaler)
    set_rng_state(restore.rng)
    trainer.step_count = restore.step
    trainer.history = restore.history


def load_checkpoint(trainer, path) -> None:
    """Restore ``trainer`` from the checkpoint folder ``path`` (module docstring): all of it, or
    — raising :class:`CheckpointError` naming the field — nothing."""
    folder = Path(path)
    manifest = _read_manifest(folder)
    restore = _check_state(trainer, _read_arrays(folder, manifest), manifest["state"])
    _apply(trainer, restore)
