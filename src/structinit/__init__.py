"""structinit: convolutional inductive bias for Vision Transformers through initialisation alone."""

from .export import save_init
from .fidelity import fidelity
from .method_options import (
    FilterOptions,
    ImpulseOptions,
    MimeticOptions,
    MixerImpulseOptions,
    SwinImpulseOptions,
)
from .methods import METHODS, initialize
from .report import Report

__version__ = "0.2.0"
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
    "save_init",
]
