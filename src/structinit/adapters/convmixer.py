"""timm's ConvMixer: its spatial mixing is a depthwise convolution per block, the filters that the
impulse init gives the ViT's attention heads. No attention, so it has its own small adapter."""

from __future__ import annotations

import torch
from timm.models.convmixer import ConvMixer
from torch import nn


class ConvMixerAdapter:
    family = "timm ConvMixer"
    example = "convmixer_d6_p4 (preset) or convmixer_768_32"

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, ConvMixer)

    def depthwise(self) -> list[nn.Conv2d]:
        """The depthwise spatial convolution of every block, in forward order."""
        return [block[0].fn[0] for block in self.model.blocks]

    @property
    def kernel_size(self) -> int:
        return self.depthwise()[0].kernel_size[0]

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """The patch embeddings (B, D, H, W) entering the first block."""
        return self.model.stem(images)

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        return self.model.blocks[index](x)

    @property
    def num_blocks(self) -> int:
        return len(self.model.blocks)


def get_conv_adapter(model: nn.Module) -> ConvMixerAdapter | None:
    return ConvMixerAdapter(model) if ConvMixerAdapter.matches(model) else None
