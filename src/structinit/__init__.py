"""structinit: convolutional inductive bias for Vision Transformers through initialisation alone."""

from .export import save_init
from .fidelity import fidelity
from .methods import METHODS, initialize
from .report import Report

__version__ = "0.1.0"
__all__ = ["METHODS", "Report", "__version__", "fidelity", "initialize", "save_init"]
