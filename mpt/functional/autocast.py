"""L3: autocast — per-op casts by cast category (PyTorch's CUDA autocast, docs/amp.md §2) and
the active matmul model.

Inside ``with mpt.autocast("fp16", model="hopper"):`` every op declared with
:func:`autocast_op` first casts its floating tensor arguments by its category:

==================  ==============================================================================
``"lower"``         cast fp32/fp16/bf16 inputs to the region's format (matmul, linear, conv2d,
                    scaled_dot_product_attention)
``"fp32"``          cast fp16/bf16 inputs up to fp32 (exp, log, pow, norms, losses)
``"fp32_output"``   reductions computed and returned in fp32 (softmax, log_softmax, sum): inputs
                    are cast up to fp32 (exact), which is what PyTorch's ``dtype=float32`` does
``"promote"``       the widest input format wins (cat, stack); fp16 with bf16 gives fp32
``"passthrough"``   no cast (relu, gelu, add, mul, dropout, …); if tensor arguments mix formats,
                    PyTorch's type promotion (the widest wins) applies, as on a GPU
==================  ==============================================================================

Only fp32, fp16 and bf16 tensors are cast; fp64, fp8 and integer tensors pass through. Every cast
is ``Tensor.to`` (one RNE rounding, differentiable). Outside an autocast region no op casts, and
ops reject tensors of different formats (``TypeError`` naming both): mpt never promotes silently.

**Cast cache.** Inside a region (``cache_enabled=True``), the cast of a leaf tensor that requires
grad (a parameter) is made once and reused; an entry is keyed by the tensor, the target format
and the grad mode, and is dropped when the tensor's version changes (an optimizer step on the
parameter) — the stale-cache bug users report on PyTorch cannot happen. The cache is cleared when
the outermost enabled region exits.

**Matmul model.** Every GEMM (forward, dgrad, wgrad of matmul, linear, conv2d, attention) uses the
model of :func:`autocast_state`: ``model`` of the innermost enabled autocast region, else the
model set with :func:`matmul_model` (default ``"ieee_fma"``, sequential IEEE FP32 FMA).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools

from mpt._checks import check_bool, renamed
from mpt.autograd.context import State
from mpt.autograd.function import Function
from mpt.autograd.tensor import Tensor, is_grad_enabled
from mpt.engines import get_mma_model
from mpt.formats import Format, get_format

__all__ = [
    "autocast", "matmul_model", "autocast_state", "replay_autocast", "AutocastState",
    "autocast_op", "register_autocast", "autocast_categories", "CATEGORIES", "cast_for_category",
    "current_model",
]

CATEGORIES = ("lower", "fp32", "fp32_output", "promote", "passthrough")
_FP32 = get_format("fp32")
_LOWER = (get_format("fp16"), get_format("bf16"))
_CASTABLE = (_FP32, *_LOWER)


@dataclasses.dataclass(frozen=True, init=False)
class AutocastState:
    """A snapshot of the autocast state (what checkpoint recomputation replays).

    ``enabled``: inside an enabled autocast region; ``format``: its lower-precision format (None
    outside); ``model``: the matmul model every GEMM uses now; ``cache_enabled``: the cast cache.
    ``dtype`` is the mpt 0.1 name of ``format`` (an attribute and a keyword of the constructor).
    """

    enabled: bool = False
    format: Format | None = None
    model: str = "ieee_fma"
    cache_enabled: bool = True

    def __init__(self, enabled: bool = False, format: Format | None = None,
                 model: str = "ieee_fma", cache_enabled: bool = True, *, dtype=None):
        values = dict(enabled=enabled, format=renamed("format", format, "dtype", dtype),
                      model=model, cache_enabled=cache_enabled)
        for key, value in values.items():
            object.__setattr__(self, key, value)

    @property
    def dtype(self) -> Format | None:
        """The mpt 0.1 name of :attr:`format`."""
        return self.format


AUTOCAST = State("autocast", AutocastState())


def _fresh_cache():
    """The cast cache a region starts with: a new dict when casts are cached, else None."""
    state = AUTOCAST.get()
    return {} if state.enabled and state.cache_enabled else None


#: The cast cache: a dict while an enabled region with cache_enabled is open (not part of a
#: context snapshot: a replayed region starts with a fresh one).
CAST_CACHE = State("autocast_cache", None, replayed=False, fresh=_fresh_cache)


def autocast_state() -> AutocastState:
    """The current autocast state (frozen; compare or replay it with :func:`replay_autocast`)."""
    return AUTOCAST.get()


def current_model() -> str:
    """The matmul model in effect (see the module docstring)."""
    return AUTOCAST.get().model


@contextlib.contextmanager
def _state(new: AutocastState):
    previous, previous_cache = AUTOCAST.get(), CAST_CACHE.get()
    AUTOCAST.set(new)
    if new.enabled and new.cache_enabled and previous_cache is None:
        CAST_CACHE.set({})
    elif not new.enabled or not new.cache_enabled:
        CAST_CACHE.set(None)
    try:
        yield new
    finally:
        AUTOCAST.set(previous)
        CAST_CACHE.set(previous_cache)


def _check_model(model) -> str:
    """A matmul model name, checked now (an unknown one would fail at the first GEMM)."""
    if not isinstance(model, str) or not model:
        raise TypeError(f"model must be a matmul model name (str); got {model!r}")
    get_mma_model(model)
    return model


def autocast(format=None, model: str = "hopper", enabled: bool = True,
             cache_enabled: bool = True, *, dtype=None):
    """Context manager: run ops under autocast (each op cast by its category) with ``format``
    ("fp16", the default, or "bf16") as the lower precision and ``model`` as the matmul model.
    ``enabled=False`` opens a region where no op casts (the matmul model stays what it was).
    ``dtype`` is the mpt 0.1 (and PyTorch) name of ``format``."""
    fmt = get_format(renamed("format", format, "dtype", dtype) or "fp16")
    if fmt not in _LOWER:
        raise ValueError(f"autocast format must be 'fp16' or 'bf16'; got {fmt.name!r}")
    cache_enabled = check_bool("cache_enabled", cache_enabled)
    if not check_bool("enabled", enabled):
        return _state(dataclasses.replace(AUTOCAST.get(), enabled=False, format=None))
    return _state(AutocastState(True, fmt, _check_model(model), cache_enabled))


def matmul_model(name: str):
    """Context manager setting the matmul model of every GEMM (also inside autocast regions)."""
    return _state(dataclasses.replace(AUTOCAST.get(), model=_check_model(name)))


def replay_autocast(state: AutocastState):
    """Context manager re-entering a snapshot from :func:`autocast_state` (with a fresh cache)."""
    if not isinstance(state, AutocastState):
        raise TypeError(f"state must be an AutocastState; got {type(state).__name__}")
    return _state(state)


# ---- casting -------------------------------------------------------------------------------------


def _cast(t: Tensor, fmt: Format) -> Tensor:
    """``t.to(fmt)``, through the cast cache for leaves that require grad."""
    cache = CAST_CACHE.get()
    if cache is None or not (t.requires_grad and t._node is None):
        return t.to(fmt)
    key = (id(t), fmt.name, is_grad_enabled())
    hit = cache.get(key)
    if hit is not None and hit[0] is t and hit[1] == t._version:
        return hit[2]
    out = t.to(fmt)
    cache[key] = (t, t._version, out)  # holding t keeps id(t) from being reused
    return out


def _widest(formats) -> Format:
    """PyTorch's promotion among fp32/fp16/bf16: one format stays, any mix gives fp32."""
    return formats[0] if all(f == formats[0] for f in formats) else _FP32


