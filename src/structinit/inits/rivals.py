"""Data-free inits published since the paper, each read from its source (docs/methods.md):

- `conditioned` (Saratchandran & Lucey, "Conditioned Initialization for Attention", ICLR 2026
  submission): each head's query and key weights semi-orthogonal (condition number 1), the value weights
  the rectangular identity; the output projection and every other layer as the base leaves them.
- `sinusoidal` (arXiv 2505.12909): every Linear, Conv and attention projection weight deterministic, row i
  of an (n_out, n_in) matrix sin((i+1)(2 pi j / n_in + 2 pi / n_out)), scaled to Glorot's variance
  2 / (n_in + n_out); biases 0; a fused qkv weight (nn.MultiheadAttention's in_proj_weight too) as three
  matrices; embeddings, norms and layer scales as the model made them (no seed reaches them).
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
    """Every Linear, Conv and attention projection weight of the model sinusoidal (a fused qkv, or
    nn.MultiheadAttention's in_proj, as its three matrices), every bias 0; norms, layer scales and
    embeddings as the model (or the base) made them."""
    blocks, biases = _sinusoidal_plan(adapter)
    matrices: dict[tuple[int, int], torch.Tensor] = {}  # a ViT repeats a few shapes in every block
    for _, block in blocks:
        shape = (block.shape[0], block.shape[1])
        if shape not in matrices:
            matrices[shape] = sinusoid(*shape)
        block.copy_(matrices[shape].to(block.dtype))
    for bias in biases:
        bias.zero_()
    return adapter.measured_layers(kernel_size)


def check_sinusoidal(adapter: ModelAdapter, options: SinusoidalOptions) -> None:
    """Refused before any write: a parameter the init would leave unset without saying so, or a matrix
    whose sinusoid is all zeros (_sinusoidal_plan)."""
    _sinusoidal_plan(adapter)


# the modules whose weights the source sets (its sinusoidal_init), and their weights' names
SINUSOIDAL_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.MultiheadAttention)
PROJECTIONS = ("weight", "in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")


def _sinusoidal_plan(adapter: ModelAdapter) -> tuple[list[tuple[str, torch.Tensor]], list[torch.Tensor]]:
    """(name, (rows, cols) view) of every matrix the init writes, and every bias it zeroes; a ValueError,
    before any write, naming a parameter that is none of these, a norm's, a layer scale or an embedding
    (the init would leave it as it is), or a matrix of at most 2 x 2, whose sinusoid is all zeros."""
    model = adapter.model
    embeddings = {id(t) for t in (adapter.position_embedding(), *adapter.prefix_tokens()) if t is not None}
    fused = _fused_qkv(adapter)
    blocks, biases = [], []
    for prefix, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            where = f"{prefix}.{name}" if prefix else name
            if isinstance(module, SINUSOIDAL_MODULES) and name in PROJECTIONS:
                matrix = param.view(param.shape[0], -1)
                parts = 3 if fused.get(param.data_ptr()) == matrix.shape[0] else 1
                blocks += [(where, block) for block in matrix.chunk(parts)]
            elif _kept(module, name) or id(param) in embeddings:
                continue
            elif name.endswith("bias"):  # a Linear's, or a fused qkv's own (Eva's q_bias and v_bias)
                biases.append(param)
            else:
                raise ValueError(
                    f"sinusoidal sets Linear, Conv and attention projection weights (biases 0) and keeps norms, "
                    f"layer scales and embeddings; this model's {where} ({type(module).__name__}) is none of "
                    "these and would be left as it is: initialise the model with another init"
                )
    for where, block in blocks:
        if all_zero_sinusoid(*block.shape):
            raise ValueError(
                f"sinusoidal: the {block.shape[0]} x {block.shape[1]} matrix of {where} is all zeros in the "
                "formula (every phase a multiple of pi), so no scale gives it Glorot's variance: widen the layer "
                "or initialise the model with another init"
            )
    return blocks, biases


def _kept(module: nn.Module, name: str) -> bool:
    """Whether the source leaves this parameter as the model made it: a norm's (LayerNorm, RmsNorm, ...),
    a layer scale (timm's LayerScale, Eva's gamma_1 and gamma_2, Dinov2's) or an nn.Embedding's."""
    kind = type(module).__name__
    return "Norm" in kind or "LayerScale" in kind or name in ("gamma_1", "gamma_2") or isinstance(module, nn.Embedding)


def _fused_qkv(adapter: ModelAdapter) -> dict[int, int]:
    """Where each layer's query rows begin -> the rows a weight holding its query, key and value rows has
    (timm's fused qkv, nn.MultiheadAttention's in_proj_weight: a weight that starts there with that many
    rows is one, written as its three matrices, as the source splits in_proj_weight)."""
    return {query.data_ptr(): 3 * query.shape[0] for query in (layer.qk_weights()[0] for layer in adapter.layers())}


def all_zero_sinusoid(rows: int, cols: int) -> bool:
    """Whether every entry of the (rows, cols) sinusoid is 0: its row `rows`, column 0 is sin(2 pi) = 0
    in every shape, so a constant matrix is all zeros, and that is when rows and cols are both at most 2
    (every phase i (j / cols + 1 / rows) a multiple of 1/2)."""
    return rows <= 2 and cols <= 2


def sinusoid(rows: int, cols: int) -> torch.Tensor:
    """The (rows, cols) sinusoidal matrix: row i is sin(2 pi i (j / cols + 1 / rows)), i = 1..rows, scaled so
    that its entries' (unbiased) variance is Glorot's 2 / (rows + cols). Each phase is reduced in integers
    (i (j rows + cols) modulo rows cols), so a multiple of pi is an exact 0, not sin's rounding of it."""
    if all_zero_sinusoid(rows, cols):
        raise ValueError(f"the {rows} x {cols} sinusoid is all zeros: no scale gives it Glorot's variance")
    period = rows * cols
    i = torch.arange(1, rows + 1, dtype=torch.int64).unsqueeze(1)
    j = torch.arange(cols, dtype=torch.int64).unsqueeze(0)
    phase = i * (j * rows + cols) % period  # the entry is sin(2 pi phase / period)
    raw = torch.sin(2 * math.pi * phase.double() / period).masked_fill(2 * phase % period == 0, 0.0)
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
