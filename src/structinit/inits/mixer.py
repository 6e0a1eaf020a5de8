"""Impulse init for MLP-Mixer's token-mixing MLP: each block's token mixing starts as a depthwise
impulse convolution, output token p = input token p + delta.

The token MLP is fc2(act(fc1(x))) over the N tokens, shared by every channel, so one block can
hold one filter: block i gets offset delta_i (every offset of the f x f kernel once before any
repeats, over the blocks). Hidden unit p reads token p + delta with weight 1 and bias c: with
c = `unit_bias` (3), act(x + c) = GELU(x + c) is nearly linear over the range of a layer-normalised
input (slope 1.00-1.09 for |x| < 2), and fc2 maps unit p back to token p, minus act(c), so that the
MLP answers a unit impulse on token p + delta with ~1 at token p and exactly 0 elsewhere. Tokens
whose neighbour falls off the grid get nothing (a convolution's zero padding). The spare hidden
units (fc1 has more rows than tokens) keep their fc1 rows and start silent (zero fc2 columns); their
fc2 columns get gradients from the first step. Needs at least N hidden units.
"""

from __future__ import annotations

import torch

from ..adapters.mixer import MixerAdapter
from ..offsets import assign_offsets, check_kernel_size, target_indices
from ..report import LayerReport
from .options import MixerImpulseOptions


def check_mixer_impulse(adapter: MixerAdapter, options: MixerImpulseOptions) -> None:
    """The refusal of init_mixer_impulse, before anything is written: a token-mixing MLP with fewer
    hidden units than tokens."""
    for i, mlp in enumerate(adapter.token_mlps()):
        tokens, hidden = mlp.fc1.in_features, mlp.fc1.out_features
        if hidden < tokens:
            raise ValueError(
                f"block {i}'s token-mixing MLP has {hidden} hidden units for {tokens} tokens; the impulse init "
                "routes each token through its own unit (create the model with mlp_ratio[0] * dim >= tokens)"
            )


def init_mixer_impulse(
    adapter: MixerAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: MixerImpulseOptions,
) -> list[LayerReport]:
    """Route each block's token mixing through one offset of the f x f kernel (see the module doc)."""
    assignment, unit_bias = options.assignment, options.unit_bias
    grid = adapter.grid
    check_kernel_size(kernel_size, grid)
    mlps = adapter.token_mlps()
    offsets = assign_offsets(len(mlps), kernel_size, assignment, generator)
    for mlp, offset in zip(mlps, offsets):
        fc1, fc2 = mlp.fc1, mlp.fc2
        tokens = fc1.in_features
        target, valid = target_indices([offset], grid)
        rows = torch.arange(tokens)[valid[0]]
        fc1.weight[:tokens] = 0.0
        fc1.weight[rows, target[0, valid[0]]] = 1.0
        fc1.bias[:tokens] = unit_bias
        fc2.weight.zero_()
        fc2.weight[rows, rows] = 1.0
        rest = mlp.act(torch.tensor(unit_bias, dtype=fc2.bias.dtype, device=fc2.bias.device))
        fc2.bias.zero_()
        fc2.bias[rows] = -rest
    return adapter.measured_layers(kernel_size, offsets)
