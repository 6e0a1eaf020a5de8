"""structinit: convolutional inductive bias for Vision Transformers through initialisation alone."""

from .export import load_init, save_init
from .fidelity import fidelity
from .inits import (
    METHODS,
    FilterOptions,
    ImpulseOptions,
    MimeticOptions,
    MixerImpulseOptions,
    SwinImpulseOptions,
    initialize,
)
from .report import Report
from .version import __version__

__all__ = [
    "METHODS",
    "FilterOptions",
    "ImpulseOptions",
    "MimeticOptions",
    "MixerImpulseOptions",
    "Report",
    "SwinImpulseOptions",
    "__version__",
    "fidelity",
    "initialize",
    "load_init",
    "save_init",
]
