"""Depthwise filter inits for ConvMixer: the paper's theory experiment (Section 3).

A ConvMixer whose f x f depthwise filters are frozen at random or impulse values should train
nearly as well as one that learns them, because f^2 linearly independent filters span every f x f
filter and the pointwise convolution that follows can mix them; frozen all-ones "box" filters span
one direction only. Methods: "random" (PyTorch's default conv init, redrawn from the seed),
"impulse" (each channel a one-hot at an offset of the kernel, every offset once before any repeats),
"box" (every tap 1 / f^2). `freeze=True` fixes each depthwise convolution (weight and bias):
requires_grad False, so timm's optimiser factory leaves it out (and out of weight decay).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..adapters.convmixer import ConvMixerAdapter
from ..offsets import assign_offsets, kernel_offsets
from ..report import HeadReport, LayerReport
from .names import FILTER_METHODS
from .options import FilterOptions


def init_filters(
    adapter: ConvMixerAdapter, method: str, generator: torch.Generator, options: FilterOptions
) -> list[LayerReport]:
    """Set every block's depthwise filters by `method`; returns per layer, per channel, the offset
    that holds the most of the filter's absolute weight and that share (1 for an impulse)."""
    if method not in FILTER_METHODS:
        raise ValueError(
            f"init method {method!r} does not apply to ConvMixer's depthwise filters; "
            f"choose one of {', '.join(FILTER_METHODS)} (or 'default' to keep the model as built)"
        )
    f = adapter.kernel_size
    for conv in adapter.depthwise():
        weight = conv.weight  # (C, 1, f, f)
        if method == "random":
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
            if conv.bias is not None:
                bound = 1 / math.sqrt(f * f)
                nn.init.uniform_(conv.bias, -bound, bound, generator=generator)
        elif method == "box":
            weight.fill_(1.0 / (f * f))
        else:
            weight.zero_()
            centre = f // 2
            for channel, (dy, dx) in enumerate(assign_offsets(weight.shape[0], f, "random", generator)):
                weight[channel, 0, centre + dy, centre + dx] = 1.0
        conv.requires_grad_(not options.freeze)
    return filter_report(adapter)


def filter_report(adapter: ConvMixerAdapter) -> list[LayerReport]:
    """Per depthwise filter, its dominant offset and the share of |weight| on it."""
    f = adapter.kernel_size
    offsets = kernel_offsets(f)  # raster order, as the kernel's taps
    layers = []
    for i, conv in enumerate(adapter.depthwise()):
        taps = conv.weight.detach().abs().flatten(1).double()  # (C, f*f)
        share = taps.max(1).values / taps.sum(1).clamp_min(1e-300)
        best = taps.argmax(1)
        heads = [HeadReport(offsets[int(b)], float(s)) for b, s in zip(best, share)]
        layers.append(LayerReport(i, heads))
    return layers