def _tensors(args):
    for a in args:
        if isinstance(a, Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (t for t in a if isinstance(t, Tensor))


def _map(args, fn):
    out = []
    for a in args:
        if isinstance(a, Tensor):
            out.append(fn(a))
        elif isinstance(a, (list, tuple)) and any(isinstance(t, Tensor) for t in a):
            out.append(type(a)(fn(t) if isinstance(t, Tensor) else t for t in a))
        else:
            out.append(a)
    return out


def cast_for_category(category: str, args, kwargs, state: AutocastState):
    """The arguments of an op of ``category`` after the autocast casts of ``state``."""
    if category == "lower":
        target = state.format
    elif category in ("fp32", "fp32_output"):
        target = _FP32
    else:  # promote / passthrough: the widest castable format, if they differ
        formats = [t.format for t in _tensors([*args, *kwargs.values()]) if t.format in _CASTABLE]
        if not formats:
            return args, kwargs
        target = _widest(formats)

    def cast(t):
        return _cast(t, target) if t.format in _CASTABLE and t.format != target else t

    return _map(args, cast), dict(zip(kwargs, _map(kwargs.values(), cast)))


# ---- the op table --------------------------------------------------------------------------------
_TABLE: dict[str, str] = {}


def _check_category(category) -> str:
    if category not in CATEGORIES:
        raise ValueError(f"category must be one of {', '.join(map(repr, CATEGORIES))}; got "
                         f"{category!r}")
    return category


def _wrap(fn, category: str, name: str):
    @functools.wraps(fn)
    def op(*args, **kwargs):
        state = AUTOCAST.get()
        if state.enabled:
            args, kwargs = cast_for_category(category, args, kwargs, state)
        return fn(*args, **kwargs)
    op.autocast_category = category
    _TABLE[name] = category
    return op


def autocast_op(category: str, name: str | None = None):
    """Decorator declaring an op's autocast category (recorded in :func:`autocast_categories`)."""
    _check_category(category)
    return lambda fn: _wrap(fn, category, name or fn.__name__)


def register_autocast(op, category: str, *, name: str | None = None):
    """Give a user op (a function, or a :class:`~mpt.function.Function` subclass: its ``apply``)
    an autocast category; returns the wrapped callable to use instead of ``op``."""
    _check_category(category)
    if isinstance(op, type) and issubclass(op, Function):
        return _wrap(op.apply, category, name or op.__name__)
    if not callable(op):
        raise TypeError(f"op must be a function or a Function subclass; got {type(op).__name__}")
    return _wrap(op, category, name or getattr(op, "__name__", repr(op)))


def autocast_categories() -> dict[str, str]:
    """Every op with an autocast category: ``{name: category}`` (built-ins and registered
    ones)."""
    return dict(sorted(_TABLE.items()))
