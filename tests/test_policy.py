"""mpt.Policy / mpt.get_policy: jmp's grammar, casts over tensors, module-level policies."""
import ml_dtypes
import numpy as np
import pytest

import mpt
import mpt.functional as F
from mpt import nn
from mpt.nn.policy import Policy, get_policy
from mpt.testing import as_bits as _bits

F32, BF16, F16, F64 = (mpt.get_format(n) for n in ("fp32", "bf16", "fp16", "fp64"))


# ---- grammar ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    # jmp's own examples (jmp/_src/policy.py comments): unset params is f32, compute follows
    # params, output follows compute.
    ("c=f16", (F32, F16, F16)),
    ("p=f16,c=f16", (F16, F16, F16)),
    ("p=f16,c=bf16", (F16, BF16, BF16)),
    ("p=f32,c=bf16,o=f32", (F32, BF16, F32)),
    ("params=float32,compute=bfloat16,output=float32", (F32, BF16, F32)),
    ("p=bf16", (BF16, BF16, BF16)),
    ("o=f16", (F32, F32, F16)),
    ("p=f64,o=full", (F64, F64, F32)),
    ("c=half", (F32, F16, F16)),
    ("c=f16,c=bf16", (F32, BF16, BF16)),       # a repeated key keeps its last value (jmp)
    # a bare name sets all three
    ("f32", (F32, F32, F32)), ("float32", (F32, F32, F32)), ("full", (F32, F32, F32)),
    ("bf16", (BF16, BF16, BF16)), ("bfloat16", (BF16, BF16, BF16)),
    ("f16", (F16, F16, F16)), ("float16", (F16, F16, F16)), ("half", (F16, F16, F16)),
    ("f64", (F64, F64, F64)), ("float64", (F64, F64, F64)),
])
def test_grammar(text, expected):
    p = get_policy(text)
    assert (p.param_format, p.compute_format, p.output_format) == expected
    assert get_policy(str(p)) == p  # str() prints a policy the grammar reads back


def test_str():
    assert str(get_policy("c=bfloat16")) == "p=f32,c=bf16,o=bf16"
    assert str(get_policy("half")) == "p=f16,c=f16,o=f16"


@pytest.mark.parametrize("text, names", [
    ("x=f32", ["'x'", "p|params"]),
    ("p=f32,q=bf16", ["'q'"]),
    ("p=f33", ["'f33'", "'p'"]),
    ("c=fp16", ["'fp16'", "'c'"]),           # mpt's canonical name, but not a jmp name
    ("F32", ["'F32'"]),                      # matching is exact, as in jmp
    ("p=f32, c=bf16", ["' c'"]),              # spaces are not stripped, as in jmp
    ("p=f32,", ["''"]),
    ("p=f32=bf16", ["'p=f32=bf16'"]),
    ("p=fp8_e4m3fn", ["'fp8_e4m3fn'"]),
    ("", ["''"]),
])
def test_grammar_errors_name_the_bad_part(text, names):
    with pytest.raises(ValueError) as err:
        get_policy(text)
    for name in names:
        assert name in str(err.value)


def test_get_policy_rejects_non_strings():
    with pytest.raises(TypeError, match="policy must be a str"):
        get_policy(F32)


def test_policy_is_frozen_and_parses_format_names():
    p = Policy("fp32", "bf16", "fp32")
    assert p == get_policy("p=f32,c=bf16,o=f32")
    with pytest.raises(AttributeError):
        p.param_format = F16
    with pytest.raises(ValueError, match="compute_format must be one of"):
        Policy("fp32", "fp8_e4m3fn", "fp32")
    assert p.with_output_format("bf16") == get_policy("c=bf16")


# ---- casts over tensors -------------------------------------------------------------------

def test_cast_rounds_nearest_even_through_tensor_to():
    # 1 + 2^-8 is a tie between bf16 neighbours 1 and 1 + 2^-7: RNE picks the even 1.0;
    # 1 + 3·2^-9 is above the tie and rounds up.
    x = mpt.tensor(np.array([1 + 2.0**-8, 1 + 3 * 2.0**-9, -(1 + 2.0**-8)], np.float32))
    y = get_policy("c=bf16").cast_to_compute(x)
    assert y.format == BF16
    np.testing.assert_array_equal(
        y.data.astype(np.float32), np.array([1.0, 1 + 2.0**-7, -1.0], np.float32))
    np.testing.assert_array_equal(_bits(y), _bits(x.to("bf16")))


