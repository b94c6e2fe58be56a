"""The PyTorch adapter of the golden suites (skipped when torch is not installed).

PyTorch's CPU single-tensor optimizers, fake quantization and GradScaler are what mpt models bit
for bit, so those cases must verify bit-exact; matmul and attention cases are reported, not
asserted equal (PyTorch's CPU kernels are not a Tensor Core). See mpt/golden_torch.py.
"""
import pathlib
import sys

import pytest

from mpt import golden
from mpt.cli import main

COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "reference_results" / "default"


@pytest.fixture(scope="module")
def torch_rows(tmp_path_factory):
    pytest.importorskip("torch")
    from mpt.golden.torch import run_torch

    out, written, skipped = run_torch(COMMITTED, tmp_path_factory.mktemp("torch-out"))
    assert written + skipped == len(golden.load_suite(COMMITTED)) and written > 100
    return {r["case"]: r for r in golden.verify(COMMITTED, out, allow_missing=True)}


def test_pytorch_semantics_that_mpt_models_are_bit_exact(torch_rows):
    exact = [name for name in torch_rows if name.startswith(("fake_quant-", "grad_scaler-"))]
    exact += ["optim-sgd-fma", "optim-adamw-fma", "round-fp8_e4m3fnuz-nearest_even",
              "round-fp8_e4m3fn-nearest_even-saturate", "gemm-ampere-bf16-splitk4"]
    assert len(exact) == 10
    verdicts = {name: torch_rows[name]["verdict"] for name in exact}
    assert verdicts == dict.fromkeys(exact, "bit-exact")


def test_known_differences_are_reported_where_they_are(torch_rows):
    # torch keeps NaN payloads where mpt returns the canonical NaN; non-fma optimizer arithmetic
    row = torch_rows["round-fp16-nearest_even"]
    assert row["verdict"] == "mismatch" and row["n_differ"] == 1
    assert row["desired_bits"] == "0x7e00" and row["actual_bits"] != "0x7e00"
    assert torch_rows["optim-adamw-nofma"]["verdict"] == "mismatch"
    # operations torch cannot express are skipped, not failed
    assert torch_rows["round-bf16-stochastic"]["verdict"] == "skipped"
    assert torch_rows["mma-hopper-fp8_e4m3fn-fp32-random"]["verdict"] == "skipped"


def test_cli_run_torch_then_verify(tmp_path, capsys):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    assert main(["golden", "run-torch", "--golden", str(COMMITTED), "--outputs", str(out)]) == 0
    assert "skipped" in capsys.readouterr().out
    assert main(["golden", "verify", "--golden", str(COMMITTED), "--outputs", str(out),
                 "--allow-missing"]) == 1                    # the matmul cases differ
    assert main(["golden", "run-torch", "--golden", str(COMMITTED), "--outputs", str(out),
                 "--device", "tpu"]) == 2


def test_missing_torch_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)           # `import torch` raises ImportError
    assert main(["golden", "run-torch", "--golden", str(COMMITTED),
                 "--outputs", str(tmp_path / "o")]) == 2
    assert "needs PyTorch" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
