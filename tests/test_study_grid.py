"""mpt study --grid: seeds derived from the coordinates, the statistics over seeds, the report,
and a grid on two Dask workers bit for bit equal to the serial grid."""
import hashlib
import json
import os
import struct

import pytest

import mpt
from mpt.cli import main
from mpt.study import (GridConfig, ModelSize, StudyConfig, cell_seed, derive_seed,
                       format_grid_table, model_size, run_cell, run_grid, run_recipe,
                       write_grid_report)
from mpt.study.aggregate import aggregate, compare, compare_with, seed_stats

TINY = StudyConfig(steps=2, quant=False)


# ---- seeds --------------------------------------------------------------------------------------
def test_seed_derivation_is_blake2b_of_the_coordinates():
    for s in (0, 1, 2**64 - 1):
        text = b'["mpt.study.grid/1","seed",%d]' % s           # the documented canonical JSON
        digest = hashlib.blake2b(text, digest_size=8).digest()
        assert cell_seed(s) == int.from_bytes(digest, "little") == derive_seed("seed", s)
    # pinned: a change of the derivation changes every grid's results, so it must be deliberate
    assert [cell_seed(s) for s in (0, 1, 2)] == [0xbd3a1dfbabcfc828, 0xac9a020fbc0a4638,
                                                 0xd8d330c3f79e92e2]
    assert derive_seed("seed", 0) != derive_seed("seed", "0") != derive_seed("seeds", 0)
    with pytest.raises(ValueError):
        derive_seed(float("nan"))


def test_cells_and_their_seeds():
    g = GridConfig(recipes=("fp32", "bf16-pure"), seeds=(5, 7), sizes=("tiny", "8:1:2"),
                   lrs=(1e-3, 1e-2), study=TINY)
    cells = g.cells()
    assert len(cells) == 2 * 2 * 2 * 2
    assert [(c.size.name, c.lr, c.seed, c.recipe) for c in cells[:5]] == [
        ("tiny", 1e-3, 5, "fp32"), ("tiny", 1e-3, 5, "bf16-pure"), ("tiny", 1e-3, 7, "fp32"),
        ("tiny", 1e-3, 7, "bf16-pure"), ("tiny", 1e-2, 5, "fp32")]
    # the run seed is the seed coordinate's alone: every recipe, size and lr of a seed share it
    assert {s: {c.run_seed for c in cells if c.seed == s} for s in (5, 7)} == \
        {5: {cell_seed(5)}, 7: {cell_seed(7)}}
    config = g.cell_config(cells[-1])
    assert (config.recipes, config.seed, config.d_model, config.n_layers, config.n_heads) == \
        (("bf16-pure",), cell_seed(7), 8, 1, 2)
    assert config.lr == 1e-2 and config.min_lr == 1e-2 * 0.1 and config.steps == 2
    assert g.baseline == "fp32" and GridConfig(recipes=("bf16-amp", "fp16-amp")).baseline == \
        "bf16-amp"


def test_model_sizes():
    assert model_size("small") == ModelSize("small", 32, 1, 2)
    assert model_size("64:2:4") == ModelSize("64:2:4", 64, 2, 4) == model_size((64, 2, 4))
    assert model_size("64:2:4").label() == "64:2:4" and model_size("tiny").label() == \
        "tiny (16:1:2)"
    with pytest.raises(ValueError, match="tiny, small, base, large or d_model:n_layers:n_heads"):
        model_size("huge")
    with pytest.raises(ValueError, match="n_heads=3 must divide d_model=16"):
        model_size("16:1:3")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(seeds=(1, 1)), ValueError, "seeds holds the same value twice: 1"),
    (dict(seeds=()), ValueError, "seeds must name at least one value"),
    (dict(seeds=(-1,)), ValueError, r"seeds\[0\] must be"),
    (dict(lrs=(0.0,)), ValueError, r"lrs\[0\] must be"),
    (dict(lrs=3e-3), TypeError, "lrs must be a sequence"),
    (dict(sizes=("small", "32:1:2")), ValueError, "sizes holds the same value twice"),
    (dict(recipes=("fp32", "nope")), ValueError, "valid recipes"),
    (dict(recipes=("fp32",), baseline="bf16-amp"), ValueError, "baseline must be one of"),
    (dict(study=3), TypeError, "study must be a StudyConfig"),
])
def test_grid_config_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        GridConfig(**{"study": TINY, **kwargs})


