"""mpt: every rounding of mixed-precision training, explicit and bit-exact on a CPU.

The public API is re-exported here; no logic lives in this file.
"""
__version__ = "0.1.0"

from mpt.formats import FORMATS, Format, RoundingMode, custom_format, get_format

__all__ = [
    "__version__",
    # L0 formats
    "FORMATS", "Format", "RoundingMode", "custom_format", "get_format",
]
