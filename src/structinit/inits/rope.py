"""Impulse init for rotary ViTs (timm's Eva with RoPE), through the rotation: every grid token gets
the same q and k per head (the rotated constant), so that RoPE alone decides where each query looks.

RoPE turns pair j of q and k at grid token p by angle theta_j(p), linear in p's coordinates. With
q_p = q and k_p = k for every grid token, the logit of query p and key p + u is
sum_j |q_j| |k_j| cos(theta_j(p + u) - theta_j(p) - phi_j), phi_j the angle from k's pair j to q's:
it depends on u only. Setting q's pair j to k's turned by alpha_j = theta_j(p + delta) - theta_j(p)
puts every cosine at 1 for u = delta, the largest logit of the row; each head's gain then sets its
fidelity exactly. The constant comes from the LayerNorm in front of the attention: its bias gets mean
1, which its centred output never has, and Q/K read that direction alone (docs/methods.md derives it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..adapters.rope import RopeAttentionLayer, RopeEvaAdapter
from ..offsets import Offset, assign_offsets, target_indices
from ..report import LayerReport
from .impulse import content_basis
from .options import MethodOptions, assignment, base, target_fidelity, vproj_alpha, vproj_beta
from .solvers import balanced_factors, gain_for_fidelity
from .weights import write_value_proj, z_sampler


@dataclass(frozen=True)
class RopeImpulseOptions(MethodOptions):
    """Impulse init of rotary ViTs, through their rotation (inits/rope.py)."""

    what: ClassVar[str] = "the rotary impulse init"
    method: ClassVar[str | None] = "impulse"
    assignment: str = assignment()
    target_fidelity: float = target_fidelity()
    vproj_alpha: float = vproj_alpha()
    vproj_beta: float = vproj_beta()
    base: str = base()


def check_rope_impulse(adapter: RopeEvaAdapter, options: RopeImpulseOptions) -> None:
    """The refusals of init_rope_impulse, before anything is written."""
    for i, (block, layer) in enumerate(zip(adapter.model.blocks, adapter.layers())):
        where = f"block {i} ({type(block).__name__})"
        if layer.post_norm:
            raise ValueError(f"{where} is post-norm: the rotary impulse init reads the LayerNorm in front of RoPE")
        if not isinstance(layer.norm, nn.LayerNorm) or layer.norm.bias is None:
            raise ValueError(
                f"{where} normalises with {type(layer.norm).__name__}: the rotary impulse init needs a LayerNorm "
                "with a bias in front of the attention (its constant direction carries q and k)"
            )
        if not isinstance(layer.attn.q_norm, nn.Identity):
            raise ValueError(f"{where} normalises q and k (qk_norm): the rotary impulse init needs them as written")


def check_rope_mimetic(adapter: RopeEvaAdapter, options: MethodOptions) -> None:
    """Mimetic init writes W_q W_k^T per head: refused where heads share their keys (grouped-query)."""
    if any(layer.kv_heads != layer.num_heads for layer in adapter.layers()):
        raise ValueError("mimetic init sets W_q W_k^T per head, and this model's heads share keys (num_kv_heads)")


def init_rope_impulse(
    adapter: RopeEvaAdapter, generator: torch.Generator, *, kernel_size: int, options: RopeImpulseOptions
) -> list[LayerReport]:
    """Each head of each layer attends to one offset of the f x f kernel with `target_fidelity` of its
    mass (measured with the model's rotations); W_v W_proj = vproj_alpha Z - vproj_beta I."""
    o = options
    sample = z_sampler("uniform", generator)
    tokens, grid, prefix = adapter.pseudo_tokens(), adapter.grid, adapter.num_prefix_tokens
    content = content_basis(adapter, centred=True)
    all_offsets = []
    for layer in adapter.layers():
        offsets = assign_offsets(layer.num_heads, kernel_size, o.assignment, generator)
        phases = torch.rand(layer.kv_heads, layer.head_dim // 2, dtype=torch.float64, generator=generator)
        q, k = rotated_constants(layer, offsets, 2 * math.pi * phases, grid)
        gain_q, gain_k = _gains(layer, q, k, offsets, grid, prefix, o.target_fidelity)
        layer.norm.bias.add_(1.0 - layer.norm.bias.mean())  # the constant: mean 1, beside the centred output
        x = layer.norm(tokens.unsqueeze(0))[0].double().cpu()
        _write_reader(layer.qk_weights()[0], q * gain_q, x, 0, content)
        _write_reader(layer.qk_weights()[1], k * gain_k, x, prefix, content)
        for bias in layer.qk_biases():
            if bias is not None:
                bias.zero_()
        _write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
        all_offsets.append(offsets)
    return adapter.measured_layers(kernel_size, all_offsets)


def rotated_constants(
    layer: RopeAttentionLayer, offsets: list[Offset], phases: torch.Tensor, grid: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit-gain q (heads, d) and k (kv heads, d): k's pairs of norm 1 at the given phases, each head's q
    its k turned by alpha_j = theta_j(p0 + delta) - theta_j(p0), p0 the grid's centre token."""
    d, group = layer.head_dim, layer.num_heads // layer.kv_heads
    first, second = _pairs(d, layer.half)
    sin, cos = layer.rope.double().cpu().chunk(2, -1)
    theta = torch.atan2(sin[..., first], cos[..., first])  # (N, d/2) or, mixed, (heads, N, d/2)
    theta = theta.expand(layer.num_heads, *theta.shape[-2:])
    centre = (grid[0] // 2) * grid[1] + grid[1] // 2
    targets = [centre + dy * grid[1] + dx for dy, dx in offsets]
    alpha = torch.stack([theta[h, t] - theta[h, centre] for h, t in enumerate(targets)])
    turned = phases.repeat_interleave(group, dim=0) + alpha
    q, k = torch.zeros(layer.num_heads, d, dtype=torch.float64), torch.zeros(layer.kv_heads, d, dtype=torch.float64)
    q[:, first], q[:, second] = turned.cos(), turned.sin()
    k[:, first], k[:, second] = phases.cos(), phases.sin()
    return q, k


def _pairs(head_dim: int, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The dimensions RoPE turns together: (2j, 2j + 1) interleaved, (j, j + d/2) in timm's half layout."""
    j = torch.arange(head_dim // 2)
    return (j, j + head_dim // 2) if half else (2 * j, 2 * j + 1)


def _gains(
    layer: RopeAttentionLayer,
    q: torch.Tensor,
    k: torch.Tensor,
    offsets: list[Offset],
    grid: tuple[int, int],
    prefix: int,
    fidelity: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors (heads, 1) for q and (kv heads, 1) for k giving each head mean fidelity `fidelity` on the
    logits of the constant q and k, rotated (prefix keys 0, as written); a key head takes the root of
    its query heads' mean gain."""
    n, group = grid[0] * grid[1], layer.num_heads // layer.kv_heads
    rotated_q = layer.turn(q[:, None].expand(-1, n, -1)[None])[0]
    rotated_k = layer.turn(k[:, None].expand(-1, n, -1)[None])[0].repeat_interleave(group, dim=0)
    logits = torch.zeros(layer.num_heads, prefix + n, prefix + n, dtype=torch.float64)
    logits[:, prefix:, prefix:] = layer.scale * rotated_q @ rotated_k.transpose(-1, -2)
    target, valid = target_indices(offsets, grid)
    gain = gain_for_fidelity(logits, target + prefix, valid, prefix, fidelity)
    key = gain.view(layer.kv_heads, group).mean(1).sqrt()
    return (gain / key.repeat_interleave(group)).unsqueeze(1), key.unsqueeze(1)


def _write_reader(
    weight: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, prefix: int, content: torch.Tensor | None
) -> None:
    """Weight (heads * d, D) whose output is rows[h] for every grid token of the pseudo input x (T, D) and
    0 for its `prefix` first tokens: rows[h] times the input's mean (the constant the bias put there, 1),
    plus the smallest map of the centred input, outside the `content` directions (D, m) where given, that
    sends the prefix tokens to 0 and leaves the grid tokens as they are."""
    level = x.mean(1, keepdim=True)
    centred = x - level
    if content is not None:  # then no patch content reaches the map: the grid's rows hold on any image
        centred = centred - (centred @ content) @ content.T
    flat = rows.reshape(-1)  # (heads * d,)
    wanted = torch.zeros(x.shape[0], flat.shape[0], dtype=torch.float64)
    wanted[prefix:] = flat
    correction = torch.linalg.pinv(centred, rtol=1e-6) @ (wanted - level * flat)  # (D, heads * d)
    reader = flat[:, None] * torch.full((1, x.shape[1]), 1.0 / x.shape[1], dtype=torch.float64)
    weight.copy_((reader + correction.T).to(weight))


def _write_value_proj(layer: RopeAttentionLayer, alpha: float, beta: float, sample) -> None:
    """W_v W_proj = alpha Z - beta I, as the ViT impulse init writes it (with grouped k/v heads, each query
    head's W_proj columns are its k/v head's factor over the group size), and W_v blind to the constant."""
    wv, wproj = layer.value_weights()
    dim, group = wv.shape[1], layer.num_heads // layer.kv_heads
    if group == 1:
        write_value_proj(layer, alpha, beta, sample)
    else:
        left, right = balanced_factors(alpha * sample(1, dim)[0] - beta * torch.eye(dim), rank=wv.shape[0])
        wv.copy_(left.T.to(wv))
        heads = right.view(dim, layer.kv_heads, 1, layer.head_dim).expand(-1, -1, group, -1)
        wproj.copy_((heads.reshape(dim, -1) / group).to(wproj))
    wv.sub_(wv.mean(1, keepdim=True))