# ---- statistics over seeds ----------------------------------------------------------------------
def test_seed_statistics():
    s = seed_stats("small", 1e-3, "fp32", [1.0, 4.0, 2.0])
    assert (s.n, s.mean, s.min, s.max, s.spread) == (3, 7 / 3, 1.0, 4.0, 3.0)
    # the mean sums exactly (math.fsum): no order of the seeds loses the 1.0
    for values in ([1e16, 1.0, -1e16], [1e16, -1e16, 1.0], [1.0, 1e16, -1e16]):
        assert seed_stats("s", 1.0, "r", values).mean == 1 / 3
    assert seed_stats("s", 1.0, "r", [2.5]).spread == 0.0
    with pytest.raises(ValueError, match="no values"):
        seed_stats("s", 1.0, "r", [])


def test_which_differences_exceed_the_spread():
    base = seed_stats("s", 1.0, "fp32", [1.0, 1.25])                # mean 1.125, spread 0.25
    cases = [([1.5, 1.625], 0.4375, 0.25, True),                     # beyond base's spread
             ([1.25, 1.5], 0.25, 0.25, False),                       # equal to it: not beyond
             ([0.5, 0.5625], -0.59375, 0.25, True),                  # below, by more
             ([0.0, 3.0], 0.375, 3.0, False)]                        # its own spread is larger
    for values, difference, spread, exceeds in cases:
        c = compare(seed_stats("s", 1.0, "r", values), base)
        assert (c.difference, c.spread, c.exceeds, c.baseline) == \
            (difference, spread, exceeds, "fp32"), values
    one = compare(seed_stats("s", 1.0, "r", [9.0]), seed_stats("s", 1.0, "fp32", [1.0]))
    assert one.difference == 8.0 and one.exceeds is None             # one seed: no decision
    with pytest.raises(ValueError, match="one size and learning rate"):
        compare(seed_stats("s", 2.0, "r", [1.0]), base)


def test_aggregate_groups_by_size_lr_recipe():
    rows = [("a", 1.0, "fp32", 1.0), ("a", 1.0, "bf16", 2.0), ("a", 1.0, "fp32", 1.5),
            ("a", 1.0, "bf16", 2.5), ("b", 1.0, "bf16", 7.0), ("b", 1.0, "fp32", 3.0)]
    stats = aggregate(rows)
    assert [(s.size, s.recipe, s.n, s.mean) for s in stats] == [
        ("a", "fp32", 2, 1.25), ("a", "bf16", 2, 2.25), ("b", "bf16", 1, 7.0),
        ("b", "fp32", 1, 3.0)]
    got = [(c.size, c.recipe, c.difference, c.exceeds) for c in compare_with(stats, "fp32")]
    assert got == [("a", "bf16", 1.0, True), ("b", "bf16", 4.0, None)]


# ---- running ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small_grid():
    config = GridConfig(recipes=("fp32", "bf16-pure"), seeds=(0, 1), sizes=("tiny",),
                        lrs=(3e-3,), study=TINY)
    return run_grid(config)


def _bits(run):
    return json.dumps([run.final_loss, [m.to_dict() for m in run.history]])


def test_a_cell_is_run_recipe_of_its_config(small_grid):
    cell, run = small_grid.cells[3], small_grid.runs[3]
    alone = run_recipe(small_grid.config.cell_config(cell), cell.recipe)
    assert _bits(alone) == _bits(run)
    assert len(run.history) == 2 and run.recipe == "bf16-pure"


def test_a_cell_ignores_the_state_of_its_process(small_grid):
    """A worker's context may hold anything a previous task left: run_cell starts fresh."""
    cell = small_grid.cells[1]
    mpt.manual_seed(123)
    with mpt.no_grad(), mpt.autocast("fp16"):
        run = run_cell(small_grid.config, cell)
    assert _bits(run) == _bits(small_grid.runs[1])


