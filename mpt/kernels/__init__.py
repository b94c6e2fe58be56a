"""L1: Numba kernels over plain arrays (float32/float64 values or uint bit views).

Kernels never see ml_dtypes dtypes: callers pass bit views or exactly decoded float32 values.
Numba compiles a kernel once per argument *type*, and a read-only array is a type of its own, so
the drivers pass a kernel's inputs in one kind: read-only (:func:`readonly`) where they may be
views of tensors (which are read-only), so that a writable array does not compile it again.
"""
import numpy as np


def readonly(x: np.ndarray) -> np.ndarray:
    """A read-only view of ``x`` (x itself when it already is one); no copy."""
    if not x.flags.writeable:
        return x
    view = x.view()
    view.flags.writeable = False
    return view
