"""Planning calculators against the checks of techniques.md §5 and amp.md §5."""
import math

import pytest

from mpt.planning import (CHINCHILLA, EPOCH_AI, activation_bytes_per_layer,
                          state_bytes_per_parameter)

GOPHER_FLOPS = 5.76e23


def test_chinchilla_loss_at_70b():
    # E + A/N^α + B/D^β = 1.69 + 0.2218... + 0.0247... (spec: 1.9366 with rounded constants)
    assert round(CHINCHILLA.loss(70e9, 1.4e12), 4) == 1.9366


def test_compute_optimal_splits():
    n, d = CHINCHILLA.compute_optimal(GOPHER_FLOPS)
    assert round(n / 1e10, 1) == 3.2           # spec: N_opt ≈ 3.2e10 with the rounded constants
    assert math.isclose(6 * n * d, GOPHER_FLOPS, rel_tol=1e-12)  # C = 6·N·D holds exactly
    n, d = EPOCH_AI.compute_optimal(GOPHER_FLOPS)
    assert round(n / 1e10, 1) == 7.2 and round(d / n, 1) == 18.4


@pytest.mark.parametrize("law", [CHINCHILLA, EPOCH_AI], ids=lambda l: l.name)
def test_optimal_split_is_a_minimum(law):
    n, d = law.compute_optimal(1e22)
    best = law.loss(n, d)
    for f in (0.9, 1.1):  # moving along C = 6ND in either direction costs loss
        assert law.loss(n * f, d / f) > best


@pytest.mark.parametrize("law", [CHINCHILLA, EPOCH_AI], ids=lambda l: l.name)
def test_budget_for_loss_inverts_optimal_loss(law):
    for flops in (1e18, 1e21, GOPHER_FLOPS, 1e26):
        target = law.optimal_loss(flops)
        assert math.isclose(law.budget_for_loss(target), flops, rel_tol=1e-9)
    with pytest.raises(ValueError, match="target must exceed the irreducible loss"):
        law.budget_for_loss(law.E)


def test_zero_accounting_16_bytes():
    mixed = state_bytes_per_parameter("fp16", master_format="fp32", optimizer="adam")
    assert mixed == {"weights": 2, "grads": 2, "master": 4, "optimizer": 8, "total": 16}
    assert state_bytes_per_parameter("fp32", optimizer="adam")["total"] == 16
    assert state_bytes_per_parameter("bf16", optimizer="sgd")["total"] == 4
    # amp.md §5: 1e9 params -> 4 GB fp32 weights; 2 GB fp16 copy + 4 GB master = 6 GB.
    p = state_bytes_per_parameter("fp16", master_format="fp32")
    assert 1e9 * (p["weights"] + p["master"]) == 6e9


def test_activation_memory_korthikanti():
    s, b, h, a = 2048, 1, 4096, 32
    assert activation_bytes_per_layer(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert activation_bytes_per_layer(s, b, h, a, "full") == 2 * s * b * h
    assert activation_bytes_per_layer(s, b, h, a, "selective") == 34 * s * b * h
    with pytest.raises(ValueError, match="recompute must be"):
        activation_bytes_per_layer(s, b, h, a, "half")
    with pytest.raises(ValueError, match="seq_len must be positive"):
        activation_bytes_per_layer(0, b, h, a)
