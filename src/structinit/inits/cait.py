"""Impulse init for CaiT's patch blocks: their talking heads set to the identity (each head's map its
own softmax), then the plain ViT's solve (inits/impulse.py)."""

from __future__ import annotations

import torch

from ..adapters.cait import CaitAdapter
from ..report import LayerReport
from .impulse import init_impulse
from .options import ImpulseOptions


def init_cait_impulse(
    adapter: CaitAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: ImpulseOptions,
    source: dict[str, str],
) -> list[LayerReport]:
    """proj_l and proj_w of every patch block the identity (weight I, bias 0), then `init_impulse`."""
    for layer in adapter.layers():
        for mix in layer.talking_heads() or ():
            mix.weight.copy_(torch.eye(layer.num_heads))
            mix.bias.zero_()
    return init_impulse(adapter, generator, kernel_size=kernel_size, options=options, source=source)
