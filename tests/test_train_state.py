"""mpt.train_state: resuming from a checkpoint continues bit for bit; damaged, tampered or foreign
checkpoints are refused before anything changes; files are read only from inside the folder;
saving is atomic and never replaces what mpt did not write."""
import json
import re

import numpy as np
import pytest

import mpt
from mpt import nn
from mpt.corpus import MarkovCorpus
from mpt.train_state import CheckpointError, load_checkpoint, save_checkpoint
from mpt.training import TrainConfig, Trainer

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
    arrays = {f"model/{k}": v.reshape(-1).view(np.uint8)
              for k, v in trainer.model.state_dict().items()}
    arrays.update({f"opt/{i}/{k}": v.reshape(-1).view(np.uint8)
                   for i, s in opt["state"].items() for k, v in s.items()})
    for name, layer in trainer.fp8_layers.items():
        for role, s in layer.fp8_state_dict().items():
            arrays[f"fp8/{name}/{role}"] = np.concatenate([s["scale"].reshape(1),
                                                           s["amax_history"]]).view(np.uint8)
    scalars = {"steps": opt["steps"], "rng": mpt.get_rng_state(), "step": trainer.step_count,
               "scaler": None if trainer.scaler is None else trainer.scaler.state_dict(),
               "losses": [m.loss for m in trainer.history]}
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
