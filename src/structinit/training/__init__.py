"""One training run: the trainer (run.py), its directory (rundir.py), checkpoints, loggers and provenance."""

from .run import TrainConfig, presets, read_config, resume_config, train

__all__ = ["TrainConfig", "presets", "read_config", "resume_config", "train"]
