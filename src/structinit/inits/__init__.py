"""The init methods: `initialize`, the methods each model family takes (`METHODS` for the plain ViTs)
and their options classes."""

from .api import initialize
from .options import FilterOptions, ImpulseOptions, MimeticOptions, MixerImpulseOptions, SwinImpulseOptions
from .registry import METHODS

__all__ = [
    "METHODS",
    "FilterOptions",
    "ImpulseOptions",
    "MimeticOptions",
    "MixerImpulseOptions",
    "SwinImpulseOptions",
    "initialize",
]
