"""mpt.mma against real Tensor Core outputs: 0 mismatches on every row of every dump file.

../shared/data/tensor_core_dumps holds 5,000 random D = A·B + C samples per (GPU, input format),
measured on V100, A100 and H100 (its README gives the layout: FP32 bit patterns as uint32).
Each row is one dot product; here all rows of a file run as one batched mma call, a (5000, 1, K)
times b (5000, K, 1). Skips with a clear reason when the folder is absent.
"""
import ml_dtypes
import numpy as np
import pytest

import mpt

MODELS = {"V100": "volta", "A100": "ampere", "H100": "hopper"}
DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32}
FILES = [f"{gpu}_{fmt}" for gpu in MODELS for fmt in DTYPES if (gpu, fmt) not in
         {("V100", "bf16"), ("V100", "tf32")}]


def _load(folder, name):
    path = folder / f"{name}.npz"
    if not path.is_file():
        pytest.fail(f"{path} is missing from the hardware samples")
    with np.load(path, allow_pickle=False) as data:
        return {key: data[key] for key in data.files}


def _run(data, model, fmt, out):
    """D bit patterns (as FP32 patterns) of every row, computed by mpt.mma."""
    dtype = DTYPES[fmt]
    a = data["a"].view(np.float32)
    b = data["b"].view(np.float32)
    if fmt != "tf32":  # the samples are exact values of the format: the cast is exact
        assert np.array_equal(a.astype(dtype).astype(np.float32), a)
        assert np.array_equal(b.astype(dtype).astype(np.float32), b)
    c = data["c"].view(np.float32)
    if out == "fp16":
        c = c.astype(np.float16)  # on the GPU, C was first rounded to FP16 (RNE)
    d = mpt.mma(a.astype(dtype)[:, None, :], b.astype(dtype)[:, :, None], c[:, None, None],
                model=model, in_format="tf32" if fmt == "tf32" else None)[:, 0, 0]
    return d.astype(np.float32).view(np.uint32)


@pytest.mark.parametrize("name", FILES)
def test_every_row_matches_hardware(tensor_core_dumps, name):
    gpu, fmt = name.split("_")
    data = _load(tensor_core_dumps, name)
    assert data["a"].shape[0] == 5000
    for out in ("fp32", "fp16"):
        key = f"d_{out}"
        if key not in data:
            continue
        got = _run(data, MODELS[gpu], fmt, out)
        bad = np.flatnonzero(got != data[key])
        assert bad.size == 0, (f"{name} {out}: {bad.size} mismatching rows, first {bad[:5]}: "
                               f"got {[hex(x) for x in got[bad[:5]]]}, "
                               f"hardware {[hex(x) for x in data[key][bad[:5]]]}")


@pytest.mark.parametrize("name, other", [("V100_fp16", "ampere"), ("A100_fp16", "hopper"),
                                         ("H100_bf16", "ampere"), ("A100_tf32", "hopper")])
def test_samples_tell_architectures_apart(tensor_core_dumps, name, other):
    """The acceptance test has teeth: another generation's parameters miss many rows."""
    gpu, fmt = name.split("_")
    data = _load(tensor_core_dumps, name)
    assert np.count_nonzero(_run(data, other, fmt, "fp32") != data["d_fp32"]) > 100
