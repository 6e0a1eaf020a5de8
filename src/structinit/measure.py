"""Fidelity: how much of each head's attention sits on one convolution offset.

For a head and an offset delta, fidelity is the mean softmax mass that queries p put on key
p + delta, over the queries for which that key exists. An impulse init aims for 1 on its assigned
offset; a uniform map scores 1/T. `fidelity()` measures any model against the best offset per head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .errors import first_line
from .offsets import check_kernel_size
from .report import MEASURED, LayerReport, Report, best_offsets

if TYPE_CHECKING:
    from .adapters import ModelAdapter


def layer_inputs(adapter: ModelAdapter, images: torch.Tensor | None) -> list[torch.Tensor]:
    """The normalised input of every attention layer: for images, that of the real forward pass;
    without images, that of the pseudo input (ModelAdapter.pseudo_inputs)."""
    if images is None:
        return adapter.pseudo_inputs()
    layers = adapter.layers()
    x = adapter.embed(images)
    inputs = []
    for i, layer in enumerate(layers):
        inputs.append(layer.norm(x))
        if i + 1 < len(layers):
            x = adapter.run_block(i, x)
    return inputs


def checked_images(adapter: ModelAdapter, images: torch.Tensor) -> torch.Tensor:
    """`images` on the model's device and dtype, or a ValueError (one line) where they are not images to
    measure attention on: not (B, C, H, W), none, raw integer pixels, not finite."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4:
        raise ValueError(f"images must be a (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}")
    if not len(images):
        raise ValueError("images: none given (a (0, C, H, W) tensor); give at least one")
    if not images.is_floating_point():
        raise ValueError(
            f"images are {images.dtype}: give them as the model takes them, float and normalised "
            "(e.g. (x / 255 - mean) / std, as timm's transforms do)"
        )
    if not bool(torch.isfinite(images).all()):
        raise ValueError("images hold values that are not finite (NaN or inf): attention on them means nothing")
    param = next(adapter.model.parameters())
    return images.to(param.device, param.dtype)


def fitted_inputs(adapter: ModelAdapter, images: torch.Tensor | None) -> list[torch.Tensor]:
    """layer_inputs, where images that do not fit the model (channels, size) are one ValueError."""
    try:
        return layer_inputs(adapter, images)
    except (RuntimeError, AssertionError) as error:
        shape = tuple(images.shape) if images is not None else ()
        raise ValueError(f"images of shape {shape} do not fit the model ({first_line(error)})") from None


def _averaged_attention(adapter: ModelAdapter, images: torch.Tensor | None, batch_size: int) -> list[torch.Tensor]:
    """Per layer, the (heads, T, T) attention maps averaged over `images` (on the pseudo input when
    None), accumulated batch by batch so that memory does not grow with the number of images."""
    if images is not None:
        images = checked_images(adapter, images)
    totals: list[torch.Tensor] = []
    for chunk in [None] if images is None else images.split(batch_size):
        for i, (layer, x) in enumerate(zip(adapter.layers(), fitted_inputs(adapter, chunk))):
            summed = layer.attention(x).float().sum(0)
            if i == len(totals):
                totals.append(summed)
            else:
                totals[i] += summed
    count = 1 if images is None else len(images)
    return [total / count for total in totals]


@torch.no_grad()
def fidelity(
    model: nn.Module, images: torch.Tensor | None = None, *, kernel_size: int = 3, batch_size: int = 32
) -> Report:
    """Measure every head's attention against its best offset of an f x f kernel.

    Without `images`, on the pseudo input (each layer's norm of the position embedding plus prefix
    tokens). With `images` (B, C, H, W, already normalised as the model expects), on the real forward
    pass: the first layer sees patch embeddings plus position embedding, later layers what the model
    feeds them. Works for any supported model, whatever its init.
    """
    from .adapters import get_adapter

    adapter = get_adapter(model)
    check_kernel_size(kernel_size, adapter.grid)
    maps = _averaged_attention(adapter, images, batch_size)
    layers = [
        LayerReport(i, best_offsets(m.unsqueeze(0), kernel_size, adapter.grid, adapter.num_prefix_tokens))
        for i, m in enumerate(maps)
    ]
    source = "pseudo input" if images is None else f"{len(images)} images"
    return Report(MEASURED, type(model).__name__, layers, measured_on=source, options={"kernel_size": kernel_size})


def measure_on_images(report: Report, model: nn.Module, images: torch.Tensor, kernel_size: int = 3) -> Report:
    """`report` with its fidelity on `images` (normalised as the model expects) beside the pseudo input's,
    against the best offsets of the f x f kernel (Report.on_images; shown by str(report))."""
    measured = fidelity(model, images, kernel_size=kernel_size)
    from .adapters import get_adapter

    heads = [len(layer.heads) for layer in report.layers]
    if heads != [len(layer.heads) for layer in measured.layers]:
        raise ValueError(
            f"the report describes {len(heads)} layers of {heads} heads, the model {len(measured.layers)} layers: "
            "give the report initialize returned for this model"
        )
    adapter = get_adapter(model)
    tokens = adapter.grid[0] * adapter.grid[1] + adapter.num_prefix_tokens
    report.on_images = {
        "images": len(images),
        "mean": measured.mean_fidelity,
        "min": measured.min_fidelity,
        "uniform": 1 / tokens,
    }
    return report


@torch.no_grad()
def mean_attention(model: nn.Module, images: torch.Tensor | None = None, batch_size: int = 32) -> list[torch.Tensor]:
    """Per layer, the (heads, N, N) attention among grid tokens, averaged over `images` (or on the
    pseudo input when None): what the attention figure shows."""
    from .adapters import get_adapter

    adapter = get_adapter(model)
    prefix = adapter.num_prefix_tokens
    return [m[:, prefix:, prefix:] for m in _averaged_attention(adapter, images, batch_size)]


@torch.no_grad()
def attention_entropy(model: nn.Module, images: torch.Tensor) -> float:
    """Mean over layers, heads, queries and images of each attention row's entropy over log(T):
    1 is uniform attention, 0 one-hot (how sharp an init's maps are on real images)."""
    from .adapters import get_adapter

    adapter = get_adapter(model)
    values = []
    for layer, x in zip(adapter.layers(), fitted_inputs(adapter, checked_images(adapter, images))):
        attn = layer.attention(x).float().clamp_min(1e-12)
        values.append((-(attn * attn.log()).sum(-1) / torch.log(torch.tensor(float(attn.shape[-1])))).mean())
    return float(torch.stack(values).mean())
