"""Model-family adapters, and `get_adapter` to pick the one for a model."""

from __future__ import annotations

from torch import nn

from .base import AttentionLayer, ModelAdapter
from .cait import CaitAdapter
from .convmixer import ConvMixerAdapter
from .hf_vit import HFViTAdapter
from .mixer import MixerAdapter
from .relpos import HFBeitAdapter, TimmBeitAdapter, TimmRelPosAdapter
from .rope import RopeEvaAdapter
from .swin import SwinAdapter
from .swin_v2 import HFSwinAdapter, TimmSwinV2Adapter, TimmSwinV2CrAdapter, TorchvisionSwinAdapter
from .timm_eva import TimmEvaAdapter
from .timm_vit import TimmViTAdapter
from .torchvision_vit import TorchvisionViTAdapter

ADAPTERS: list[type[ModelAdapter]] = [TimmViTAdapter, TimmEvaAdapter, TorchvisionViTAdapter, HFViTAdapter]


# families whose position lives in a relative-position bias (adapters/relpos_base.py)
RELPOS_ADAPTERS = [
    TimmRelPosAdapter,
    TimmBeitAdapter,
    HFBeitAdapter,
    TimmSwinV2Adapter,
    TimmSwinV2CrAdapter,
    TorchvisionSwinAdapter,
    HFSwinAdapter,
]

# families with their own inits (inits/registry.py), not the global-attention interface
OTHER_FAMILIES = [SwinAdapter, *RELPOS_ADAPTERS, MixerAdapter, RopeEvaAdapter, CaitAdapter, ConvMixerAdapter]


def supported_families() -> str:
    return "; ".join(f"{a.family}, e.g. {a.example}" for a in [*ADAPTERS, *OTHER_FAMILIES])


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and the data-parallel wrappers: they share its parameters, so
    initialising the inner model initialises the wrapped one (every DDP rank draws the same weights
    from the same seed)."""
    while True:
        if isinstance(model, nn.parallel.DistributedDataParallel | nn.DataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod") and type(model).__name__ == "OptimizedModule":  # torch.compile
            model = model._orig_mod
        else:
            return model


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
    for other in (SwinAdapter, *RELPOS_ADAPTERS, MixerAdapter, RopeEvaAdapter, CaitAdapter):
        if other.matches(model):
            raise TypeError(
                f"{other.family}: `initialize` and `structinit init` support it (the report measures its attention "
                "or token mixing); attention pictures, `fidelity` on images and `rank` need a ViT-family model"
            )
    raise TypeError(f"structinit does not support {type(model).__name__} models; supported: {supported_families()}")


__all__ = [
    "ADAPTERS",
    "OTHER_FAMILIES",
    "RELPOS_ADAPTERS",
    "AttentionLayer",
    "ModelAdapter",
    "get_adapter",
    "supported_families",
    "unwrap",
]
