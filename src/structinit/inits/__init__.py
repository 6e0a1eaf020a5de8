"""The init methods: `initialize`, the methods each model family takes (`METHODS` for the plain ViTs)
and their options classes; imported when first used, so that the light modules here (labels, options)
load without the model families."""

from typing import TYPE_CHECKING

from ..lazy import lazy_names

if TYPE_CHECKING:
    from .api import initialize
    from .options import FilterOptions, ImpulseOptions, MimeticOptions, MixerImpulseOptions, SwinImpulseOptions
    from .registry import METHODS

LAZY = {
    "initialize": "api",
    "FilterOptions": "options",
    "ImpulseOptions": "options",
    "MimeticOptions": "options",
    "MixerImpulseOptions": "options",
    "SwinImpulseOptions": "options",
    "METHODS": "registry",
}


__getattr__ = lazy_names(__name__, LAZY)


__all__ = [
    "METHODS",
    "FilterOptions",
    "ImpulseOptions",
    "MimeticOptions",
    "MixerImpulseOptions",
    "SwinImpulseOptions",
    "initialize",
]
