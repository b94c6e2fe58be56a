"""mpt.mma against real Tensor Core outputs: 0 mismatches on every row of every dump file.

tests/data/tensor_core_dumps holds 5,000 random D = A·B + C samples per (GPU, input format),
measured on V100, A100 and H100 (its README gives the source, licence and layout: FP32 bit
patterns as uint32). Each row is one dot product; here all rows of a file run as one batched mma
call, a (5000, 1, K) times b (5000, K, 1). A missing file or array fails: it never skips.
"""
import ml_dtypes
import numpy as np
import pytest

import mpt

MODELS = {"V100": "volta", "A100": "ampere", "H100": "hopper"}
DTYPES = {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "tf32": np.float32}
FILES = [f"{gpu}_{fmt}" for gpu in MODELS for fmt in DTYPES if (gpu, fmt) not in
         {("V100", "bf16"), ("V100", "tf32")}]
#: K per row: the products of one hardware block (H100's TF32 block of 8 holds 4 and zeros).
K = {"V100": {"fp16": 4}, "A100": {"fp16": 8, "bf16": 8, "tf32": 4},
     "H100": {"fp16": 16, "bf16": 16, "tf32": 4}}


def _outputs(fmt):
    """The output formats measured per input format: FP16 output only with FP16 inputs."""
    return ("fp32", "fp16") if fmt == "fp16" else ("fp32",)


def _load(folder, name):
    """Every array of one sample file, checked against the layout of the folder's README."""
    path = folder / f"{name}.npz"
    if not path.is_file():
        pytest.fail(f"{path} is missing from the hardware samples")
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    gpu, fmt = name.split("_")
    assert set(arrays) == {"a", "b", "c", *(f"d_{out}" for out in _outputs(fmt))}, path
    assert arrays["a"].shape == arrays["b"].shape == (5000, K[gpu][fmt]), path
    assert all(v.dtype == np.uint32 for v in arrays.values()), path
    return arrays


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
    for out in _outputs(fmt):
        key = f"d_{out}"
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


def test_the_folder_holds_every_sample_file_and_its_licence(tensor_core_dumps):
    assert sorted(p.stem for p in tensor_core_dumps.glob("*.npz")) == sorted(FILES)
    licence = (tensor_core_dumps / "LICENSE").read_text()
    assert "BSD 2-Clause" in licence and "Faizan A. Khattak and Mantas Mikaitis" in licence
    assert "b12b5a70" in (tensor_core_dumps / "README.md").read_text()  # the source's commit


def test_a_missing_sample_file_fails_instead_of_skipping(tmp_path):
    with pytest.raises(pytest.fail.Exception, match="missing from the hardware samples"):
        _load(tmp_path, "V100_fp16")
