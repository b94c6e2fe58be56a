"""Intel Neural Compressor's FP8 scales for Gaudi (mpt.amp.inc), on directed values.

INC (neural_compressor/torch/algorithms/fp8_quant/_core): scale = maxabs / (fullscale · backoff)
(fp_utils.calc_maxabs_scale) in float32, then rounded (scale_methods/round_scales_function.py):
POW2 = 2^ceil(log2 s); HW_ALIGNED = POW2, then 2^(ceil(log2(s)/F)·F) with F = 4 on Gaudi 2 and
1 on Gaudi 3, clamped to the hardware-aligned set of fp_utils (2^(7-b) over INC's E4M3 biases).
"""
import numpy as np
import pytest

from mpt.amp import inc
from mpt.engines import gaudi


def test_fullscale():
    """Gaudi 2 E4M3: 240 (max of E4M3 at bias 7 with Inf; INC reads it as float8_e4m3fnuz's),
    times 2^(7-b) at bias b; Gaudi 3 E4M3: 448 (float8_e4m3fn); E5M2: 57344 · 2^(15-b)."""
    assert inc.fullscale("gaudi2") == 240.0
    assert inc.fullscale("gaudi2", "e4m3", 3) == 3840.0
    assert inc.fullscale("gaudi2", "e4m3", 15) == 0.9375
    assert inc.fullscale("gaudi3") == 448.0
    assert inc.fullscale("gaudi3", "e5m2") == inc.fullscale("gaudi2", "e5m2") == 57344.0
    assert inc.fullscale("gaudi3", "e5m2", 20) == 1792.0
    assert inc.fullscale("gaudi2", "e4m3", 7) == gaudi.fp8_format("gaudi2", "e4m3").max


def test_hw_aligned_scale_sets():
    """Gaudi 2: biases 3, 7, 11, 15 -> 16, 1, 1/16, 1/256 (powers of 16 in [16^-2, 16]).
    Gaudi 3: INC's biases range(0, 63) -> 2^7 down to 2^-55 (bias 63 is not in INC's set)."""
    assert inc.hw_aligned_scales("gaudi2") == (16.0, 1.0, 1 / 16, 1 / 256)
    g3 = inc.hw_aligned_scales("gaudi3")
    assert g3 == tuple(2.0 ** (7 - b) for b in range(63))


@pytest.mark.parametrize("amax, role, want", [
    (120.0, "weight", 1.0),          # 120/(240·0.5) = 1 exactly: 2^0, a power of 16
    (121.0, "weight", 16.0),         # 1.008 -> pow2 2 -> next power of 16: 16
    (1920.0, "weight", 16.0),        # 16
    (1921.0, "weight", 16.0),        # 16.008 -> 32 -> 256 -> clamped to 16
    (60.0, "activation", 1.0),       # 60/(240·0.25) = 1
    (0.5, "activation", 1 / 16),     # 1/120 -> 2^-6 -> 2^-4 (ceil(-6/4)·4 = -4)
    (1e-30, "activation", 1 / 256),  # -> clamped to 16^-2
    (0.0, "weight", 1 / 256),        # log2 0 = -inf: INC's clamp gives the minimum
    (np.inf, "weight", 16.0),
])
def test_maxabs_hw_gaudi2(amax, role, want):
    x = np.array([[0.0, -amax], [amax / 3, 0.0]], np.float32)
    s = inc.maxabs_hw(x, chip="gaudi2", role=role)
    assert s.dtype == np.float32 and s == np.float32(want)


@pytest.mark.parametrize("amax, role, want", [
    (224.0, "weight", 1.0),          # 224/(448·0.5) = 1
    (225.0, "weight", 2.0),          # any power of two on Gaudi 3
    (112.0, "activation", 1.0),      # 112/(448·0.25) = 1
    (0.75, "activation", 2.0**-7),   # 0.75/112 = 0.0067 -> 2^-7
    (1e9, "weight", 128.0),          # clamped to 2^7
    (1e-30, "weight", 2.0**-55),     # clamped to 2^-55
])
def test_maxabs_hw_gaudi3(amax, role, want):
    s = inc.maxabs_hw(np.array([amax], np.float32), chip="gaudi3", role=role)
    assert s == np.float32(want)


