"""L4: multi-head self-attention and the pre-LN transformer block of a GPT."""
from __future__ import annotations

import functools

import mpt.functional as F
from mpt._checks import check_bool, check_int, check_real
from mpt.nn.layers import MLP, Dropout, LayerNorm, Linear, _seeded
from mpt.nn.module import Module

__all__ = ["ATTENTION_BACKENDS", "register_attention_backend", "MultiheadAttention",
           "TransformerBlock"]


ATTENTION_BACKENDS = {"naive": F.scaled_dot_product_attention,
                      "flash": functools.partial(F.scaled_dot_product_attention, backend="flash")}


def register_attention_backend(name: str, fn) -> None:
    """Make ``fn`` (``F.scaled_dot_product_attention``'s signature) selectable as
    ``MultiheadAttention(..., backend=name)`` (looked up when the module runs)."""
    if not isinstance(name, str) or not callable(fn):
        raise TypeError("register_attention_backend needs a str name and a callable fn")
    ATTENTION_BACKENDS[name] = fn


class MultiheadAttention(Module):
    """Multi-head self-attention on (B, T, d_model) inputs, batch first.

    ``qkv = in_proj(x)`` (one fused Linear d → 3d, GPT-2's ``c_attn``), heads split to
    (B, H, T, d/H), attention by ``backend`` (a name in :data:`ATTENTION_BACKENDS` or a callable;
    default ``"flash"``, FlashAttention-2; ``"naive"`` materialises the score matrix; dropout_p =
    ``dropout`` in training),
    heads merged, ``out_proj`` (d → d), then residual dropout (GPT-2's ``resid_dropout``).
    ``causal=True``: query i attends keys ``j <= i``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True,
                 causal: bool = False, backend="flash", *, format="fp32", seed: int | None = 0):
        super().__init__()
        d_model = check_int("d_model", d_model, min=1)
        n_heads = check_int("n_heads", n_heads, min=1)
        if d_model % n_heads:
            raise ValueError(f"n_heads={n_heads} must divide d_model={d_model}")
        self.d_model, self.n_heads, self.backend = d_model, n_heads, backend
        self.causal = check_bool("causal", causal)
        self.attn_dropout = check_real("dropout", dropout, min=0, lt=1)
        self.in_proj = Linear(d_model, 3 * d_model, bias, format=format, seed=None)
        self.out_proj = Linear(d_model, d_model, bias, format=format, seed=None)
        self.resid_dropout = Dropout(dropout)
        _seeded(self, seed)

    def _attention(self):
        if callable(self.backend):
            return self.backend
        try:
            return ATTENTION_BACKENDS[self.backend]
        except KeyError:
            raise ValueError(f"unknown attention backend {self.backend!r}; registered: "
                             f"{', '.join(ATTENTION_BACKENDS)}") from None

    def forward(self, x, attn_mask=None):
        B, T, d = x.shape
        H = self.n_heads
        qkv = self.in_proj(x).reshape(B, T, 3, H, d // H).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        p = self.attn_dropout if self.training else 0.0
        y = self._attention()(qkv[0], qkv[1], qkv[2], attn_mask=attn_mask, dropout_p=p,
                              is_causal=self.causal)                             # (B, H, T, hd)
        y = y.transpose(1, 2).reshape(B, T, d)                                   # (B, T, d)
        return self.resid_dropout(self.out_proj(y))

    def extra_repr(self):
        return f"d_model={self.d_model}, n_heads={self.n_heads}, causal={self.causal}"


class TransformerBlock(Module):
    """Pre-LN GPT-2 block: ``x = x + attn(ln1(x))``, ``x = x + mlp(ln2(x))``, causal attention.
    The residual additions are ``F.add`` in the activations' format (one rounding each)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, *, mlp_ratio: int = 4,
                 backend="flash", format="fp32", seed: int | None = 0):
        super().__init__()
        mlp_ratio = check_int("mlp_ratio", mlp_ratio, min=1)
        self.ln1 = LayerNorm(d_model, format=format)
        self.attn = MultiheadAttention(d_model, n_heads, dropout, causal=True, backend=backend,
                                       format=format, seed=None)
        self.ln2 = LayerNorm(d_model, format=format)
        self.mlp = MLP(d_model, mlp_ratio * d_model, dropout, format=format, seed=None)
        _seeded(self, seed)

    def forward(self, x):  # (B, T, d) -> (B, T, d)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


