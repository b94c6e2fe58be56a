"""The `mpt` command: output values, exit codes and clear errors."""
import json

import pytest

from mpt.cli import format_table, main
from mpt.formats import FORMATS


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_formats_json_is_the_table(capsys):
    code, out, _ = run(capsys, "formats", "--json")
    assert code == 0
    assert json.loads(out) == [f.describe() for f in FORMATS.values()]


def test_formats_text_has_one_row_per_format(capsys):
    code, out, _ = run(capsys, "formats")
    lines = out.strip().splitlines()
    assert code == 0 and len(lines) == 1 + len(FORMATS)
    assert lines[4].split()[:6] == ["fp16", "16", "5", "10", "15", "65504"]
    assert out.strip() == format_table()


def test_round_bits(capsys):
    # 0.1 = 0x1.999999999999ap-4: fp16 RNE 0x2e66, bf16 0x3dcd, e4m3fn 0.1015625 = 0x1d
    code, out, _ = run(capsys, "round", "0.1", "--to", "fp16", "bf16", "e4m3", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [r["bits"] for r in rows] == ["0x2e66", "0x3dcd", "0x1d"]
    assert rows[2]["value"] == 0.1015625


def test_round_modes_and_fractions(capsys):
    _, out, _ = run(capsys, "round", "1/3", "--to", "fp16", "--mode", "toward_zero", "--json")
    (row,) = json.loads(out)
    assert row["bits"] == "0x3555" and row["value"] == float.fromhex("0x1.554p-2")
    _, out, _ = run(capsys, "round", "1/3", "--to", "fp16", "--mode", "up", "--json")
    assert json.loads(out)[0]["bits"] == "0x3556"


def test_round_saturate(capsys):
    _, out, _ = run(capsys, "round", "1000", "--to", "e4m3", "--json")
    assert json.loads(out)[0]["bits"] == "0x7f"  # e4m3fn overflow is NaN
    _, out, _ = run(capsys, "round", "1000", "--to", "e4m3", "--saturate", "--json")
    assert json.loads(out)[0]["bits"] == "0x7e" and json.loads(out)[0]["value"] == 448.0


def test_bad_input_is_a_clear_error(capsys):
    code, _, err = run(capsys, "round", "1", "--to", "fp12")
    assert code == 2 and "unknown format 'fp12'" in err
    with pytest.raises(SystemExit):
        main(["round", "abc"])
    assert "not a number: 'abc'" in capsys.readouterr().err


def test_demo_prints_table_and_rounding(capsys):
    code, out, _ = run(capsys, "demo")
    assert code == 0 and format_table() in out
    assert "0x2e66" in out  # 0.1 in fp16
