"""L3: module-level cast policies in jmp's grammar (``"p=f32,c=bf16,o=f32"``).

A :class:`Policy` names three formats (docs/amp.md §2, jmp's ``Policy``):

``param_format``    the format parameters are stored in (what the optimizer updates),
``compute_format``  the format inputs and parameters are cast to before a module computes,
``output_format``   the format a module's outputs are cast to when it returns.

Each cast is one explicit rounding, :meth:`mpt.Tensor.to` (``mpt.round``, round to nearest
even); a tensor already in the target format is returned as it is (no copy, no rounding).
Only floating tensors of a float format are cast; integer tensors (token ids) and every non-tensor
leaf pass through, as jmp casts only floating arrays. The casts are differentiable: the gradient of
a cast copy flows back to the original and is rounded to its format.

The Apex opt levels as policies plus the rest of a recipe (docs/amp.md §2):

======  ====================  ==========================================================
O0      ``"f32"``             pure fp32
O1      ``"f32"`` + autocast  fp32 weights, per-op casts (``mpt.autocast``), not a policy
O2      ``"p=f16"`` network   fp16 network + fp32 master weights and loss scaling (mpt.amp)
O3      ``"f16"``             pure fp16
======  ====================  ==========================================================

Modules apply a policy with ``mpt.nn.Module.set_policy`` (see its docstring).
"""
from __future__ import annotations

import dataclasses

from mpt.autograd.tensor import Tensor
from mpt.formats import Format, get_format

__all__ = ["Policy", "get_policy"]

# jmp's names (``jmp._src.policy.dtype_to_names``; "half" is fp16, the GPU meaning). The first
# name of each format is the one ``str(policy)`` prints.
_NAMES = {
    "fp32": ("f32", "float32", "full"),
    "bf16": ("bf16", "bfloat16"),
    "fp16": ("f16", "float16", "half"),
    "fp64": ("f64", "float64"),
}
_BY_NAME = {name: fmt for fmt, names in _NAMES.items() for name in names}
_KEYS = {"p": "param_format", "params": "param_format",
         "c": "compute_format", "compute": "compute_format",
         "o": "output_format", "output": "output_format"}


def _policy_format(fmt, arg: str) -> Format:
    """``fmt`` as one of the four policy formats; raise naming ``arg`` otherwise."""
    found = get_format(fmt)
    if found.name not in _NAMES:
        raise ValueError(f"{arg} must be one of fp32, bf16, fp16, fp64; got {found.name}")
    return found


@dataclasses.dataclass(frozen=True)
class Policy:
    """Param / compute / output formats (jmp's ``Policy`` with mpt Formats; frozen).

    Fields accept a Format or a format name (``Policy("fp32", "bf16", "fp32")``); only fp32,
    bf16, fp16 and fp64 are policy formats (``ValueError`` naming the field otherwise).
    """

    param_format: Format
    compute_format: Format
    output_format: Format

    def __post_init__(self):
        for field in ("param_format", "compute_format", "output_format"):
            object.__setattr__(self, field, _policy_format(getattr(self, field), field))

    def cast_to_param(self, tree):
        """``tree`` with every floating Tensor rounded (RNE) to ``param_format``."""
        return _cast_floating(tree, self.param_format)

    def cast_to_compute(self, tree):
        """``tree`` with every floating Tensor rounded (RNE) to ``compute_format``."""
        return _cast_floating(tree, self.compute_format)

    def cast_to_output(self, tree):
        """``tree`` with every floating Tensor rounded (RNE) to ``output_format``."""
        return _cast_floating(tree, self.output_format)

    def with_output_format(self, fmt) -> "Policy":
        """A copy with ``output_format`` replaced (jmp's ``with_output_dtype``)."""
        return dataclasses.replace(self, output_format=fmt)

    def __str__(self) -> str:
        names = (_NAMES[f.name][0] for f in
                 (self.param_format, self.compute_format, self.output_format))
        return "p={},c={},o={}".format(*names)


def _cast_floating(tree, fmt: Format):
    """Round the floating Tensors of a (nested tuple / list / dict) tree to ``fmt``."""
    if isinstance(tree, Tensor):
        if tree.format.kind != "float" or tree.format == fmt:
            return tree
        return tree.to(fmt)
    if isinstance(tree, (tuple, list)):
        return type(tree)(_cast_floating(x, fmt) for x in tree)
    if isinstance(tree, dict):
        return {k: _cast_floating(v, fmt) for k, v in tree.items()}
    return tree


def _parse_name(value: str, key: str, policy: str) -> Format:
    try:
        return get_format(_BY_NAME[value])
    except KeyError:
        valid = ", ".join(_BY_NAME)
        raise ValueError(
            f"unknown format {value!r} for key {key!r} in policy {policy!r}; valid names: {valid}"
        ) from None


def get_policy(policy: str) -> Policy:
    """Parse a policy string with jmp's grammar (``jmp.get_policy``).

    ``"p=f32,c=bf16,o=f32"``: comma-separated ``key=name`` parts, keys ``p|params``,
    ``c|compute``, ``o|output``. Unset params is fp32, unset compute follows params, unset output
    follows compute (``"c=bf16"`` is ``p=f32,c=bf16,o=bf16``). A bare name (no ``=``) sets all
    three (``"bf16"``). Names: ``f32|float32|full``, ``bf16|bfloat16``, ``f16|float16|half``,
    ``f64|float64``; matching is exact (case and spaces matter, as in jmp). A key given twice keeps
    its last value, as in jmp. Raises ``TypeError`` for a non-string, ``ValueError`` naming the
    bad key or value.
    """
    if not isinstance(policy, str):
        raise TypeError("policy must be a str like 'p=f32,c=bf16,o=f32'; "
                        f"got {type(policy).__name__}")
    if "=" not in policy:
        fmt = _parse_name(policy, "<all>", policy)
        return Policy(fmt, fmt, fmt)
    chosen = {"param_format": get_format("fp32")}
    for part in policy.split(","):
        key, sep, value = part.partition("=")
        if not sep or "=" in value:
            raise ValueError(f"policy part {part!r} in {policy!r} must be key=name")
        if key not in _KEYS:
            raise ValueError(f"unknown key {key!r} in policy {policy!r}; "
                             "valid keys: p|params, c|compute, o|output")
        chosen[_KEYS[key]] = _parse_name(value, key, policy)
    chosen.setdefault("compute_format", chosen["param_format"])
    chosen.setdefault("output_format", chosen["compute_format"])
    return Policy(**chosen)
