"""L5: training — the trainer that carries out a recipe (:mod:`~mpt.train.trainer`), bit-exact
checkpoints (:mod:`~mpt.train.state`), the corpora (:mod:`~mpt.train.corpus`) and the numeric
health reports (:mod:`~mpt.train.diagnostics`)."""
from mpt.train.corpus import MarkovCorpus, TextCorpus
from mpt.train.state import CheckpointError, load_checkpoint, save_checkpoint
from mpt.train.trainer import StepMetrics, TrainConfig, Trainer, learning_rate

__all__ = ["Trainer", "TrainConfig", "StepMetrics", "learning_rate", "save_checkpoint",
           "load_checkpoint", "CheckpointError", "MarkovCorpus", "TextCorpus"]
