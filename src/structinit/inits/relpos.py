"""Impulse init of the relative-position families (Swin v1: adapters/swin.py; the others: adapters/relpos.py,
adapters/swin_v2.py): their tokens carry no position, so the impulse goes into the bias where it lives.

Head h with offset delta gets bias b on every pair (p, p + delta) and one lower value on every other
pair. With content logits that do not depend on the key (a uniform image), query p then puts
e^b / (e^b + K - 1) of its mass on key p + delta among K keys, so b = log(f (K - 1) / (1 - f)) gives
fidelity f. A bias table: the entry of delta is b, every other 0. A bias MLP, out = fc2(ReLU(fc1(c)))
over relative coordinates c: fc1 gets, per head, three units that make a hat along a direction u that
separates c_delta from every other coordinate by g, (relu(t - t_d + g) - 2 relu(t - t_d) +
relu(t - t_d - g)) / g with t = u.c, which is 1 at c_delta and exactly 0 at the others, and one constant
unit (weight 0, bias 1); fc2 reads hat * (z_hi - z_lo) + z_lo. Without a squash z_hi = b, z_lo = 0;
through Swin v2's 16 sigmoid, z_hi = -z_lo = logit((16 + b) / 32). The map is then the impulse exactly,
up to float32 rounding. Spare hidden units keep their fc1 rows and start silent (zero fc2 columns).
Layers that share one bias (vit_srelpos, BEiT's shared bias) share its offsets. Q and K keep their
weights (timm's trunc-normal 0.02 gives logits ~100x smaller than b: the bias decides at init, Q/K are
free to learn content attention); V/proj take the mimetic form. A query whose p + delta leaves its
window has no target (a convolution's zero padding). docs/methods.md has the reasons and the fidelity.
"""

from __future__ import annotations

import math
import warnings

import torch

from ..adapters.relpos_base import BiasMlp, BiasTable, RelPosAdapter, RelPosLayer
from ..offsets import Offset, assign_offsets
from ..report import LayerReport
from .options import SwinImpulseOptions
from .weights import write_value_proj, z_sampler

_DIRECTIONS = 64  # candidate directions u for the hats, angles pi (k + 0.37) / 64: none along a lattice row


def check_relpos_impulse(adapter: RelPosAdapter, options: SwinImpulseOptions) -> None:
    """The refusals of init_relpos_impulse, before anything is written: a bias MLP without room for its
    hats, or a target its squashed output cannot reach."""
    for i, layer in enumerate(adapter.layers()):
        source = layer.source
        if not isinstance(source, BiasMlp):
            continue
        hidden = source.fc1.out_features
        if hidden < 3 * layer.num_heads + 1 or source.fc1.bias is None:
            unbiased = "" if source.fc1.bias is not None else " without bias"
            raise ValueError(
                f"layer {i}'s position MLP has {hidden} hidden units{unbiased}; the impulse init needs 3 per head "
                f"plus one ({3 * layer.num_heads + 1}), with a bias"
            )
        keys = layer.window[0] * layer.window[1] + layer.num_prefix
        if source.gain is not None and keys > 1 and _peak(options.target_fidelity, keys) >= source.gain:
            reach = math.exp(source.gain) / (math.exp(source.gain) + keys - 1)
            raise ValueError(
                f"target_fidelity must be below {reach:.6f} for layer {i}: its bias is {source.gain:g} sigmoid(MLP), "
                f"at most {source.gain:g} above the other keys' among {keys}"
            )


def init_relpos_impulse(
    adapter: RelPosAdapter, generator: torch.Generator, *, kernel_size: int, options: SwinImpulseOptions
) -> list[LayerReport]:
    """Each head of each layer attends to one offset of the f x f kernel (`assignment` as for the ViT; one
    draw per shared bias) with `target_fidelity` of its mass; W_v W_proj = vproj_alpha Z - vproj_beta I."""
    o = options
    sample = z_sampler("uniform", generator)
    offsets_of: dict[int, list[Offset]] = {}  # per bias source
    all_offsets = []
    for layer in adapter.layers():
        if layer.source.key not in offsets_of:
            offsets_of[layer.source.key] = assign_offsets(layer.num_heads, kernel_size, o.assignment, generator)
            _write_bias(layer, offsets_of[layer.source.key], o.target_fidelity)
        write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
        all_offsets.append(offsets_of[layer.source.key])
    _warn_if_dropout(adapter)
    return adapter.measured_layers(kernel_size, all_offsets)