def test_maxabs_pow2_and_nan():
    """MAXABS_POW2 stops at the power of two: 121 -> 2 (MAXABS_HW: 16); NaN propagates."""
    x = np.array([121.0], np.float32)
    assert inc.maxabs_pow2(x, chip="gaudi2", role="weight") == 2.0
    assert inc.maxabs_pow2(np.array([61.0], np.float32), chip="gaudi2", role="activation") == 2
    assert inc.maxabs_pow2(np.array([59.0], np.float32), chip="gaudi2", role="activation") == 1
    assert inc.maxabs_pow2(np.array([0.0], np.float32), chip="gaudi2", role="weight") == 0.0
    assert np.isnan(inc.maxabs_hw(np.array([1.0, np.nan], np.float32), chip="gaudi2",
                                    role="weight"))


def test_scale_division_and_log2_rounding():
    """maxabs = 1920 + 2^-13 (the float32 after 1920): f32(maxabs / 120) = 16·(1 + 2^-23)
    (the quotient 16 + 2^-13/120 is nearer 16 + 2^-19 than 16). Exactly, ceil(log2) gives 32;
    log2 rounded to float32 (4 + 1.7e-7 -> 4.0: half an ulp of 4 is 2.4e-7) gives 16."""
    amax = np.nextafter(np.float32(1920), np.float32(np.inf))
    s = inc.scale_from_maxabs(amax, chip="gaudi2", backoff=0.5)
    assert s == np.float32(16 * (1 + 2.0**-23))
    x = np.array([amax], np.float32)
    assert inc.maxabs_pow2(x, chip="gaudi2", role="weight") == 32.0
    assert inc.maxabs_pow2(x, chip="gaudi2", role="weight", log2_rounding="float32") == 16.0
    with pytest.raises(ValueError, match="log2_rounding"):
        inc.maxabs_pow2(x, chip="gaudi2", role="weight", log2_rounding="bf16")


def test_per_channel_and_unit_scale():
    """axis = the channel axis: maxabs over the others. Rows 120, 121, 1/256: 1, 16, 1/256."""
    w = np.array([[120.0, -3.0], [-121.0, 0.0], [2.0**-8, 0.0]], np.float32)
    assert inc.maxabs_hw(w, chip="gaudi2", role="weight", axis=0).tolist() == [1, 16, 1 / 256]
    assert inc.maxabs_pow2(w, chip="gaudi2", role="weight", axis=0).tolist() == \
        [1, 2, 2.0**-14]                                       # 2^-8/120 -> 2^-14
    assert inc.maxabs(w, axis=1).tolist() == [121, 3]                   # per column
    assert inc.unit_scale(w) == 1.0
    assert inc.unit_scale(w, axis=-1).tolist() == [1.0, 1.0]


def test_scale_method_table():
    """INC's named methods: backoffs 0.5 (weights) / 0.25 (activations) for the maxabs ones."""
    m = inc.INC_SCALE_METHODS
    assert m["maxabs_hw"] == {"weight": ("tensor", "hw_aligned", 0.5),
                              "activation": ("tensor", "hw_aligned", 0.25)}
    assert m["maxabs_pow2"]["weight"] == ("tensor", "pow2", 0.5)
    assert m["unit_scale"]["activation"][1] == "unit"
    assert inc.INC_BACKOFFS == {"weight": 0.5, "activation": 0.25}
    with pytest.raises(ValueError, match="role"):
        inc.maxabs_hw(np.ones(2, np.float32), chip="gaudi2", role="bias")
    with pytest.raises(ValueError, match="method"):
        inc.round_scale(1.0, chip="gaudi2", method="pow4")
