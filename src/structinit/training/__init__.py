"""One training run: its settings (settings.py, read back by config_file.py), what it trains (recipe.py)
on which device (device.py), its directory (rundir.py: lock, ownership, record, checkpoint, loggers,
provenance) and the trainer that drives them (run.py)."""

from .config_file import read_config
from .presets import presets
from .run import resume_config, train
from .settings import TrainConfig

__all__ = ["TrainConfig", "presets", "read_config", "resume_config", "train"]