def test_cast_walks_trees_and_skips_integers_and_same_format():
    p = get_policy("p=f32,c=f16,o=f32")
    ids = mpt.tensor(np.array([1, 2], np.int8), format="int8")
    x = mpt.tensor(np.array([0.1, 3.0], np.float32))
    tree = {"a": (x, ids), "b": [x, 3.5, "text"]}
    out = p.cast_to_compute(tree)
    assert out["a"][0].format == F16 and out["b"][0].format == F16
    assert out["a"][1] is ids                # integer tensors pass through
    assert out["b"][1:] == [3.5, "text"]      # non-tensor leaves pass through
    assert isinstance(out["a"], tuple) and isinstance(out["b"], list)
    assert p.cast_to_param(x) is x           # already fp32: the same tensor, no copy
    back = p.cast_to_output(out["a"][0])
    assert back.format == F32
    assert back.data.dtype == np.float32
    # fp32 -> fp16 -> fp32: 0.1 becomes the fp16 nearest 0.1 (0x2E66 = 0.0999755859375)
    assert back.data[0] == np.float32(np.float16(0.1))


def test_cast_is_differentiable_and_grad_rounds_to_the_source_format():
    x = mpt.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    y = get_policy("c=bf16").cast_to_compute(x)
    y.backward(mpt.tensor(np.array([1 + 2.0**-7, 3.0], ml_dtypes.bfloat16), format="bf16"))
    assert x.grad.format == F32
    np.testing.assert_array_equal(x.grad.data, np.array([1 + 2.0**-7, 3.0], np.float32))


# ---- module-level policies (mpt.nn.Module.set_policy) -------------------------------------
def _x(shape, seed=0):
    return mpt.tensor(np.random.default_rng(seed).standard_normal(shape), "fp32")


def test_policy_on_a_linear_casts_inputs_params_and_outputs():
    lin = nn.Linear(8, 4, seed=1).set_policy("p=f32,c=bf16,o=f32")
    assert lin.weight.format == F32                       # params stay in param_format
    x = _x((3, 8))
    y = lin(x)
    assert y.format == F32
    expected = F.linear(x.to("bf16"), lin.weight.to("bf16"), lin.bias.to("bf16")).to("fp32")
    np.testing.assert_array_equal(_bits(y), _bits(expected))
    y.sum().backward()
    # the weight's gradient comes through its bf16 cast: a bf16 GEMM result, exact in fp32
    assert lin.weight.grad.format == F32
    g = lin.weight.grad.data
    np.testing.assert_array_equal(g, g.astype(ml_dtypes.bfloat16).astype(np.float32))
    lin.set_policy(None)
    np.testing.assert_array_equal(_bits(lin(x)), _bits(F.linear(x, lin.weight, lin.bias)))


def test_policy_param_format_rounds_the_stored_parameters_now():
    lin = nn.Linear(8, 4, seed=1)
    w32 = lin.weight.numpy()
    lin.set_policy(get_policy("p=bf16,c=bf16,o=f32"))
    assert lin.weight.format == BF16 and lin.bias.format == BF16
    np.testing.assert_array_equal(lin.weight.data, mpt.round(w32, "bf16"))
    assert lin(_x((2, 8))).format == F32


def test_a_child_policy_overrides_the_parents():
    # bf16 compute everywhere, but the norm computes in fp32 from fp32 parameters and hands bf16
    # back to the next layer (the usual "keep norms in fp32" recipe, in jmp's grammar).
    model = nn.Sequential(nn.Linear(8, 8, seed=1), nn.LayerNorm(8), nn.Linear(8, 2, seed=2))
    model[1].set_policy("p=f32,c=f32,o=bf16")
    seen = {}
    original = nn.LayerNorm.forward

    def spy(self, x):
        seen["in"] = x.format
        return original(self, x)

    object.__setattr__(model[1], "forward", spy.__get__(model[1]))
    model.set_policy("p=bf16,c=bf16,o=f32")
    assert model[0].weight.format == BF16 and model[2].weight.format == BF16
    assert model[1].weight.format == F32                    # its own policy's param format
    y = model(_x((3, 8)))
    assert seen["in"] == F32 and y.format == F32
    y.sum().backward()
    assert model[1].weight.grad.format == F32 and model[0].weight.grad.format == BF16


def test_policy_on_gpt():
    g = nn.GPT(16, 16, 1, 2, 8, seed=0).set_policy("p=f32,c=bf16,o=f32")
    idx = np.random.default_rng(0).integers(0, 16, (2, 8))
    logits = g(idx)
    assert logits.format == F32                              # integer ids pass through
    g.loss(idx, idx).backward()
    assert all(p.format == F32 and p.grad.format == F32 for p in g.parameters())
    with pytest.raises(ValueError, match="unknown key"):
        g.set_policy("q=f32")
