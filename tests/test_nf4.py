"""NF4 (QLoRA) storage: the 16 levels, nearest-level codes with the stated tie rule, packing,
blockwise absmax, and double quantization of the absmax within its derived bound."""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import mpt.quant as Q
from mpt.formats import get_format
from mpt.kernels import quant as K
from mpt.reference.quant import (blockwise_absmax_reference, dynamic_map_reference,
                                 nearest_level_reference)
from mpt.testing import assert_bits_equal

F32 = np.float32
LEVELS = np.array(get_format("nf4").levels, np.float32)
# the table of QLoRA / bitsandbytes (docs/techniques.md §4), as decimal literals
SPEC = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]
# bitsandbytes' dQuantizeNF4 thresholds (float32 literals in its decision tree), ascending
BNB_THRESHOLDS = [-0.8480964004993439, -0.6106329262256622, -0.4599952697753906,
                  -0.33967943489551544, -0.23460740596055984, -0.13791173323988914,
                  -0.045525018125772476, 0.03979014977812767, 0.1202552504837513,
                  0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                  0.5016634166240692, 0.6427869200706482, 0.8614784181118011]


def test_sixteen_levels_exactly():
    assert LEVELS.size == 16 and (np.diff(LEVELS) > 0).all()
    assert_bits_equal(LEVELS, np.array(SPEC, np.float32))
    assert all(float(F32(v)) == v for v in SPEC)          # the decimal strings are float32 values


def test_every_level_round_trips():
    # one block per level: x = fl32(level·a) next to a (pinning absmax = a) encodes to that level
    # and decodes to fl32(level·a) = x again, whatever a is
    for a in (F32(1.0), F32(0.75), F32(2.0**-20), F32(3e38), F32(1e-38)):
        x = np.zeros(16 * 64, np.float32)
        x[0::64] = a
        x[1::64] = LEVELS * a                                              # (16,)
        w = Q.nf4_quantize(x)
        assert Q.unpack_nibbles(w.packed, x.size)[1::64].tolist() == list(range(16))
        assert_bits_equal(Q.nf4_dequantize(w)[1::64], x[1::64])
        assert_bits_equal(w.absmax, np.full(16, a, np.float32))


def test_level_codes_and_decoding_for_unit_absmax():
    codes = K.codebook_encode(LEVELS, Q.nf4_decision_points())
    assert codes.tolist() == list(range(16))


def test_ties_go_to_the_lower_level():
    mids = Q.nf4_decision_points()
    exact = [m for m in mids if float(F32(m)) == m]      # midpoints that are float32 numbers
    assert len(exact) == 6
    for m in exact:
        k = int(np.searchsorted(mids, m))
        assert K.codebook_encode(np.array([m], np.float32), mids)[0] == k          # lower level
        assert nearest_level_reference(m, LEVELS) == k
        up = np.nextafter(F32(m), F32(2))
        assert K.codebook_encode(np.array([up], np.float32), mids)[0] == k + 1


def test_bitsandbytes_rule_uses_its_float32_thresholds():
    assert_bits_equal(Q.nf4_decision_points("bitsandbytes").astype(np.float32),
                      np.array(BNB_THRESHOLDS, np.float32))
    # it differs from the nearest rule exactly at the float32 midpoints that rounded up
    t = np.array(BNB_THRESHOLDS, np.float32)
    mids = Q.nf4_decision_points()
    rounded_up = t[t.astype(np.float64) > mids]
    assert rounded_up.size == 6
    near = K.codebook_encode(rounded_up, mids)
    bnb = K.codebook_encode(rounded_up, Q.nf4_decision_points("bitsandbytes"))
    assert (near == bnb + 1).all()
    for v, c in zip(rounded_up, near):
        assert nearest_level_reference(float(v), LEVELS) == c


@given(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=200))
def test_nearest_level_random_equals_oracle(bits):
    # |x| < 2: every positive float32 below 2 and its negative
    x = (np.array(bits, np.uint32) % np.uint32(0x40000000)).view(np.float32)
    x = np.concatenate([x, -x])
    codes = K.codebook_encode(x, Q.nf4_decision_points())
    assert codes.tolist() == [nearest_level_reference(float(v), LEVELS) for v in x]


@pytest.mark.parametrize("n", [64, 200, 1, 129])
def test_blockwise_quantization_equals_oracle(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * rng.choice([1e-3, 1.0, 50.0], n)).astype(np.float32)
    x[:min(n, 3)] = 0.0
    w = Q.nf4_quantize(x)
    codes_ref, absmax_ref, deq_ref = blockwise_absmax_reference(x, 64, LEVELS)
    assert np.array_equal(Q.unpack_nibbles(w.packed, n), codes_ref)
    assert_bits_equal(w.absmax, absmax_ref)
    assert_bits_equal(Q.nf4_dequantize(w), deq_ref)


