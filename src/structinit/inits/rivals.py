"""Data-free inits published since the paper, each read from its source (docs/methods.md):

- `conditioned` (Saratchandran & Lucey, "Conditioned Initialization for Attention", ICLR 2026
  submission): each head's query and key weights semi-orthogonal (condition number 1), the value weights
  the rectangular identity; the output projection and every other layer as the base leaves them.
- `sinusoidal` (arXiv 2505.12909): every Linear and Conv weight deterministic, row i of an (n_out, n_in)
  matrix sin((i+1)(2 pi j / n_in + 2 pi / n_out)), scaled to Glorot's variance 2 / (n_in + n_out); biases 0;
  a fused qkv weight as three matrices; embeddings and norms as the model made them.
- `mimetic-vo`: mimetic's V/O half alone (modded-nanogpt PR #214): W_v = sqrt(beta) I + noise and
  W_proj = -sqrt(beta) I + noise, so the value path x W_v^T W_proj^T is about -beta x; Q/K left as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..adapters import ModelAdapter
from ..report import LayerReport
from .options import MethodOptions, base, factor
from .solvers import orthonormal_basis


@dataclass(frozen=True)
class ConditionedOptions(MethodOptions):
    """Conditioned init: semi-orthogonal Q/K per head, identity V."""

    what: ClassVar[str] = "the conditioned init"
    method: ClassVar[str | None] = "conditioned"
    base: str = base()


@dataclass(frozen=True)
class SinusoidalOptions(MethodOptions):
    """Sinusoidal init: deterministic; it takes no options beyond the base of what it does not set."""

    what: ClassVar[str] = "the sinusoidal init"
    method: ClassVar[str | None] = "sinusoidal"
    base: str = base()


@dataclass(frozen=True)
class MimeticVOOptions(MethodOptions):
    """mimetic's V/O half: W_v W_proj ~ -beta I, with noise."""

    what: ClassVar[str] = "mimetic's V/O half"
    method: ClassVar[str | None] = "mimetic-vo"
    beta: float = factor(0.05, "W_proj W_v ~ -beta I (modded-nanogpt's 0.05)", low=0)
    noise: float = factor(0.01, "std of the Gaussian noise added to W_v and to W_proj", low=0)
    base: str = base()


def init_conditioned(
    adapter: ModelAdapter, generator: torch.Generator, *, kernel_size: int, options: ConditionedOptions
) -> list[LayerReport]:
    """Per layer, W_q and W_k the rows of an orthogonal D x D draw each (every head's rows orthonormal: its
    singular values all 1) and W_v the identity's first rows (each head reads its own coordinates)."""
    for layer in adapter.layers():
        for weight in layer.qk_weights():
            weight.copy_(_orthonormal_rows(*weight.shape, generator).to(weight.dtype))
        wv = layer.value_weights()[0]
        wv.copy_(torch.eye(*wv.shape, dtype=wv.dtype))
    return adapter.measured_layers(kernel_size)


def check_conditioned(adapter: ModelAdapter, options: ConditionedOptions) -> None:
    """Refused before any write: Q/K of more rows than inputs, which no rows can make orthonormal."""
    for layer in adapter.layers():
        rows, cols = layer.qk_weights()[0].shape
        if rows > cols:
            raise ValueError(f"conditioned: {rows} query rows over {cols} inputs cannot be orthonormal")


def _orthonormal_rows(rows: int, cols: int, generator: torch.Generator) -> torch.Tensor:
    """A (rows, cols) matrix with orthonormal rows (rows <= cols) from a Gaussian draw (QR, signs fixed)."""
    gaussian = torch.randn(cols, rows, generator=generator, dtype=torch.float64)
    return orthonormal_basis(gaussian).T.float()


def init_sinusoidal(
    adapter: ModelAdapter, generator: torch.Generator, *, kernel_size: int, options: SinusoidalOptions
) -> list[LayerReport]:
    """Every Linear and Conv weight of the model sinusoidal (a fused qkv as its three matrices), biases 0."""
    fused = _fused_qkv(adapter)
    for module in adapter.model.modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            weight = module.weight.view(module.weight.shape[0], -1)
            parts = 3 if fused.get(module.weight.data_ptr()) == weight.shape[0] else 1
            for block in weight.chunk(parts):
                block.copy_(sinusoid(*block.shape).to(block.dtype))
            if module.bias is not None:
                module.bias.zero_()
    return adapter.measured_layers(kernel_size)


def _fused_qkv(adapter: ModelAdapter) -> dict[int, int]:
    """Where each layer's query rows begin -> the rows a weight holding its query, key and value rows has
    (timm's fused qkv: a module's weight that starts there with that many rows is one)."""
    return {query.data_ptr(): 3 * query.shape[0] for query in (layer.qk_weights()[0] for layer in adapter.layers())}


def sinusoid(rows: int, cols: int) -> torch.Tensor:
    """The (rows, cols) sinusoidal matrix: row i is sin((i+1) (2 pi j / cols + 2 pi / rows)), scaled so that
    its entries' (unbiased) variance is Glorot's 2 / (rows + cols)."""
    i = torch.arange(1, rows + 1, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(cols, dtype=torch.float64).unsqueeze(0)
    raw = torch.sin(i * (2 * math.pi * j / cols + 2 * math.pi / rows))
    return (raw * math.sqrt(2.0 / (rows + cols) / raw.var())).float()


def init_mimetic_vo(
    adapter: ModelAdapter, generator: torch.Generator, *, kernel_size: int, options: MimeticVOOptions
) -> list[LayerReport]:
    """Per layer, W_v = sqrt(beta) I + N(0, noise^2) and W_proj = -sqrt(beta) I + N(0, noise^2)."""
    root = math.sqrt(options.beta)
    for layer in adapter.layers():
        for weight, sign in zip(layer.value_weights(), (1.0, -1.0)):
            noise = torch.randn(weight.shape, generator=generator) * options.noise
            weight.copy_((sign * root * torch.eye(*weight.shape) + noise).to(weight.dtype))
    return adapter.measured_layers(kernel_size)
