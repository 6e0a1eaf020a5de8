"""The init methods: `initialize`, the methods each model family takes (`METHODS` for the plain ViTs)
and their options classes; imported when first used, so that the light modules here (labels, options)
load without the model families."""

from importlib import import_module
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(import_module(f".{LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "METHODS",
    "FilterOptions",
    "ImpulseOptions",
    "MimeticOptions",
    "MixerImpulseOptions",
    "SwinImpulseOptions",
    "initialize",
]
