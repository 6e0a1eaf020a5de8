"""`structinit attention`: the attention maps of a run (at init or trained) or of an initialised model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from ..adapters import get_adapter
from ..data.batches import normalised_test_images
from ..fidelity import mean_attention
from ..files import save_figure
from ..report import best_offsets
from .target import load_target


def attention_figure(
    target: str,
    *,
    data: str | None = None,
    images: int = 64,
    at_init: bool = False,
    init: str = "impulse",
    model_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    out: str | Path = "attention.png",
    dpi: int = 110,
) -> Path:
    """Average the attention maps over `images` test images and draw them per layer and head.

    `target` is a run directory (the model of its config.yaml, with the weights of last.pt unless
    `at_init`) or a timm model name / preset, initialised with `init`.
    """
    model, dataset, title, config = load_target(
        target, data=data, at_init=at_init, init=init, model_kwargs=model_kwargs, seed=seed
    )
    batch = normalised_test_images(model, dataset, images)
    maps = mean_attention(model, batch)
    grid = get_adapter(model).grid
    kernel_size = config.init_spec.kernel_size or 3
    heads = [best_offsets(m.unsqueeze(0), kernel_size, grid, 0) for m in maps]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    title = f"{title}: mean attention over {len(batch)} test images"
    plot_attention(maps, grid, out, title, heads=heads, kernel_size=kernel_size, dpi=dpi)
    return out


def plot_attention(
    maps: list[torch.Tensor],
    grid: tuple[int, int],
    path: Path,
    title: str = "",
    heads: list[list[Any]] | None = None,
    kernel_size: int = 3,
    dpi: int = 110,
) -> None:
    """Attention maps (one (heads, N, N) tensor of grid tokens per layer) as a layers x heads figure:
    query token down, key token across, all panels on one colour scale with its colourbar. An
    impulse filter with offset (dy, dx) is a diagonal shifted off the main one by dy * width + dx.
    `heads[layer][head]`, a HeadReport, titles each panel with the kernel offset that holds the most
    of the head's attention and that share."""
    layers, count = len(maps), maps[0].shape[0]
    tokens = maps[0].shape[-1]
    top = max(float(m.max()) for m in maps) or 1e-6
    fig, axes = plt.subplots(
        layers, count, figsize=(1.55 * count + 1.4, 1.6 * layers + 1.0), squeeze=False, constrained_layout=True
    )
    image = None
    for i, layer_maps in enumerate(maps):
        for h in range(count):
            ax = axes[i][h]
            image = ax.imshow(
                layer_maps[h].float().cpu().numpy(), cmap="viridis", vmin=0, vmax=top, interpolation="nearest"
            )
            ax.set_xticks([0, tokens - 1], ["0", str(tokens - 1)] if i == layers - 1 else ["", ""], fontsize=6)
            ax.set_yticks([0, tokens - 1], ["0", str(tokens - 1)] if h == 0 else ["", ""], fontsize=6)
            ax.tick_params(length=2, pad=1)
            if heads is not None:
                report = heads[i][h]
                dy, dx = report.offset
                ax.set_title(f"h{h} ({dy:+d},{dx:+d}) {report.fidelity:.2f}", fontsize=7, pad=2)
            elif i == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {i}\nquery token", fontsize=7)
            if i == layers - 1:
                ax.set_xlabel("key token", fontsize=7)
    fig.colorbar(image, ax=axes, shrink=min(0.9, 0.35 + 0.1 * layers), label="attention weight")
    lines = [title] if title else []
    lines.append(f"query and key tokens in raster order over the {grid[0]} x {grid[1]} patch grid")
    if heads is not None:
        f = kernel_size
        lines.append(f"panel: head, the offset (dy,dx) of the {f}x{f} kernel with the most attention, and its share")
    fig.suptitle("\n".join(lines), fontsize=8 if count < 6 else 9)
    save_figure(fig, path, dpi)
    plt.close(fig)
