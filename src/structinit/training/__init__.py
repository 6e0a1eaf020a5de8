"""One training run: its settings (settings.py, read back by config_file.py), what it trains (recipe.py)
on which device (device.py), its directory (rundir.py: lock, ownership, record, checkpoint, loggers,
provenance) and the trainer that drives them (run.py)."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names
from .presets import presets  # light (YAML only), and of a module's name: a lazy name would become the module

if TYPE_CHECKING:
    from .config_file import read_config
    from .run import resume_config, train
    from .settings import TrainConfig

# imported when first used: the settings' declarations (setting.py, settings.py) load without the trainer
LAZY = {
    "read_config": "config_file",
    "resume_config": "run",
    "train": "run",
    "TrainConfig": "settings",
}


__getattr__ = lazy_names(__name__, LAZY)


__all__ = ["TrainConfig", "presets", "read_config", "resume_config", "train"]
