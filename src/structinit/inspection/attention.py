"""`structinit attention`: the attention maps of a run (at init or trained) or of an initialised model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from matplotlib.colors import PowerNorm

from ..adapters import get_adapter
from ..data.batches import normalised_test_images
from ..files import fitted_title, save_figure
from ..measure import mean_attention
from ..report import best_offsets
from .target import load_target

# one colour scale for every attention panel, whatever its layer, init or figure; the square root spreads
# the low weights (a uniform map's 1/N) apart from 0 without hiding an impulse's weight near 1
SCALE = PowerNorm(gamma=0.5, vmin=0, vmax=1)


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
    pseudo_input: bool = False,
) -> Path:
    """Average the attention maps over `images` test images (or take them on the pseudo input, the
    position embedding without an image, where an init's fidelity is measured) and draw them per layer
    and head.

    `target` is a run directory (the model of its config.yaml, with the weights of last.pt unless
    `at_init`) or a timm model name / preset, initialised with `init`.
    """
    model, dataset, title, config = load_target(
        target, data=data, at_init=at_init, init=init, model_kwargs=model_kwargs, seed=seed
    )
    batch = None if pseudo_input else normalised_test_images(model, dataset, images)
    maps = mean_attention(model, batch)
    grid = get_adapter(model).grid
    kernel_size = config.init_spec.kernel_size or 3
    heads = [best_offsets(m.unsqueeze(0), kernel_size, grid, 0) for m in maps]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    where = (
        "attention on the pseudo input (no image)" if batch is None else f"mean attention over {len(batch)} test images"
    )
    plot_attention(maps, grid, out, f"{title}: {where}", heads, kernel_size, dpi, on_images=batch is not None)
    return out


def plot_attention(
    maps: list[torch.Tensor],
    grid: tuple[int, int],
    path: Path,
    title: str = "",
    heads: list[list[Any]] | None = None,
    kernel_size: int = 3,
    dpi: int = 110,
    on_images: bool = True,
) -> None:
    """Attention maps (one (heads, N, N) tensor of grid tokens per layer) as a layers x heads figure:
    query token down, key token across. Every panel of every figure is on one colour scale, SCALE (0 to
    1), whose colourbar marks the uniform weight 1/N: a uniform map is dark, an impulse bright. An
    impulse filter with offset (dy, dx) is a diagonal shifted off the main one by dy * width + dx.
    `heads[layer][head]`, a HeadReport, titles each panel with the kernel offset that holds the most
    of the head's attention and that share (`on_images`: the maps are of images, else of the pseudo input)."""
    layers, count = len(maps), maps[0].shape[0]
    tokens = maps[0].shape[-1]
    fig, axes = plt.subplots(
        layers, count, figsize=(1.55 * count + 1.4, 1.6 * layers + 1.0), squeeze=False, constrained_layout=True
    )
    image = None
    for i, layer_maps in enumerate(maps):
        for h in range(count):
            ax = axes[i][h]
            image = ax.imshow(layer_maps[h].float().cpu().numpy(), cmap="viridis", norm=SCALE, interpolation="nearest")
            ax.set_xticks([0, tokens - 1], ["0", str(tokens - 1)] if i == layers - 1 else ["", ""], fontsize=6)
            ax.set_yticks([0, tokens - 1], ["0", str(tokens - 1)] if h == 0 else ["", ""], fontsize=6)
            ax.tick_params(length=2, pad=1)
            if heads is not None:
                report = heads[i][h]
                dy, dx = report.offset
                ax.set_title(f"h{h} ({dy:+d},{dx:+d}) share {report.fidelity:.2f}", fontsize=7, pad=2)
            elif i == 0:
                ax.set_title(f"head {h}", fontsize=7)
            if h == 0:
                ax.set_ylabel(f"layer {i}\nquery token", fontsize=7)
            if i == layers - 1:
                ax.set_xlabel("key token", fontsize=7)
    bar = fig.colorbar(image, ax=axes, shrink=min(0.9, 0.35 + 0.1 * layers), label="attention weight")
    bar.ax.axhline(1 / tokens, color="white", linewidth=2)
    bar.set_ticks([0, 1 / tokens, 0.25, 0.5, 1], labels=["0", f"uniform 1/{tokens}", "0.25", "0.5", "1"])
    lines = [title] if title else []
    lines.append(f"query and key tokens in raster order over the {grid[0]} x {grid[1]} patch grid")
    if heads is not None:
        f = kernel_size
        share = (
            "its share on these images (an init's fidelity, as structinit init prints it, is that share on the "
            "pseudo input: the position embedding without an image; images lower it)"
            if on_images
            else "its share: the init's fidelity, as structinit init prints it (images lower it)"
        )
        lines.append(f"panel: head, the offset (dy,dx) of the {f}x{f} kernel with the most attention, and {share}")
    size = 8 if count < 6 else 9
    fig.suptitle(fitted_title("\n".join(lines), fig.get_figwidth(), size), fontsize=size)
    save_figure(fig, path, dpi)
    plt.close(fig)
