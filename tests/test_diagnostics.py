"""mpt.diagnostics: cast classes, binade histograms and training records on hand-counted arrays."""
import json

import numpy as np
import pytest

import mpt
from mpt.amp import GradScaler
from mpt.autograd.tensor import Tensor
from mpt.nn import Parameter
from mpt.optim import SGD, CopyDownStats
from mpt.train.diagnostics import (CastStats, cast_stats, first_non_finite, log2_histogram,
                                   lost_update_fraction, scale_trajectory, tensor_cast_stats)

F32 = np.float32


def _case(rows):
    """(float32 array, expected counts) from (value, class) rows; classes: zero, underflow,
    subnormal, normal, overflow, nonfinite."""
    x = np.array([v for v, _ in rows], dtype=F32)
    classes = [c for _, c in rows]
    return x, {c: classes.count(c) for c in ("underflow", "subnormal", "overflow", "nonfinite")}, \
        sum(c in ("underflow", "subnormal", "normal", "overflow") for c in classes)


FP16_ROWS = [
    (0.0, "zero"), (-0.0, "zero"),
    (2.0**-26, "underflow"),
    (-(2.0**-25), "underflow"),              # the tie between 0 and 2^-24 goes to even: 0
    (1.5 * 2.0**-25, "subnormal"),           # above the tie: 2^-24
    (2.0**-24, "subnormal"),
    (2.0**-14 - 2.0**-24, "subnormal"),      # the largest subnormal
    (2.0**-14, "normal"),                    # the smallest normal
    (65504.0, "normal"),
    (65519.0, "normal"),                     # below the tie 65520: rounds to 65504
    (65520.0, "overflow"),                   # the tie: rounds to even = Inf
    (-1e30, "overflow"),
    (np.inf, "nonfinite"), (np.nan, "nonfinite"),
]
BF16_ROWS = [
    (2.0**-134, "underflow"),                # tie between 0 and 2^-133 (bf16's smallest)
    (2.0**-133, "subnormal"),
    (2.0**-127, "subnormal"),
    (2.0**-126, "normal"),
    (3.0e38, "normal"),                      # bf16 max is 0x1.fep127 = 3.39e38
    (float.fromhex("0x1.fffffep127"), "overflow"),
    (1.0, "normal"), (0.0, "zero"),
]
E4M3_ROWS = [
    (2.0**-10, "underflow"),                 # tie between 0 and 2^-9
    (2.0**-9, "subnormal"),
    (2.0**-6, "normal"),
    (460.0, "normal"),                       # rounds to 448
    (500.0, "overflow"),                     # NaN: e4m3fn has no Inf
    (-np.inf, "nonfinite"),
]


@pytest.mark.parametrize("fmt, rows", [("fp16", FP16_ROWS), ("bf16", BF16_ROWS),
                                       ("fp8_e4m3fn", E4M3_ROWS)])
def test_cast_stats_equal_hand_counts(fmt, rows):
    x, expected, nonzero = _case(rows)
    stats = cast_stats(x, fmt)
    assert stats == CastStats(fmt, x.size, nonzero, expected["underflow"], expected["subnormal"],
                              expected["overflow"], expected["nonfinite"])
    assert stats.fraction("underflow") == expected["underflow"] / x.size
    assert stats.underflow_share == expected["underflow"] / nonzero


def test_cast_stats_counts_one_element_each():
    # one value per class, so a swapped class would change two counts
    stats = cast_stats(np.array([2.0**-30, 2.0**-20, 1.0, 1e6, np.nan], F32), "fp16")
    assert (stats.underflow, stats.subnormal, stats.overflow, stats.nonfinite) == (1, 1, 1, 1)
    assert stats.nonzero == 4


def test_cast_stats_of_low_precision_inputs_and_tensors():
    # an fp16 tensor's values cast to e5m2 (min subnormal 2^-16): decoded exactly first
    t = mpt.tensor(np.array([2.0**-20, 2.0**-16, 0.5, 60000.0, 0.0]), "fp16")
    assert cast_stats(t, "fp8_e5m2") == CastStats("fp8_e5m2", 5, 4, 1, 1, 0, 0)
    named = tensor_cast_stats([("a", t), ("b", t.data)], "fp8_e5m2")
    assert named["a"] == named["b"]