def test_zero_block_decodes_to_plus_zero():
    w = Q.nf4_quantize(np.zeros(64, np.float32))
    assert w.absmax.tolist() == [0.0]
    assert_bits_equal(Q.nf4_dequantize(w), np.zeros(64, np.float32))


def test_packing_two_codes_per_byte_high_nibble_first():
    codes = np.array([1, 2, 15, 0, 7], np.uint8)
    packed = Q.pack_nibbles(codes)
    assert packed.tolist() == [0x12, 0xF0, 0x70]
    assert Q.unpack_nibbles(packed, 5).tolist() == codes.tolist()
    every = np.arange(256, dtype=np.uint16)
    pairs = np.stack([every >> 4, every & 15], axis=1).ravel().astype(np.uint8)
    assert Q.pack_nibbles(pairs).tolist() == list(range(256))
    with pytest.raises(ValueError, match="4-bit"):
        Q.pack_nibbles([16])


def test_storage_size():
    x = np.ones(64 * 256 * 4, np.float32)
    plain, dq = Q.nf4_quantize(x), Q.nf4_quantize(x, double_quant=True)
    assert plain.nbytes * 8 / x.size == 4 + 32 / 64                      # 4.5 bits/param
    assert dq.nbytes * 8 / x.size == 4 + 8 / 64 + (4 * 32 + 32) / x.size  # 4.127 + the mean


def test_dynamic_map_equals_oracle_and_its_gaps():
    table = Q.dynamic_map()
    assert_bits_equal(table, dynamic_map_reference())
    assert table.size == 256 and table[-1] == 1.0 and table[0] == F32(-0.99296875)
    assert np.count_nonzero(table == 0) == 1
    # exact half-gaps are <= 0.9/128; each float32 entry (< 1) is within 2^-25 of its exact value
    half_gaps = np.diff(table.astype(np.float64)) / 2
    assert 0.00703125 < half_gaps.max() <= 0.00703125 + 2.0**-25


def test_double_quant_error_within_bound():
    """|a' − a| <= A2·(h + 2^-20) + 2^-24·|a'|, h = 0.00703125 the largest half-gap of the map,
    A2 = max |a − mean| of the absmax's 256-block. Derivation (u = 2^-24): c = fl32(a − m) errs by
    u·|c|; c_n = fl32(c·fl32(1/A2)) by 2.0001u; the code value v is within h + 2^-25 + 2^-22 of c_n
    (float32 table entries err by 2^-25; c_n may pass ±1 by 2^-22, and the bottom level is
    −0.99296875); fl32(v·A2) errs by u·A2, the final + m by u·|a'|: total
    A2·(h + 2^-25 + 2^-22 + 4.0001u) + u·|a'| <= A2·(h + 2^-20) + u·|a'|."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal(64 * 700)
         * np.repeat(rng.lognormal(0, 1.5, 700), 64)).astype(np.float32)
    plain = Q.nf4_quantize(x)
    dq = Q.nf4_quantize(x, double_quant=True)
    a, a2 = plain.absmax.astype(np.float64), dq.block_absmax().astype(np.float64)
    m = np.float32(math.fsum(a) / a.size)
    centered = (plain.absmax - m).astype(np.float64)
    blocks = np.repeat(np.maximum.reduceat(np.abs(centered), np.arange(0, a.size, 256)),
                       256)[:a.size]
    bound = blocks * (0.00703125 + 2.0**-20) + 2.0**-24 * np.abs(a2)
    assert (np.abs(a2 - a) <= bound).all()
    assert np.abs(a2 - a).max() > 0                         # it is a lossy code
    # the codes themselves are the nearest dynamic-map values of the normalized centered absmax
    table = Q.dynamic_map()
    _, ref_absmax2, _ = blockwise_absmax_reference(plain.absmax - m, 256, table)
    assert_bits_equal(dq.absmax_scale, ref_absmax2)
    codes_ref, _, _ = blockwise_absmax_reference(plain.absmax - m, 256, table)
    assert np.array_equal(dq.absmax_codes, codes_ref)


def test_bad_input():
    with pytest.raises(TypeError, match="float32"):
        Q.nf4_quantize(np.zeros(4))
    with pytest.raises(ValueError, match="finite"):
        Q.nf4_quantize(np.array([np.nan], np.float32))
    with pytest.raises(ValueError, match="rule"):
        Q.nf4_decision_points("floor")
