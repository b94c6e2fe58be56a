"""L5: file helpers shared by the tools — SHA-256 digests and atomic writes (temp file + rename).

Used by ``mpt.golden`` (golden suites) and ``mpt.train_state`` (training checkpoints): a reader
never sees a half-written file, and every stored byte can be checked against its digest.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Callable

__all__ = ["sha256", "atomic_write_bytes"]


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
