"""mpt.train_state: resuming from a checkpoint continues bit for bit; damaged, tampered, malformed
or foreign checkpoints are refused before anything changes (all or nothing: every parameter,
optimizer state, scaler field, FP8 state, the RNG and the history stay bit for bit); files are
read only from inside the folder; saving is atomic and never replaces what mpt did not write."""
import hashlib
import io
import json
import math
import re

import numpy as np
import pytest

import mpt
from mpt import nn
from mpt._io import dtype_from_name, storable
from mpt.train.corpus import MarkovCorpus
from mpt.train.state import CheckpointError, load_checkpoint, save_checkpoint
from mpt.train.trainer import TrainConfig, Trainer

CORPUS = MarkovCorpus(16, 8, seed=0)
CONFIG = TrainConfig(lr=3e-3, warmup_steps=2, total_steps=8, loss_multiplier=2.0**-8)


def _data(step, micro):
    return CORPUS.batch(4, 8, "train", 2 * step + micro)


def _trainer(recipe, config=CONFIG, dropout=0.1):
    mpt.manual_seed(7)
    return Trainer(nn.GPT(16, 16, 1, 2, 8, dropout=dropout, seed=0), recipe, config)


def _snapshot(trainer):
    """Every bit a trainer holds (model, optimizer states, scaler, FP8 states, RNG, step)."""
    opt = trainer.optimizer.state_dict()
    arrays = {f"network/{k}": v.reshape(-1).view(np.uint8)
              for k, v in trainer.network.state_dict().items()}
    arrays.update({f"opt/{i}/{k}": v.reshape(-1).view(np.uint8)
                   for i, s in opt["state"].items() for k, v in s.items()})
    for name, layer in trainer.fp8_layers.items():
        for role, s in layer.fp8_state_dict().items():
            arrays[f"fp8/{name}/{role}"] = np.concatenate([s["scale"].reshape(1),
                                                           s["amax_history"]]).view(np.uint8)
    scalars = {"steps": opt["steps"], "rng": mpt.get_rng_state(), "step": trainer.step_count,
               "scaler": None if trainer.scaler is None else trainer.scaler.state_dict(),
               "groups": [{k: v for k, v in g.items() if k != "params"}
                          for g in opt["param_groups"]],
               "history": json.dumps([m.to_dict() for m in trainer.history], sort_keys=True)}
    return {k: v.copy() for k, v in arrays.items()}, scalars


def _equal(a, b):
    return a[1] == b[1] and a[0].keys() == b[0].keys() and \
        all(np.array_equal(a[0][k], b[0][k]) for k in a[0])


@pytest.mark.parametrize("recipe, accum", [("fp16-o2", 2), ("bf16-pure-sr", 1),
                                           ("fp8-hybrid", 1)])
def test_resume_is_bit_identical(tmp_path, recipe, accum):
    config = TrainConfig(**{**CONFIG.describe(), "grad_accum": accum})
    straight = _trainer(recipe, config)
    straight.train(_data, 8)
    first = _trainer(recipe, config)
    first.train(_data, 5)
    save_checkpoint(first, tmp_path / "ckpt")
    resumed = _trainer(recipe, config)
    load_checkpoint(resumed, tmp_path / "ckpt")
    assert _equal(_snapshot(resumed), _snapshot(first))
    resumed.train(_data, 3)
    assert _equal(_snapshot(resumed), _snapshot(straight))
    assert [m.to_dict() for m in resumed.history] == [m.to_dict() for m in straight.history]


def test_resume_needs_what_the_checkpoint_holds(tmp_path):
    # the comparison above can fail: resuming with fresh FP8 histories (or a fresh dropout
    # generator) does not give the straight run's bits
    straight = _trainer("fp8-hybrid")
    straight.train(_data, 8)
    first = _trainer("fp8-hybrid")
    first.train(_data, 5)
    save_checkpoint(first, tmp_path / "ckpt")
    for spoil in ("fp8", "rng"):
        resumed = _trainer("fp8-hybrid")
        load_checkpoint(resumed, tmp_path / "ckpt")
        if spoil == "fp8":
            for layer in resumed.fp8_layers.values():
                layer.fp8_states = {r: layer.scaling.state(s) for r, s in
                                    (("input", "forward"), ("weight", "forward"),
                                     ("grad_output", "backward"))}
        else:
            mpt.manual_seed(7)
        resumed.train(_data, 3)
        assert not _equal(_snapshot(resumed), _snapshot(straight)), spoil