def test_grid_report(small_grid, tmp_path):
    text = format_grid_table(small_grid)
    lines = text.splitlines()
    assert lines[0].startswith("grid: 2 recipes x 2 seeds x 1 sizes x 1 learning rates = 4 runs")
    header = lines[lines.index("") + 1].split()
    assert header[:4] == ["size", "lr", "recipe", "seeds"] and header[-1] == "spread"
    rows = [line for line in lines if line.startswith("tiny (16:1:2)")]
    assert len(rows) == 2 and rows[0].split()[-2:] == ["-", "-"]
    assert rows[1].split()[-1] in ("yes", "no")
    stats = small_grid.stats()
    assert [s.n for s in stats] == [2, 2]
    assert stats[0].mean == (small_grid.runs[0].final_loss + small_grid.runs[2].final_loss) / 2
    paths = write_grid_report(small_grid, tmp_path)
    data = json.loads(paths["json"].read_text())
    assert [c["recipe"] for c in data["cells"]] == ["fp32", "bf16-pure"] * 2
    assert data["cells"][2]["run_seed"] == cell_seed(1) and data["cells"][2]["seed"] == 1
    assert data["aggregate"]["stats"][1]["spread"] == stats[1].spread
    assert data["grid"]["baseline"] == "fp32" and "seed" not in data["grid"]["study"]
    assert data["recipes"]["bf16-pure"]["master_format"] is None
    md = paths["report"].read_text()
    assert "| tiny (16:1:2) | 0.003 | bf16-pure | 2 |" in md and "## Cells" in md


# ---- the command, serial and on Dask -------------------------------------------------------------
GRID = ["study", "--grid", "--recipes", "fp32", "bf16-pure", "fp16-o2", "--seeds", "0", "1",
        "--sizes", "tiny", "8:1:2", "--lrs", "3e-3", "1e-2", "--steps", "3", "--quiet"]


def _numbers(a, b, path="$"):
    """Walk two JSON documents that must have the same shape; yield every pair of numbers (wall
    times, ``seconds``, left out: they are the only fields that may differ)."""
    assert type(a) is type(b), path
    if isinstance(a, dict):
        assert list(a) == list(b), path
        for key in a:
            if key != "seconds":
                yield from _numbers(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _numbers(x, y, f"{path}[{i}]")
    elif isinstance(a, (int, float)) and not isinstance(a, bool):
        yield path, a, b
    else:
        assert a == b, path


def _bits_of(x):
    return struct.pack("<d", x) if isinstance(x, float) else x


def test_grid_on_two_dask_workers_is_bit_identical_to_serial(tmp_path, capsys):
    pytest.importorskip("distributed")
    environ = dict(os.environ)
    assert main(GRID + ["--out", str(tmp_path / "serial")]) == 0
    serial_out = capsys.readouterr().out
    assert main(GRID + ["--workers", "2", "--out", str(tmp_path / "dask")]) == 0
    dask_out = capsys.readouterr().out
    assert dict(os.environ) == environ     # the cluster's nannies left this process's env alone
    serial = json.loads((tmp_path / "serial" / "study.json").read_text())
    dask = json.loads((tmp_path / "dask" / "study.json").read_text())
    pairs = list(_numbers(serial, dask))
    differ = [p for p, x, y in pairs if _bits_of(x) != _bits_of(y)]
    assert differ == []
    assert len(serial["cells"]) == 3 * 2 * 2 * 2 and len(pairs) > 5000
    loss = dask["cells"][5]["final_loss"]                  # the comparison sees one bit
    dask["cells"][5]["final_loss"] = struct.unpack("<d", struct.pack("<q", struct.unpack(
        "<q", struct.pack("<d", loss))[0] ^ 1))[0]
    assert [p for p, x, y in _numbers(serial, dask) if _bits_of(x) != _bits_of(y)] == \
        ["$.cells[5].final_loss"]
    # the printed tables are the same text (they hold no wall times)
    assert serial_out.split("\nreport:")[0] == dask_out.split("\nreport:")[0]
    assert "vs fp32" in serial_out and "differences beyond the seeds' spread:" in serial_out


def test_grid_command_errors(tmp_path, capsys):
    assert main(["study", "--seeds", "0", "1", "--out", str(tmp_path)]) == 2
    assert "--seeds need --grid" in capsys.readouterr().err
    assert main(["study", "--grid", "--seed", "3", "--out", str(tmp_path)]) == 2
    assert "--seeds S" in capsys.readouterr().err
    assert main(["study", "--grid", "--sizes", "huge", "--out", str(tmp_path)]) == 2
    assert "model size must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["study", "--grid", "--workers", "2", "--scheduler", "tcp://x:1"])
    assert "not allowed with argument" in capsys.readouterr().err
