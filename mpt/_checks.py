"""L0: argument checks shared by every layer, with one message style.

Each check either returns the value as a plain Python ``bool``/``int``/``float`` (so the caller
stores exactly what was checked) or raises:

* ``TypeError`` when the value has the wrong type:
  ``"lr must be a finite real number >= 0; got str '0.1'"``;
* ``ValueError`` when it has the right type but lies outside the range:
  ``"lr must be a finite real number >= 0; got nan"``.

Both messages name the argument and the expectation. ``bool`` (and ``numpy.bool_``) is never an
int or a real number here, although Python treats ``True`` as ``1``: a flag passed where a number
is expected is a mistake. NumPy integer and floating scalars are accepted wherever Python ints
and floats are (``np.float32(0.1)`` is a real number). A NaN never passes :func:`check_real`.

This module imports only numpy, so any module of mpt (kernels and the format table included) can
use it.
"""
from __future__ import annotations

import math
import numbers

import numpy as np

__all__ = ["check_bool", "check_int", "check_real", "check_finite", "check_array",
           "renamed"]


def _is_bool(value) -> bool:
    return isinstance(value, (bool, np.bool_))


def check_bool(name: str, value) -> bool:
    """``value`` as a bool; TypeError unless it is a ``bool`` or ``numpy.bool_``."""
    if not _is_bool(value):
        raise TypeError(f"{name} must be a bool (True or False); got {type(value).__name__} "
                        f"{value!r}")
    return bool(value)


def _num(v) -> str:
    """A bound as text; large ints next to a power of two read as ``2**64 - 1``, ``-2**31``."""
    a = abs(v)
    if not isinstance(v, int) or a < 1 << 16:
        return str(v)
    if a & (a - 1) == 0:
        text = f"2**{a.bit_length() - 1}"
    elif (a + 1) & a == 0:
        text = f"2**{a.bit_length()} - 1"
    else:
        return str(v)
    return text if v > 0 else f"-{text}" if " " not in text else f"-({text})"


def _bounds(min, max, gt, lt) -> str:
    """`` >= 0``, `` in [0, 1)``, ... for the expectation text ('' when unbounded)."""
    min, max, gt, lt = (None if v is None else _num(v) for v in (min, max, gt, lt))
    low = (f"({gt}" if gt is not None else f"[{min}") if (gt, min) != (None, None) else None
    high = (f"{lt})" if lt is not None else f"{max}]") if (lt, max) != (None, None) else None
    if low and high:
        return f" in {low}, {high}"
    if low:
        return f" > {gt}" if gt is not None else f" >= {min}"
    if high:
        return f" < {lt}" if lt is not None else f" <= {max}"
    return ""


def _int_words(min, max) -> str:
    if max is None and min == 1:
        return "a positive int"
    if max is None and min == 0:
        return "a non-negative int"
    return "an int" + _bounds(min, max, None, None)


def check_int(name: str, value, *, min: int | None = None, max: int | None = None,
              optional: bool = False) -> int | None:
    """``value`` as a Python int in ``[min, max]`` (either bound may be None).

    Accepts ``int`` and NumPy integer scalars, never a bool or a float (even ``2.0``).
    ``optional=True`` lets ``None`` through (returned as None).
    """
    if optional and value is None:
        return None
    expected = ("None or " if optional else "") + _int_words(min, max)
    if _is_bool(value) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {expected}; got {type(value).__name__} {value!r}")
    value = int(value)
    if (min is not None and value < min) or (max is not None and value > max):
        raise ValueError(f"{name} must be {expected}; got {value}")
    return value


def check_real(name: str, value, *, min=None, max=None, gt=None, lt=None, finite: bool = True,
               optional: bool = False) -> float | None:
    """``value`` as a Python float, within the bounds given: ``min <= value <= max``,
    ``gt < value < lt`` (any of them None for no bound).

    Accepts Python ints and floats, NumPy integer and floating scalars and any other
    ``numbers.Real`` (``Fraction``), never a bool, a complex number, a string or an array.
    NaN is always refused; ``finite=False`` lets ±inf through (when the bounds allow it).
    ``optional=True`` lets ``None`` through (returned as None).
    """
    if optional and value is None:
        return None
    expected = ("None or " if optional else "") + ("a finite real number" if finite else
                                                   "a real number") + _bounds(min, max, gt, lt)
    if _is_bool(value) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {expected}; got {type(value).__name__} {value!r}")
    try:
        x = float(value)
    except OverflowError:                               # an int beyond float64's range
        x = math.inf if value > 0 else -math.inf
    bad = (math.isnan(x) or (finite and math.isinf(x))
           or (min is not None and not x >= min) or (max is not None and not x <= max)
           or (gt is not None and not x > gt) or (lt is not None and not x < lt))
    if bad:
        raise ValueError(f"{name} must be {expected}; got {value!r}")
    return x


def check_finite(name: str, array) -> np.ndarray:
    """``array`` as an ndarray, unchanged, if every element is finite (integer arrays always are;
    float, complex and ml_dtypes arrays are checked); ValueError counting the NaN and Inf
    elements otherwise."""
    values = np.asarray(array)
    if values.dtype.kind not in "biu" and not np.isfinite(values).all():
        nans = int(np.count_nonzero(np.isnan(values)))
        infs = int(np.count_nonzero(np.isinf(values)))
        raise ValueError(f"{name} must hold only finite values; got {nans} NaN and {infs} Inf "
                         f"of {values.size} elements")
    return values


def check_array(name: str, value, dtype, *, shape: tuple | None = None,
                ndim: int | None = None) -> np.ndarray:
    """``value`` unchanged if it is an ndarray of ``dtype`` (and of ``shape`` / ``ndim`` when
    given): what a container hands to a kernel must be exactly what the kernel indexes.
    TypeError for a non-array or another dtype, ValueError for another shape."""
    dtype = np.dtype(dtype)
    if not isinstance(value, np.ndarray) or value.dtype != dtype:
        got = f"dtype {value.dtype}" if isinstance(value, np.ndarray) else type(value).__name__
        raise TypeError(f"{name} must be a {dtype.name} ndarray; got {got}")
    if shape is not None and value.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}; got {value.shape}")
    if ndim is not None and value.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s); got shape {value.shape}")
    return value


def renamed(name: str, value, old_name: str, old_value):
    """The argument given as ``name`` or under its 0.1 spelling ``old_name`` (None when neither);
    TypeError when both are given."""
    if old_value is None:
        return value
    if value is not None:
        raise TypeError(f"give {name} or {old_name} (its mpt 0.1 name), not both")
    return old_value