@pytest.fixture
def saved(tmp_path):
    trainer = _trainer("fp16-o2")
    trainer.train(_data, 3)
    folder = tmp_path / "ckpt"
    save_checkpoint(trainer, folder)
    target = _trainer("fp16-o2")
    target.train(_data, 1)
    return folder, target


def _refused(folder, target, match):
    before = _snapshot(target)
    with pytest.raises(CheckpointError, match=match):
        load_checkpoint(target, folder)
    assert _equal(_snapshot(target), before)                 # nothing was overwritten


def test_the_snapshot_sees_every_part_a_load_restores(saved):
    """_refused's comparison can fail: the target differs from the checkpoint in every part."""
    folder, target = saved
    before = _snapshot(target)
    load_checkpoint(target, folder)
    after = _snapshot(target)
    assert all(not np.array_equal(before[0][k], after[0][k]) for k in before[0]
               if not k.endswith("/step"))                           # every array moved
    assert all(before[1][k] != after[1][k] for k in before[1]), \
        [k for k in before[1] if before[1][k] == after[1][k]]


def _npz(folder):
    (path,) = folder.glob("state-*.npz")
    return path


def test_tampered_arrays_are_refused(saved):
    folder, target = saved
    data = bytearray(_npz(folder).read_bytes())
    data[len(data) // 2] ^= 0x01
    _npz(folder).write_bytes(bytes(data))
    _refused(folder, target, "SHA-256")


def test_truncated_arrays_are_refused(saved):
    folder, target = saved
    data = _npz(folder).read_bytes()
    _npz(folder).write_bytes(data[:len(data) - 100])
    _refused(folder, target, "truncated")


def test_truncated_manifest_is_refused(saved):
    folder, target = saved
    text = (folder / "manifest.json").read_text()
    (folder / "manifest.json").write_text(text[:len(text) // 2])
    _refused(folder, target, "not valid JSON")


def test_edited_manifest_is_refused(saved):
    folder, target = saved
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["state"]["step"] = 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    _refused(folder, target, "modified")


def test_foreign_checkpoints_are_refused(saved, tmp_path):
    folder, _ = saved
    _refused(folder, _trainer("bf16-o2"), "recipe")
    _refused(folder, _trainer("fp16-o2", TrainConfig(lr=1e-3)), "TrainConfig")
    _refused(tmp_path / "nowhere", _trainer("fp16-o2"), "no manifest.json")


def test_saving_is_atomic(saved, monkeypatch):
    folder, target = saved
    old = (folder / "manifest.json").read_bytes(), _npz(folder).read_bytes()

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("mpt.train_state.np.savez", fail)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(target, folder)
    monkeypatch.undo()
    assert ((folder / "manifest.json").read_bytes(), _npz(folder).read_bytes()) == old
    assert sorted(p.name for p in folder.iterdir()) == ["manifest.json", _npz(folder).name]
    save_checkpoint(target, folder)                           # replaces the old pair
    assert len(list(folder.glob("state-*.npz"))) == 1
    fresh = _trainer("fp16-o2")
    load_checkpoint(fresh, folder)
    assert _equal(_snapshot(fresh), _snapshot(target))


# ---- malformed checkpoints: the whole state is checked before anything changes ------------------
def _resign(manifest):
    """The manifest's own SHA-256, as save_checkpoint computes it (a forged but consistent file)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    manifest["manifest_sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()) \
        .hexdigest()
    return manifest


def _forge(folder, mutate):
    path = folder / "manifest.json"
    manifest = json.loads(path.read_text())
    mutate(manifest)
    path.write_text(json.dumps(_resign(manifest)))


def _forge_arrays(folder, mutate):
    """Change the stored arrays (name -> array); every hash and the npz name follow."""
    manifest = json.loads((folder / "manifest.json").read_text())
    old = folder / manifest["npz"]
    with np.load(old) as npz:
        arrays = {name: npz[meta["key"]].view(dtype_from_name(meta["dtype"]))
                  for name, meta in manifest["arrays"].items()}
    mutate(arrays)
    buffer = io.BytesIO()
    np.savez(buffer, **{f"a{i}": storable(a) for i, a in enumerate(arrays.values())})
    data = buffer.getvalue()
    digest = hashlib.sha256(data).hexdigest()
    old.unlink()
    (folder / f"state-{digest[:16]}.npz").write_bytes(data)
    manifest.update(npz=f"state-{digest[:16]}.npz", npz_sha256=digest, arrays={
        name: {"key": f"a{i}", "dtype": a.dtype.name, "shape": list(a.shape),
               "sha256": hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()}
        for i, (name, a) in enumerate(arrays.items())})
    (folder / "manifest.json").write_text(json.dumps(_resign(manifest)))


DELETE = object()


def _at(path, value):
    """A mutation of manifest["state"] at ``path`` (dotted; list indices as numbers)."""
    def mutate(manifest):
        obj = manifest["state"]
        keys = [int(k) if k.isdigit() and isinstance(obj, list) else k for k in path.split(".")]
        for key in keys[:-1]:
            obj = obj[int(key) if isinstance(obj, list) else key]
        last = int(keys[-1]) if isinstance(obj, list) else keys[-1]
        if value is DELETE:
            del obj[last]
        else:
            obj[last] = value
    return mutate


F32_SCALE = r"state\.scaler\.scale must be > 0 and finite in float32"
STATE_CASES = [
    # the repro: a bad scaler field used to raise KeyError after the model had changed
    ("scaler._growth_tracker", DELETE, r"state\.scaler\._growth_tracker is missing"),
    ("scaler.scale", 0.0, F32_SCALE), ("scaler.scale", -1.0, F32_SCALE),
    ("scaler.scale", 1e39, F32_SCALE), ("scaler.scale", 1e-50, F32_SCALE),
    ("scaler.scale", math.inf, r"state\.scaler\.scale must be a finite number; got inf"),
    ("scaler.scale", math.nan, r"state\.scaler\.scale must be a finite number; got nan"),
    ("scaler.scale", "65536.0", r"state\.scaler\.scale must be a finite number"),
    ("scaler.scale", DELETE, r"state\.scaler\.scale is missing"),
    ("scaler._growth_tracker", -1, r"state\.scaler\._growth_tracker must be in \[0, 2000\)"),
    ("scaler._growth_tracker", 2000, r"state\.scaler\._growth_tracker must be in \[0, 2000\)"),
    ("scaler._growth_tracker", 1.5, r"state\.scaler\._growth_tracker must be an integer"),
    ("scaler._growth_tracker", True, r"state\.scaler\._growth_tracker must be an integer"),
    ("scaler.growth_factor", 3.0, r"state\.scaler\.growth_factor is 3\.0 in the checkpoint"),
    ("scaler.backoff_factor", 2.0, r"state\.scaler\.backoff_factor is 2\.0 in the checkpoint"),
    ("scaler.growth_interval", True, r"state\.scaler\.growth_interval is True"),
    ("scaler.updates", -1, r"state\.scaler\.updates must be >= 0"),
    ("scaler.records", {}, r"state\.scaler\.records must be a list"),
    ("scaler.records.0", [], r"state\.scaler\.records\[0\] must be an object"),
    ("scaler.records.0.skipped", "no", r"state\.scaler\.records\[0\]\.skipped must be true or"),
    ("scaler.records.0.new_scale", 0.0, r"state\.scaler\.records\[0\]\.new_scale must be > 0"),
    ("scaler.records.0.found_inf", -2, r"state\.scaler\.records\[0\]\.found_inf must be >= 0"),
    ("scaler.records.0.first_overflow", 3, r"records\[0\]\.first_overflow must be a string or"),
    ("scaler.records.0.step", DELETE, r"state\.scaler\.records\[0\]\.step is missing"),
    ("scaler.extra", 1, r"state\.scaler has unknown fields \['extra'\]"),
    ("scaler", None, r"state\.scaler must be an object: the trainer has a loss scaler"),
    ("scaler", [1], r"state\.scaler must be an object"),
    ("optimizer.param_groups.0.lr", -1e-3, r"param_groups\[0\]\.lr must be >= 0; got -0\.001"),
    ("optimizer.param_groups.0.lr", math.nan, r"param_groups\[0\]\.lr must be a finite number"),
    ("optimizer.param_groups.0.lr", "0.1", r"param_groups\[0\]\.lr must be a finite number"),
    ("optimizer.param_groups.0.lr", DELETE, r"param_groups\[0\]\.lr is missing"),
    ("optimizer.param_groups.0.betas", [1.0, 0.999], r"betas must be two numbers in \[0, 1\)"),
    ("optimizer.param_groups.0.betas", [0.9, -0.1], r"betas must be two numbers in \[0, 1\)"),
    ("optimizer.param_groups.0.betas", [0.9], r"betas must be two numbers in \[0, 1\)"),
    ("optimizer.param_groups.0.betas", 0.9, r"param_groups\[0\]\.betas must be a list"),
    ("optimizer.param_groups.0.eps", -1e-8, r"param_groups\[0\]\.eps must be >= 0"),
    ("optimizer.param_groups.0.weight_decay", math.inf,
     r"param_groups\[0\]\.weight_decay must be a finite number"),
    ("optimizer.param_groups.0.param_names", ["x"], r"param_names is \['x'\] in the checkpoint"),
    ("optimizer.param_groups.0.params", [0], r"param_groups\[0\]\.params is \[0\] in the"),
    ("optimizer.param_groups.0.nesterov", True, r"param_groups\[0\] has unknown fields"),
    ("optimizer.param_groups", [], r"state\.optimizer\.param_groups has 0 groups"),
    ("optimizer.param_groups", "all", r"state\.optimizer\.param_groups must be a list"),
    ("optimizer.steps", -1, r"state\.optimizer\.steps must be >= 0"),
    ("optimizer.steps", 2.0, r"state\.optimizer\.steps must be an integer"),
    ("optimizer.state_keys.99", ["step"], r"state_keys\['99'\] names no parameter"),
    ("optimizer.state_keys.01", ["step"], r"state_keys\['01'\] names no parameter"),
    ("optimizer.state_keys.0", ["step"], r"state_keys\['0'\] must list the states"),
    ("optimizer.state_keys.0", "step", r"state_keys\['0'\] must list the states"),
    ("optimizer.extra", {}, r"state\.optimizer has unknown fields"),
    ("rng", [7], r"state\.rng must be \[seed, counter\]"),
    ("rng", [-1, 0], r"state\.rng must be \[seed, counter\]"),
    ("rng", [2**64, 0], r"state\.rng must be \[seed, counter\]"),
    ("rng", [7, 1.5], r"state\.rng must be \[seed, counter\]"),
    ("rng", "7", r"state\.rng must be a list"),
    ("step", -1, r"state\.step must be >= 0"),
    ("step", "3", r"state\.step must be an integer"),
    ("step", DELETE, r"state\.step is missing"),
    ("history", {}, r"state\.history must be a list"),
    ("history.0", 1, r"state\.history\[0\] must be an object"),
    ("history.0.loss_grad", DELETE, r"state\.history\[0\] is not a step's metrics: KeyError"),
    ("history.0.bogus", 1, r"state\.history\[0\] is not a step's metrics: TypeError"),
    ("history.2.step", 5, r"state\.history\[2\]\.step must be in \(2, 3\]"),
    ("history.1.step", 1, r"state\.history\[1\]\.step must be in \(1, 3\]"),
    ("recipe", DELETE, r"state\.recipe is missing"),
    ("recipe", [], r"state\.recipe must be an object"),
    ("config", "fp16", r"state\.config must be an object"),
    ("fp8", [], r"state\.fp8 must be an object"),
    ("fp8", {"x": {}}, r"state\.fp8 lists other FP8 layers"),
    ("extra", 1, r"state has unknown fields \['extra'\]"),
]


@pytest.mark.parametrize("path, value, match", STATE_CASES,
                         ids=[f"{p}={'DELETE' if v is DELETE else repr(v)}"[:50]
                              for p, v, _ in STATE_CASES])
def test_every_bad_state_field_is_named_and_nothing_changes(saved, path, value, match):
    folder, target = saved
    _forge(folder, _at(path, value))
    _refused(folder, target, match)


LAYOUT_CASES = [
    (lambda m: m.update(npz="../" + m["npz"]), r"npz must be the content-addressed name"),
    (lambda m: m.update(npz="/etc/passwd"), r"npz must be the content-addressed name"),
    (lambda m: m.pop("npz"), r"manifest\.npz is missing"),
    (lambda m: m.update(npz_sha256="x"), r"npz_sha256 must be a SHA-256"),
    (lambda m: m.update(arrays=[]), r"arrays must be an object"),
    (lambda m: m.update(state=[]), r"state must be an object"),
    (lambda m: m.update(extra=1), r"manifest has unknown fields \['extra'\]"),
    (lambda m: next(iter(m["arrays"].values())).update(key="b1"), r"\.key must be a unique"),
    (lambda m: next(iter(m["arrays"].values())).update(dtype="object"), r"\.dtype dtype 'object'"),
    (lambda m: next(iter(m["arrays"].values())).update(shape=[-1]), r"\.shape must be a list"),
    (lambda m: next(iter(m["arrays"].values())).pop("sha256"), r"\.sha256 is missing"),
]


@pytest.mark.parametrize("mutate, match", LAYOUT_CASES, ids=[m for _, m in LAYOUT_CASES])
def test_malformed_manifests_are_named(saved, mutate, match):
    folder, target = saved
    _forge(folder, mutate)
    _refused(folder, target, match)


def _bump(name, change):
    def mutate(arrays):
        arrays[name] = change(arrays[name].copy())
    return mutate


def _negative(a):
    a.reshape(-1)[0] = -1.0
    return a


ARRAY_CASES = [
    ("fp16-o2", _bump("optimizer/0/step", lambda a: np.float32(-1.0).reshape(())),
     r"arrays\['optimizer/0/step'\] must be a whole number >= 0"),
    ("fp16-o2", _bump("optimizer/0/step", lambda a: np.float32(2.5).reshape(())),
     r"arrays\['optimizer/0/step'\] must be a whole number >= 0"),
    ("fp16-o2", _bump("optimizer/0/exp_avg_sq", _negative),
     r"arrays\['optimizer/0/exp_avg_sq'\] holds negative values"),
    ("fp16-o2", _bump("optimizer/1/exp_avg", lambda a: a.reshape(-1)[1:]),
     r"arrays\['optimizer/1/exp_avg'\] is float32 \(\d+,\) in the checkpoint"),
    ("fp16-o2", _bump("optimizer/1/master", lambda a: a.astype(np.float64)),
     r"arrays\['optimizer/1/master'\] is float64"),
    ("fp16-o2", _bump("network/wte.weight", lambda a: a.astype(np.float32)),
     r"arrays\['network/wte.weight'\] does not fit the parameter"),
    ("fp16-o2", lambda arrays: arrays.pop("optimizer/2/exp_avg"),
     r"arrays have no 'optimizer/2/exp_avg'"),
    ("fp16-o2", lambda arrays: arrays.pop("network/wte.weight"),
     r"arrays hold other network parameters than the trainer's: \['wte.weight'\]"),
    ("fp16-o2", lambda arrays: arrays.update({"extra/x": np.zeros(2)}),
     r"arrays hold 1 arrays the trainer has no place for"),
    ("fp8-hybrid", _bump("fp8/blocks.0.mlp.fc1/input/scale", lambda a: np.float32(0).reshape(())),
     r"scale'\] must be finite and > 0; got 0\.0"),
    ("fp8-hybrid", _bump("fp8/blocks.0.mlp.fc1/weight/scale",
                         lambda a: np.float32(np.inf).reshape(())), r"must be finite and > 0"),
    ("fp8-hybrid", _bump("fp8/blocks.0.mlp.fc1/grad_output/scale", lambda a: -a),
     r"must be finite and > 0"),
    ("fp8-hybrid", _bump("fp8/blocks.0.mlp.fc1/input/scale", lambda a: a.reshape(1)),
     r"scale'\] is float32 \(1,\) in the checkpoint, float32 \(\) in the trainer"),
    ("fp8-hybrid", _bump("fp8/blocks.0.mlp.fc1/weight/amax_history", _negative),
     r"amax_history'\] holds negative values"),
]


@pytest.mark.parametrize("recipe, mutate, match", ARRAY_CASES, ids=[m for _, _, m in ARRAY_CASES])
def test_bad_arrays_are_named_and_nothing_changes(tmp_path, recipe, mutate, match):
    trainer = _trainer(recipe)
    trainer.train(_data, 3)
    folder = tmp_path / "ckpt"
    save_checkpoint(trainer, folder)
    target = _trainer(recipe)
    target.train(_data, 1)
    _forge_arrays(folder, mutate)
    _refused(folder, target, match)


def test_forged_but_valid_checkpoints_still_load(saved):
    """The forging helpers above write loadable checkpoints: what they refuse is the change."""
    folder, target = saved
    _forge(folder, lambda m: None)
    _forge_arrays(folder, lambda arrays: None)
    load_checkpoint(target, folder)
    assert target.step_count == 3


# ---- files: only inside the folder, never through a link ---------------------------------------
@pytest.mark.parametrize("which", ["npz", "manifest"])
def test_symbolic_links_are_refused(saved, tmp_path, opened, files, which):
    folder, target = saved
    link = _npz(folder) if which == "npz" else folder / "manifest.json"
    outside = tmp_path / "outside" / link.name            # an identical copy: its hash passes
    outside.parent.mkdir()
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(outside)
    before = files(folder, outside.parent)
    opened.clear()
    _refused(folder, target, "symbolic link")
    assert not any(p.startswith(str(outside.parent)) for p in opened)
    assert files(folder, outside.parent) == before


def test_save_never_replaces_what_mpt_did_not_write(saved, tmp_path, files):
    folder, target = saved
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text('{"schema_version": 2, "cases": []}')
    (foreign / "notes.npz").write_bytes(b"x")
    file = tmp_path / "file"
    file.write_bytes(b"y")
    before = files(tmp_path)
    with pytest.raises(CheckpointError, match="not an mpt checkpoint's manifest"):
        save_checkpoint(target, foreign)
    with pytest.raises(CheckpointError, match="is a file"):
        save_checkpoint(target, file)
    (foreign / "manifest.json").unlink()
    (foreign / "manifest.json").symlink_to(folder / "manifest.json")
    with pytest.raises(CheckpointError, match="symbolic link"):
        save_checkpoint(target, foreign)
    (foreign / "manifest.json").unlink()
    (foreign / "manifest.json").write_text('{"schema_version": 2, "cases": []}')
    assert {k: v[0] for k, v in files(tmp_path).items()} == {k: v[0] for k, v in before.items()}
    # a checkpoint folder: only mpt's own state-<16 hex>.npz files are replaced
    (folder / "state-notes.npz").write_bytes(b"mine")
    (folder / "other.npz").write_bytes(b"mine too")
    save_checkpoint(target, folder)
    names = sorted(p.name for p in folder.iterdir())
    assert len(names) == 4 and {"manifest.json", "state-notes.npz", "other.npz"} < set(names)
    new = json.loads((folder / "manifest.json").read_text())["npz"]
    assert re.fullmatch(r"state-[0-9a-f]{16}\.npz", new) and new in names


def test_object_arrays_are_never_unpickled(saved):
    folder, target = saved
    manifest = json.loads((folder / "manifest.json").read_text())
    old = folder / manifest["npz"]
    with np.load(old) as npz:
        stored = {k: npz[k] for k in npz.files}
    stored["a0"] = np.array([{}], dtype=object)
    buffer = io.BytesIO()
    np.savez(buffer, **stored)
    digest = hashlib.sha256(buffer.getvalue()).hexdigest()
    old.unlink()
    (folder / f"state-{digest[:16]}.npz").write_bytes(buffer.getvalue())
    manifest.update(npz=f"state-{digest[:16]}.npz", npz_sha256=digest)
    (folder / "manifest.json").write_text(json.dumps(_resign(manifest)))
    _refused(folder, target, "cannot be loaded: Object arrays")
