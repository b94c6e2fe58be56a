"""L1: counter-based random words (Philox4x32-10).

Philox4x32-R (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC'11)
maps a 128-bit counter ``(c0, c1, c2, c3)`` and a 64-bit key ``(k0, k1)`` to four 32-bit words
through R = 10 rounds of

    (hi0, lo0) = M0 * c0        (hi1, lo1) = M1 * c2        (64-bit products of 32-bit words)
    (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)
    (k0, k1) <- (k0 + W0, k1 + W1) mod 2^32                  (Weyl key schedule between rounds)

with M0 = 0xD2511F53, M1 = 0xCD9E8D57, W0 = 0x9E3779B9 (golden ratio), W1 = 0xBB67AE85 (sqrt 3).
Checked against the Random123 known-answer vectors (``tests/test_random.py``).

mpt's stream layout: ``seed`` (64 bits) is the key; the counter is ``(j_lo, j_hi, stream_lo,
stream_hi)`` for block ``j``; element ``i`` of a stream takes word ``i % 4`` of block ``i // 4``.
So word ``i`` depends only on ``(seed, stream, i)``: any split of the index range over threads
gives the same words.

Also here: :func:`lfsr_fill`, the 32-bit Galois LFSR that Habana's MME reference model steps per
lane of its stochastic-rounding output conversion (``state >>= 1``, then ``state ^= polynomial``
when the bit shifted out was 1). With a primitive polynomial (e.g. 0x80200003, taps 32, 22, 2, 1)
a lane visits every non-zero 32-bit value once per period of 2^32 - 1 steps.
"""
import numpy as np
from numba import njit, prange

from mpt._checks import check_int

__all__ = ["philox4x32", "philox_block", "philox_word", "fill_words", "split64", "random_words",
           "lfsr_fill", "BLOCK", "CHUNK"]

_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_LO32 = np.uint64(0xFFFFFFFF)
_32 = np.uint64(32)
_ROUNDS = 10
CHUNK = _CHUNK = 1 << 14  # elements per parallel task (a multiple of 4: no block straddles two)
BLOCK = 4         # words per Philox call


@njit(cache=True, inline="always")
def philox4x32(c0, c1, c2, c3, k0, k1):
    """Philox4x32-10 of counter (c0..c3) under key (k0, k1); all uint64 holding 32-bit words."""
    for _ in range(_ROUNDS):
        p0 = _M0 * c0  # (hi0, lo0), exact: both factors < 2^32
        p1 = _M1 * c2  # (hi1, lo1)
        c0, c1, c2, c3 = (p1 >> _32) ^ c1 ^ k0, p1 & _LO32, (p0 >> _32) ^ c3 ^ k1, p0 & _LO32
        k0 = (k0 + _W0) & _LO32
        k1 = (k1 + _W1) & _LO32
    return c0, c1, c2, c3


@njit(cache=True, inline="always")
def philox_block(key, stream, block):
    """The four words of ``block`` (int64 >= 0) in the stream; key/stream: uint64 pairs (lo, hi)."""
    j = np.uint64(block)
    return philox4x32(j & _LO32, j >> _32, stream[0], stream[1], key[0], key[1])


@njit(cache=True)
def philox_word(key, stream, index):
    """Word ``index`` of the stream (a whole Philox call per word: use it for scattered indices,
    :func:`philox_block` for runs). ``key``, ``stream``: ``split64(seed)``, ``split64(stream)``."""
    w = philox_block(key, stream, index // BLOCK)
    return np.uint32(w[index % BLOCK])


def split64(value, name="seed"):
    """A 64-bit non-negative int as the uint64 pair (lo 32 bits, hi 32 bits) the kernels take."""
    value = check_int(name, value, min=0, max=2**64 - 1)
    return np.uint64(value & 0xFFFFFFFF), np.uint64(value >> 32)


@njit(cache=True)
def fill_words(out, key, stream, first_block):
    """out[i] = word (4 * first_block + i) of the stream; straight-line over whole blocks."""
    full = out.size // BLOCK
    for j in range(full):
        w0, w1, w2, w3 = philox_block(key, stream, first_block + j)
        out[BLOCK * j] = np.uint32(w0)
        out[BLOCK * j + 1] = np.uint32(w1)
        out[BLOCK * j + 2] = np.uint32(w2)
        out[BLOCK * j + 3] = np.uint32(w3)
    if full * BLOCK < out.size:  # a ragged end
        w = philox_block(key, stream, first_block + full)
        for k in range(out.size - full * BLOCK):
            out[full * BLOCK + k] = np.uint32(w[k])


@njit(cache=True, parallel=True)
def _fill_words(out, key, stream):
    n = out.size
    for t in prange((n + _CHUNK - 1) // _CHUNK):
        lo = t * _CHUNK
        fill_words(out[lo:min(n, lo + _CHUNK)], key, stream, lo // BLOCK)


def random_words(seed, stream, n):
    """Words ``0..n-1`` of the Philox stream ``(seed, stream)`` as a uint32 array of shape (n,).

    Same (seed, stream, n), same words, on any machine and any Numba thread count.
    """
    out = np.empty(check_int("n", n, min=0), np.uint32)  # (n,)
    _fill_words(out, split64(seed, "seed"), split64(stream, "stream"))
    return out


@njit(cache=True)
def lfsr_fill(out, states, polynomial):
    """out[i] = the state of lane i % L (L = states.size), which then steps once (Galois LFSR).

    out: (n,) uint32; states: (L,) uint32, in: each lane's state, out: its state after the call
    (so a next call continues the sequences); polynomial: the uint32 tap mask. Element i thus
    gets step i // L of its lane: serial and cheap (one shift and one xor per word).
    """
    lanes = states.size
    for i in range(out.size):
        lane = i % lanes
        s = states[lane]
        out[i] = s
        states[lane] = (s >> np.uint32(1)) ^ (polynomial if s & np.uint32(1) else np.uint32(0))
