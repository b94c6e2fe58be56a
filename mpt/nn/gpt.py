"""L4: a small GPT-2 — token and position embeddings, pre-LN blocks, a tied LM head."""
from __future__ import annotations

import math

import numpy as np

import mpt.functional as F
from mpt._checks import check_int
from mpt.autograd.tensor import Tensor
from mpt.nn.attention import TransformerBlock
from mpt.nn.checkpoint import checkpoint_sequential
from mpt.nn.init import init_constant_, init_normal_
from mpt.nn.layers import Dropout, Embedding, LayerNorm, Linear, ModuleList
from mpt.nn.module import Module

__all__ = ["GPT"]


class GPT(Module):
    """A small GPT-2: token + position embeddings, dropout, ``n_layers`` pre-LN blocks, final
    LayerNorm, LM head **tied** to the token embedding (``logits = x·wteᵀ``, GPT-2's choice; the
    head adds no parameters and its gradient accumulates into ``wte.weight``).

    ``gpt(idx)`` maps int token ids (B, T), T <= seq_len, to logits (B, T, vocab) in the
    activations' format; ``gpt.loss(idx, targets)`` is the mean ``F.cross_entropy``.

    Init (GPT-2 / nanoGPT, drawn by :meth:`reset_parameters` from ``seed``, each parameter keyed
    by its dotted name): every Linear and Embedding weight normal(0, 0.02); the residual
    projections (``attn.out_proj.weight``, ``mlp.fc2.weight``) normal(0, 0.02/sqrt(2·n_layers));
    biases 0; LayerNorm weights 1. Parameters are stored in ``format`` (fp32 by default), each
    value rounded once (RNE) from its float64 draw.

    ``checkpoint``: gradient checkpointing of the blocks (``mpt.checkpoint_sequential``): False,
    True (round(√n_layers) segments) or a number of segments; only segment inputs are kept and
    each segment is recomputed in the backward pass (bit-identical gradients).
    """

    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, seq_len: int,
                 dropout: float = 0.0, seed: int = 0, *, backend="flash", format="fp32",
                 checkpoint=False):
        super().__init__()
        self.vocab = check_int("vocab", vocab, min=1)
        self.seq_len = check_int("seq_len", seq_len, min=1)
        self.n_layers = n_layers = check_int("n_layers", n_layers, min=0)
        if not isinstance(checkpoint, bool) and checkpoint != "sqrt" and \
                (isinstance(checkpoint, str) or not isinstance(checkpoint, (int, np.integer))
                 or checkpoint < 0):
            raise ValueError(f"checkpoint must be False, True, 'sqrt' or a number of segments "
                             f"(an int >= 0); got {checkpoint!r}")
        self.checkpoint = "sqrt" if checkpoint is True else checkpoint
        self.wte = Embedding(vocab, d_model, format=format, seed=None)
        self.wpe = Embedding(seq_len, d_model, format=format, seed=None)
        self.drop = Dropout(dropout)
        self.blocks = ModuleList(TransformerBlock(d_model, n_heads, dropout, backend=backend,
                                                  format=format, seed=None)
                                 for _ in range(n_layers))
        self.ln_f = LayerNorm(d_model, format=format)
        self.reset_parameters(seed)

    def reset_parameters(self, seed: int = 0) -> "GPT":
        std = 0.02
        residual = {id(b.attn.out_proj.weight) for b in self.blocks} | \
                   {id(b.mlp.fc2.weight) for b in self.blocks}
        for mod_name, module in self.named_modules():
            for name, p in module._parameters.items():
                key = f"{mod_name}.{name}" if mod_name else name
                if isinstance(module, (Linear, Embedding)) and name == "weight":
                    scale = 1.0 / math.sqrt(2 * self.n_layers) if id(p) in residual else 1.0
                    init_normal_(p, std * scale, seed=seed, key=key)
                elif isinstance(module, Linear):
                    init_constant_(p, 0.0)
                else:
                    module._init_parameter(name, p, seed, key)
        return self

    def forward(self, idx):  # (B, T) ints -> (B, T, vocab)
        idx = _token_ids(idx, "idx")
        if idx.ndim != 2 or idx.shape[1] > self.seq_len:
            raise ValueError(f"idx must be (batch, T) token ids with T <= {self.seq_len}; "
                             f"got shape {idx.shape}")
        x = self.drop(self.wte(idx) + self.wpe(np.arange(idx.shape[1])))  # (B, T, d)
        if self.checkpoint:
            x = checkpoint_sequential(self.blocks, self.checkpoint, x)
        else:
            for block in self.blocks:
                x = block(x)
        x = self.ln_f(x)
        return F.linear(x, self.compute(self.wte.weight))  # tied head, (B, T, vocab)

    def loss(self, idx, targets):
        """Mean cross-entropy of the next-token logits against ``targets`` (B, T) ints."""
        logits = self(idx)
        B, T, V = logits.shape
        targets = _token_ids(targets, "targets")
        if targets.shape != (B, T):
            raise ValueError(f"targets must have the shape of idx {(B, T)}; got {targets.shape}")
        return F.cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))

    def extra_repr(self):
        return f"vocab={self.vocab}, seq_len={self.seq_len}, n_layers={self.n_layers}"


def _token_ids(x, arg: str) -> np.ndarray:
    """Token ids (an int ndarray, nested lists or an integer Tensor) as an int ndarray."""
    ids = np.asarray(x.data if isinstance(x, Tensor) else x)
    if ids.dtype.kind not in "iu":
        raise TypeError(f"{arg} must hold integer token ids; got dtype {ids.dtype}")
    return ids
