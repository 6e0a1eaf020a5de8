"""Model-family adapters, and `get_adapter` to pick the one for a model."""

from __future__ import annotations

from torch import nn

from .base import AttentionLayer, ModelAdapter
from .convmixer import ConvMixerAdapter
from .timm_vit import TimmViTAdapter

ADAPTERS: list[type[ModelAdapter]] = [TimmViTAdapter]


def supported_families() -> str:
    return "; ".join(f"{a.family}, e.g. {a.example}" for a in [*ADAPTERS, ConvMixerAdapter])


def get_adapter(model: nn.Module) -> ModelAdapter:
    """The adapter for `model`, or a TypeError that lists the supported families."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch.nn.Module, got {type(model).__name__}")
    for adapter in ADAPTERS:
        if adapter.matches(model):
            return adapter(model)
    if ConvMixerAdapter.matches(model):
        raise TypeError(
            "a ConvMixer has no attention: initialise its depthwise filters with 'random', 'impulse' or 'box', "
            "and look at it with `structinit rank`"
        )
    raise TypeError(f"structinit does not support {type(model).__name__} models; supported: {supported_families()}")


__all__ = ["ADAPTERS", "AttentionLayer", "ModelAdapter", "get_adapter", "supported_families"]
