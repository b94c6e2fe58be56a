"""L5: the training data of ``mpt study`` — a synthetic corpus whose best achievable loss is known,
and byte-level text.

**Markov corpus** (:class:`MarkovCorpus`). A first-order Markov chain over ``vocab`` tokens with
transition probabilities ``P[i, j] = w_ij / Σ_j w_ij``, ``w_ij = u_ij^sharpness`` for uniforms
``u`` drawn from mpt's counter-based Philox stream (``mpt.nn.uniform``, key
``"corpus.transitions"``); larger ``sharpness`` concentrates each row on fewer successors. The
stationary distribution ``π`` (``π P = π``) is found by power iteration with exactly rounded sums
(``math.fsum``), so the data are the same bits on every machine. A sequence starts at a token
drawn from ``π`` and follows the chain, so every position's next token has the conditional
distribution ``P[x_t]`` with ``x_t ~ π``: the best achievable expected cross-entropy of a
next-token predictor (the Bayes risk) is the chain's **entropy rate**

    H = −Σ_i π_i Σ_j P[i, j] ln P[i, j]   (nats per token)

reported as :attr:`MarkovCorpus.entropy_rate`; no model can do better on average, and a model
that learned ``P`` exactly reaches it. Sampling is inverse-CDF with Philox uniforms keyed by
``(seed, stream name, batch index)``, so batch ``k`` of a stream is a pure function of ``k``: a
resumed run sees the same data without any loader state.

**Text corpus** (:class:`TextCorpus`): the bytes of a file (vocabulary 256), sequences are windows
at Philox-uniform offsets; its entropy is unknown (``entropy_rate`` is None).
"""
from __future__ import annotations

import math
from itertools import accumulate
from pathlib import Path

import numpy as np

from mpt._checks import check_int
from mpt.nn import uniform

__all__ = ["MarkovCorpus", "TextCorpus"]


def _keyed_uniforms(seed: int, stream: str, index: int, n: int) -> np.ndarray:
    """``n`` float64 uniforms in [0, 1) of batch ``index`` of ``stream`` (Philox, exact)."""
    check_int("index", index, min=0)
    return uniform(seed, f"corpus.{stream}.{index}", n)


class MarkovCorpus:
    """A random first-order Markov chain with a known entropy rate (see the module docstring)."""

    def __init__(self, vocab: int = 32, sharpness: int = 8, seed: int = 0):
        check_int("vocab", vocab, min=2)
        check_int("sharpness", sharpness, min=1)
        self.vocab, self.sharpness, self.seed = int(vocab), int(sharpness), int(seed)
        w = uniform(seed, "corpus.transitions", vocab * vocab).reshape(vocab, vocab) ** sharpness
        self.transitions = w / np.array([[math.fsum(row)] for row in w])            # (V, V)
        self._cdf = np.array([list(accumulate(row)) for row in self.transitions])     # (V, V)
        self.stationary = self._stationary()                                         # (V,)
        self._pi_cdf = np.array(list(accumulate(self.stationary)))

    def _stationary(self, iterations: int = 4096) -> np.ndarray:
        """``π`` by power iteration from the uniform distribution (exactly rounded sums), stopped
        when an iteration no longer changes it."""
        p = self.transitions
        q = np.full(self.vocab, 1.0 / self.vocab)
        for _ in range(iterations):
            new = np.array([math.fsum(q * p[:, j]) for j in range(self.vocab)])
            new = new / math.fsum(new)
            if np.array_equal(new, q):
                break
            q = new
        return q

    @property
    def entropy_rate(self) -> float:
        """``H = −Σ_i π_i Σ_j P_ij ln P_ij`` in nats per token: the best achievable loss."""
        p = self.transitions
        logs = np.where(p > 0, np.log(np.where(p > 0, p, 1.0)), 0.0)
        return -math.fsum(self.stationary[i] * math.fsum(p[i] * logs[i])
                          for i in range(self.vocab))

    def _draw(self, cdf_row: np.ndarray, u: np.ndarray) -> np.ndarray:
        """Inverse CDF: for each row of ``cdf_row`` (n, V) the first j with ``u < cdf[j]``."""
        return np.minimum((cdf_row <= u[:, None]).sum(axis=1), self.vocab - 1)

    def batch(self, batch: int, seq_len: int, stream: str = "train", index: int = 0):
        """``(idx, targets)``, int64 arrays (batch, seq_len): ``targets`` is ``idx`` shifted by one
        token — batch ``index`` of ``stream`` (a pure function of its arguments)."""
        check_int("batch", batch, min=1)
        check_int("seq_len", seq_len, min=1)
        u = _keyed_uniforms(self.seed, stream, index, batch * (seq_len + 1))
        u = u.reshape(seq_len + 1, batch)                                            # (T+1, B)
        tokens = np.empty((batch, seq_len + 1), np.int64)                            # (B, T+1)
        tokens[:, 0] = self._draw(np.broadcast_to(self._pi_cdf, (batch, self.vocab)), u[0])
        for t in range(seq_len):
            tokens[:, t + 1] = self._draw(self._cdf[tokens[:, t]], u[t + 1])
        return tokens[:, :-1], tokens[:, 1:]

    def describe(self) -> dict:
        return {"kind": "markov", "vocab": self.vocab, "sharpness": self.sharpness,
                "seed": self.seed, "entropy_rate": self.entropy_rate,
                "uniform_loss": math.log(self.vocab)}


class TextCorpus:
    """Byte-level text: vocabulary 256, windows of a file at Philox-uniform offsets."""

    vocab = 256
    entropy_rate = None

    def __init__(self, path, seed: int = 0):
        self.path = Path(path)
        self.data = np.frombuffer(self.path.read_bytes(), dtype=np.uint8).astype(np.int64)
        self.seed = int(seed)
        if self.data.size < 2:
            raise ValueError(f"text file {self.path} must hold at least 2 bytes; got "
                             f"{self.data.size}")

    def batch(self, batch: int, seq_len: int, stream: str = "train", index: int = 0):
        """``(idx, targets)`` int64 (batch, seq_len): windows of ``seq_len + 1`` bytes (the file
        is read cyclically when it is shorter than a window)."""
        check_int("batch", batch, min=1)
        check_int("seq_len", seq_len, min=1)
        n = self.data.size
        starts = np.floor(_keyed_uniforms(self.seed, stream, index, batch) * n).astype(np.int64)
        tokens = self.data[(starts[:, None] + np.arange(seq_len + 1)) % n]           # (B, T+1)
        return tokens[:, :-1], tokens[:, 1:]

    def describe(self) -> dict:
        return {"kind": "text", "path": str(self.path), "bytes": int(self.data.size),
                "vocab": self.vocab, "seed": self.seed, "entropy_rate": None,
                "uniform_loss": math.log(self.vocab)}
