"""L1: hardware targets — each accelerator as one frozen description (:class:`Target`): its MMA
model per input format, FP8 formats, conversion rules and evidence. Vendor modules register their
targets when this package is imported."""
from mpt.targets import nvidia, amd  # noqa: F401  (register the CPU, NVIDIA and AMD targets)
from mpt.targets import tpu, gaudi, trainium  # noqa: F401  (then the other vendors')
from mpt.targets.target import (Conversions, Target, get_target, register_target, targets,
                                targets_table_rows)

__all__ = ["Target", "Conversions", "targets", "get_target", "register_target",
           "targets_table_rows"]
