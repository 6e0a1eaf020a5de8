"""Shared pieces of the inits: option checks, the random matrices of mimetic-style targets, and
writing per-head factors into a layer's fused weights."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..adapters import AttentionLayer
from .solvers import balanced_factors


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")


def z_sampler(distribution: str, generator: torch.Generator) -> Callable[[int, int], torch.Tensor]:
    """Draws (n, D, D) float32 matrices with i.i.d. entries of mean 0 and variance 1/D."""
    check_choice("distribution", distribution, ("uniform", "normal"))

    def sample(n: int, dim: int) -> torch.Tensor:
        z = torch.empty(n, dim, dim)
        if distribution == "normal":
            return z.normal_(0.0, 1.0 / math.sqrt(dim), generator=generator)
        bound = math.sqrt(3.0 / dim)
        return z.uniform_(-bound, bound, generator=generator)

    return sample


def write_heads(weight: torch.Tensor, factors: torch.Tensor) -> None:
    """Write per-head factors (heads, D, d) into a (heads * d, D) weight view: rows of head h = factors[h]^T."""
    weight.copy_(factors.transpose(-1, -2).reshape(weight.shape).to(weight.dtype))


def write_value_proj(layer: AttentionLayer, alpha: float, beta: float, sample: Callable) -> None:
    """W_v^T W_proj^T = alpha Z - beta I (x -> x W_v^T W_proj^T is the value path), balanced by SVD."""
    dim = layer.value_weights()[0].shape[1]
    target = alpha * sample(1, dim)[0] - beta * torch.eye(dim)
    rank = layer.value_weights()[0].shape[0]
    write_value_factors(layer, *balanced_factors(target, rank=rank))  # left right^T ~= target


def write_value_factors(layer: AttentionLayer, left: torch.Tensor, right: torch.Tensor) -> None:
    """W_v = left^T, W_proj = right: the value path x W_v^T W_proj^T = x left right^T."""
    wv, wproj = layer.value_weights()
    wv.copy_(left.T.to(wv.dtype))
    wproj.copy_(right.to(wproj.dtype))
