"""L5: file helpers shared by the tools — SHA-256 digests, atomic writes (temp file + rename), and
arrays of any format stored in ``.npz`` files that load without pickle.

Used by ``mpt.golden`` (golden suites) and ``mpt.train_state`` (training checkpoints): a reader
never sees a half-written file, and every stored byte can be checked against its digest.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from mpt.formats import get_format

__all__ = ["sha256", "atomic_write_bytes", "storable", "dtype_from_name", "NATIVE_DTYPES"]

#: dtypes numpy stores and loads by itself; ml_dtypes arrays (bf16, fp8, ...) are stored as bits.
NATIVE_DTYPES = frozenset(np.dtype(t) for t in (
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))
_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def sha256(data: bytes) -> str:
    """The SHA-256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def atomic_write_bytes(path: Path, write: Callable) -> None:
    """Create or replace ``path`` with what ``write(binary file handle)`` writes, atomically: the
    bytes go to a temporary file in the same folder, are flushed to disk, and the file is renamed
    over ``path`` (``os.replace``). On any error the temporary file is removed and ``path`` is left
    as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def storable(a) -> np.ndarray:
    """``a`` as a C-contiguous array numpy can save: itself, or its unsigned bit patterns for
    ml_dtypes dtypes (read back with ``.view(dtype_from_name(a.dtype.name))``)."""
    a = np.asarray(a, order="C")                      # (ascontiguousarray would make 0-d 1-d)
    return a if a.dtype in NATIVE_DTYPES else a.view(_UINT[a.dtype.itemsize])


def dtype_from_name(name: str) -> np.dtype:
    """The dtype a manifest names: a format's dtype (``bfloat16``, ``float8_e4m3fn``, ...) or a
    plain numpy one. Raises ``ValueError`` for anything else (a manifest never names objects)."""
    try:
        return np.dtype(get_format(name).dtype)
    except (ValueError, TypeError):
        pass
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise ValueError(f"unknown dtype {name!r}") from None
    if dtype not in NATIVE_DTYPES:
        raise ValueError(f"dtype {name!r} is not a plain numeric dtype")
    return dtype
