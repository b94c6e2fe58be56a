"""L5: file helpers shared by the tools — SHA-256 digests, atomic writes (temp file + rename),
arrays of any format stored in ``.npz`` files that load without pickle, files read only from
inside their folder, and typed access to the fields of a parsed JSON manifest.

Used by ``mpt.golden`` (golden suites) and ``mpt.train.state`` (training checkpoints): a reader
never sees a half-written file, every stored byte can be checked against its digest, a name taken
from a manifest never leads outside its folder, and a malformed manifest is reported as one error
naming the field (each caller passes its own exception class).
"""
from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np

from mpt.formats import UNSIGNED, get_format

__all__ = ["sha256", "atomic_write_bytes", "storable", "dtype_from_name", "NATIVE_DTYPES",
           "default_mode", "BASE_NAME", "check_base_name", "read_in_folder", "field", "is_sha256",
           "load_json"]

#: dtypes numpy stores and loads by itself; ml_dtypes arrays (bf16, fp8, ...) are stored as bits.
NATIVE_DTYPES = frozenset(np.dtype(t) for t in (
    np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
    np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))


def sha256(data: bytes) -> str:
    """The SHA-256 hex digest of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _read_umask()  # read once, at import: os.umask can only be read by setting it


def default_mode(bits: int) -> int:
    """The permission bits a plain ``open``/``mkdir`` would give (``bits`` less the umask);
    temporary files and folders are created private (0o600/0o700) and get these before the
    rename that publishes them."""
    return bits & ~_UMASK


def atomic_write_bytes(path: Path, write: Callable) -> None:
    """Create or replace ``path`` with what ``write(binary file handle)`` writes, atomically: the
    bytes go to a temporary file in the same folder, are flushed to disk, and the file is renamed
    over ``path`` (``os.replace``; a symbolic link at ``path`` is replaced, never written
    through). The new file has the usual permissions (:func:`default_mode`). On any error the
    temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, default_mode(0o666))
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def storable(a) -> np.ndarray:
    """``a`` as a C-contiguous array numpy can save: itself, or its unsigned bit patterns for
    ml_dtypes dtypes (read back with ``.view(dtype_from_name(a.dtype.name))``)."""
    a = np.asarray(a, order="C")                      # (ascontiguousarray would make 0-d 1-d)
    return a if a.dtype in NATIVE_DTYPES else a.view(UNSIGNED[a.dtype.itemsize])


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


# ---- files named by a manifest ------------------------------------------------------------------
#: A plain file name: a letter or digit, then letters, digits, ``_``, ``.`` and ``-`` (at most 200
#: characters in all). No separator, no ``..``, nothing absolute: it names a file in one folder.
BASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def check_base_name(name, what: str, error: type[Exception]) -> str:
    """``name`` if it is a plain file name (:data:`BASE_NAME`, no ``..``); else ``error`` naming
    ``what``."""
    if not isinstance(name, str) or not BASE_NAME.fullmatch(name) or ".." in name:
        raise error(f"{what} must be a plain file name ({BASE_NAME.pattern}, no '..'); got "
                    f"{name!r}")
    return name


def read_in_folder(folder: Path, name: str, error: type[Exception]) -> bytes:
    """The bytes of the regular file ``name`` directly inside ``folder``.

    ``name`` must be a plain file name (:func:`check_base_name`); a symbolic link is refused, never
    followed (checked, then opened with ``O_NOFOLLOW``), and so is anything but a regular file
    (a FIFO is opened non-blocking, so it cannot hang the reader). Every failure raises ``error``.
    """
    check_base_name(name, "file name", error)
    path = Path(folder) / name
    if path.is_symlink():
        raise error(f"{path} is a symbolic link; refusing to follow it out of {folder}")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) \
        | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path} is missing") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{path} is a symbolic link; refusing to follow it out of {folder}") \
                from None
        raise error(f"cannot read {path}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise error(f"{path} is not a regular file")
        return fh.read()


def is_sha256(text) -> bool:
    """Whether ``text`` is a SHA-256 hex digest (64 lowercase hex digits)."""
    return isinstance(text, str) and _SHA256.fullmatch(text) is not None


# ---- typed fields of a parsed JSON manifest -----------------------------------------------------
_KINDS = {
    "dict": ("an object", lambda v: isinstance(v, dict)),
    "list": ("a list", lambda v: isinstance(v, list)),
    "str": ("a string", lambda v: isinstance(v, str)),
    "bool": ("true or false", lambda v: isinstance(v, bool)),
    "int": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "real": ("a finite number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
             and math.isfinite(v)),
    "sha256": ("a SHA-256 hex digest (64 lowercase hex digits)", is_sha256),
    "null": ("null", lambda v: v is None),
}


def field(obj: dict, key: str, kinds: str, where: str, error: type[Exception]):
    """``obj[key]``, required to be one of ``kinds`` (``"int"``, ``"real|null"``, ...: see
    ``_KINDS``; a bool is never an int); a missing field or another type raises ``error`` naming
    ``where.key``."""
    path = f"{where}.{key}" if where else key
    if not isinstance(obj, dict) or key not in obj:
        raise error(f"{path} is missing")
    value = obj[key]
    names = kinds.split("|")
    if not any(_KINDS[k][1](value) for k in names):
        expected = " or ".join(_KINDS[k][0] for k in names)
        raise error(f"{path} must be {expected}; got {_show(value)}")
    return value


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_json(data: bytes, what: str, error: type[Exception], *, allow_nan: bool = False):
    """Parse a manifest's bytes: UTF-8 JSON whose objects never repeat a key (a repeated key
    would let two readers see different values) and, unless ``allow_nan``, without the
    non-standard constants NaN and Infinity. Any problem raises ``error`` naming ``what``."""
    def unique(pairs):
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise error(f"{what} repeats the key {next(k for k in keys if keys.count(k) > 1)!r}")
        return dict(pairs)

    def constant(name):
        if not allow_nan:
            raise error(f"{what} holds {name}, which JSON does not allow")
        return float(name.replace("Infinity", "inf"))

    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=unique,
                          parse_constant=constant)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{what} is not valid JSON (truncated or damaged): {exc}") from None
