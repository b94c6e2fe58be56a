"""The version of mpt (read by setup.cfg and recorded in golden manifests)."""
__version__ = "0.1.0"