def test_cast_stats_add_and_errors():
    a = cast_stats(np.array([2.0**-30], F32), "fp16")
    b = cast_stats(np.array([1.0, np.inf], F32), "fp16")
    assert a + b == CastStats("fp16", 3, 2, 1, 0, 0, 1)
    with pytest.raises(TypeError):
        a + cast_stats(np.array([1.0], F32), "bf16")
    with pytest.raises(ValueError, match="kind"):
        a.fraction("zeros")
    with pytest.raises(ValueError, match="floating"):
        cast_stats(np.ones(2, F32), "int8")
    with pytest.raises(TypeError, match="floating"):
        cast_stats(np.ones(2, np.int32), "fp16")
    assert CastStats("fp16", 0, 0, 0, 0, 0, 0).underflow_share == 0.0


def test_log2_histogram_bins_by_hand():
    x = np.array([0.0, 1.0, 1.5, 2.0, 0.25, -3.0, 2.0**-70, 2.0**20, np.inf, np.nan,
                  np.nextafter(F32(1.0), F32(0))], F32)
    h = log2_histogram(x, lo=-4, hi=4)
    counts = dict(zip(h.exponents, h.counts))
    assert counts == {-4: 0, -3: 0, -2: 1, -1: 1, 0: 2, 1: 2, 2: 0, 3: 0, 4: 0}
    assert (h.below, h.above, h.zeros, h.nonfinite, h.total) == (1, 1, 1, 2, x.size)
    assert h.share_below(-1) == 2 / 8                  # 0.25 and 2^-70 of 8 finite non-zero
    assert h.share_below(0) == 3 / 8                   # plus 1 - 2^-24 (binade -1)
    doubled = h + h
    assert doubled.counts == tuple(2 * c for c in h.counts) and doubled.zeros == 2
    assert json.loads(json.dumps(h.to_dict()))["counts"] == list(h.counts)
    with pytest.raises(TypeError):
        h + log2_histogram(x, lo=-5, hi=4)
    with pytest.raises(ValueError):
        log2_histogram(x, lo=3, hi=2)
    with pytest.raises(ValueError):
        h.share_below(10)


def test_lost_update_fraction_sums_copy_down_stats():
    stats = {"a": CopyDownStats(lost=3, changed=10, numel=12),
             "b": CopyDownStats(lost=1, changed=6, numel=6)}
    assert lost_update_fraction(stats) == (4, 16, 0.25)
    assert lost_update_fraction({}) == (0, 0, 0.0)


def test_scale_trajectory_and_first_overflow_name():
    p = Parameter(np.zeros(2, F32))
    opt = SGD([("w", p)], lr=0.5)
    scaler = GradScaler(init_scale=4.0, record=True)
    for grad in ([1.0, 2.0], [np.inf, 1.0], [1.0, 1.0]):
        scaler.scale(mpt.tensor(1.0))
        p.grad = Tensor(np.array(grad, F32))
        scaler.step(opt)
        scaler.update()
    assert scale_trajectory(scaler) == [
        {"step": 1, "scale": 4.0, "skipped": False, "first_overflow": None},
        {"step": 2, "scale": 4.0, "skipped": True, "first_overflow": "w"},
        {"step": 3, "scale": 2.0, "skipped": False, "first_overflow": None}]
    with pytest.raises(ValueError, match="record=True"):
        scale_trajectory(GradScaler())


def test_first_non_finite():
    ok = np.ones(3, F32)
    assert first_non_finite([("a", ok), ("b", None), ("c", np.array([1, np.nan], F32)),
                             ("d", np.array([np.inf], F32))]) == "c"
    assert first_non_finite([("a", ok), ("t", mpt.tensor([1.0, 2.0], "bf16"))]) is None