def _warn_if_dropout(adapter: RelPosAdapter) -> None:
    """Warn where a bias MLP drops hidden units in training: a dropped hat unit breaks the cancellation
    that makes its hat 0 away from its offset, so the maps are the impulse in eval mode only."""
    dropout = max((s.dropout for s in adapter.sources() if isinstance(s, BiasMlp)), default=0.0)
    if dropout > 0:
        warnings.warn(
            f"impulse init: this model's position MLP drops {dropout:.1%} of its hidden units in training, which "
            "blurs the impulse there (docs/methods.md measures it); set that dropout to 0 or use a bias table "
            "(vit_relpos: rel_pos_type='bias')",
            stacklevel=5,
        )


def _peak(fidelity: float, keys: int) -> float:
    """The bias above the other keys' that puts `fidelity` of a row's mass on one of `keys` keys."""
    return math.log(fidelity * (keys - 1) / (1 - fidelity))


def _write_bias(layer: RelPosLayer, offsets: list[Offset], fidelity: float) -> None:
    source, keys = layer.source, layer.window[0] * layer.window[1] + layer.num_prefix
    if keys == 1:  # a 1 x 1 window (a last stage smaller than the window): every map is the impulse at (0, 0)
        return
    rows = [_pair_row(layer, offset) for offset in offsets]
    peak = _peak(fidelity, keys)
    if isinstance(source, BiasTable):
        source.table.zero_()
        for head, row in enumerate(rows):
            source.table[row, head] = peak
        return
    if source.gain is None:
        high, low = peak, 0.0
    else:
        share = (source.gain + peak) / (2 * source.gain)
        high = math.log(share / (1 - share))
        low = -high
    _write_hats(source, rows, high, low)


def _pair_row(layer: RelPosLayer, offset: Offset) -> int:
    """The row of the layer's bias source that the pairs (p, p + offset) read."""
    dy, dx = offset
    cols = layer.window[1]
    query = (max(0, -dy), max(0, -dx))  # a query whose key p + offset lies inside the window
    key = (query[0] + dy, query[1] + dx)
    return int(layer.source.rows[query[0] * cols + query[1], key[0] * cols + key[1]])


def _write_hats(source: BiasMlp, rows: list[int], high: float, low: float) -> None:
    """fc1/fc2 so that output h is `high` at the coordinates of rows[h] and `low` at every other."""
    coords = source.coords.detach().double().cpu()
    fc1, fc2 = source.fc1, source.fc2
    weight, bias = fc1.weight.detach().double().cpu(), fc1.bias.detach().double().cpu()
    readout = torch.zeros(fc2.weight.shape, dtype=torch.float64)
    for head, row in enumerate(rows):
        u, centre, gap = _separating_direction(coords, coords[row])
        units = slice(3 * head, 3 * head + 3)
        weight[units] = u
        bias[units] = torch.tensor([gap - centre, -centre, -gap - centre], dtype=torch.float64)
        readout[head, units] = torch.tensor([1.0, -2.0, 1.0], dtype=torch.float64) * (high - low) / gap
    constant = 3 * len(rows)
    weight[constant], bias[constant] = 0.0, 1.0
    readout[:, constant] = low
    fc1.weight.copy_(weight), fc1.bias.copy_(bias), fc2.weight.copy_(readout)
    if fc2.bias is not None:
        fc2.bias.zero_()


def _separating_direction(coords: torch.Tensor, point: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """(u, u.point, g): of the candidate unit directions, the one whose projection keeps every other
    coordinate farthest (at least g) from the point's."""
    others = coords[(coords - point).norm(dim=1) > 1e-9] - point
    angles = math.pi * (torch.arange(_DIRECTIONS, dtype=torch.float64) + 0.37) / _DIRECTIONS
    directions = torch.stack([angles.cos(), angles.sin()], dim=1)
    gaps = (others @ directions.T).abs().min(dim=0).values
    best = int(gaps.argmax())
    return directions[best], float(directions[best] @ point), float(gaps[best])
