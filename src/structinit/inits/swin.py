"""Impulse init for Swin's window attention, through its relative-position bias.

A head with offset delta gets bias b on the table entry of delta and 0 on every other: in a window
of T tokens, with Q/K logits that do not depend on the key, query p then puts e^b / (e^b + T - 1) of
its mass on key p + delta, so b = log(f (T - 1) / (1 - f)) gives fidelity f exactly. No pseudo input
and no solve: Swin's tokens carry no position (docs/families.md measures the Q/K alternative).
Q and K keep their current (timm: trunc-normal 0.02) weights, whose logits are ~100x smaller than b,
so the bias decides at init and Q/K are free to learn content attention; V/proj take the mimetic
form, as in the ViT impulse init. Queries whose p + delta falls outside their window have no target
(the window edge plays the part of a convolution's zero padding).
"""

from __future__ import annotations

import math

import torch

from ..adapters.swin import SwinAdapter, SwinWindowLayer
from ..offsets import Offset, assign_offsets, check_kernel_size
from ..report import LayerReport
from .options import SwinImpulseOptions
from .weights import write_value_proj, z_sampler


def init_swin_impulse(
    adapter: SwinAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: SwinImpulseOptions,
) -> list[LayerReport]:
    """Each head of each window-attention layer attends to one offset of the f x f kernel (`assignment`
    "random": every offset once before repeats, per layer; "ordered": centre, neighbours, diagonals),
    with `target_fidelity` of its mass on it; W_v W_proj = vproj_alpha Z - vproj_beta I."""
    o = options
    sample = z_sampler("uniform", generator)
    layers = adapter.layers()
    all_offsets = []
    for layer in layers:
        check_kernel_size(kernel_size, layer.window)
        offsets = assign_offsets(layer.num_heads, kernel_size, o.assignment, generator)
        area = layer.window[0] * layer.window[1]
        peak = math.log(o.target_fidelity * (area - 1) / (1 - o.target_fidelity))
        table = layer.bias_table
        table.zero_()
        for head, offset in enumerate(offsets):
            table[_table_entry(layer, offset), head] = peak
        write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
        all_offsets.append(offsets)
    return adapter.measured_layers(kernel_size, all_offsets)


def _table_entry(layer: SwinWindowLayer, offset: Offset) -> int:
    """Row of the bias table that timm adds to the logit of query p for key p + offset."""
    dy, dx = offset
    cols = layer.window[1]
    query = (max(0, -dy), max(0, -dx))  # a query whose key p + offset lies inside the window
    key = (query[0] + dy, query[1] + dx)
    return int(layer.attn.relative_position_index[query[0] * cols + query[1], key[0] * cols + key[1]])
