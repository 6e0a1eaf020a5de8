"""Figures: training curves of a comparison, and attention maps per layer and head (paper Fig. 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    """Per (dataset, per-class) setting, a column of two panels: test top-1 at the evaluated epochs
    and training loss at every epoch (does an init converge faster early, and keep it?). One line
    per init: the mean over seeds, shaded between the lowest and highest seed."""
    settings = sorted({(r["dataset"], str(r["per_class"])) for r in rows})
    fig, axes = plt.subplots(2, len(settings), figsize=(5 * len(settings), 6.4), squeeze=False, sharex="col")
    for column, (dataset, per_class) in enumerate(settings):
        top, bottom = axes[0][column], axes[1][column]
        setting_rows = [r for r in rows if (r["dataset"], str(r["per_class"])) == (dataset, per_class)]
        for init in sorted({r["init"] for r in setting_rows}):
            runs = [r for r in setting_rows if r["init"] == init]
            line = None
            for ax, key in ((top, "curve"), (bottom, "loss_curve")):
                curves = [dict(r[key]) for r in runs]  # epoch -> value
                epochs = np.array(sorted(set.intersection(*(set(c) for c in curves))))  # epochs every run has
                data = np.array([[c[epoch] for epoch in epochs] for c in curves])
                length = len(epochs)
                (line,) = ax.plot(
                    epochs,
                    data.mean(0),
                    label=f"{init} ({len(curves)} seed{'s' if len(curves) > 1 else ''})",
                    color=None if line is None else line.get_color(),
                    marker="o" if length < 6 else None,
                )
                if len(curves) > 1:
                    ax.fill_between(epochs, data.min(0), data.max(0), alpha=0.2, color=line.get_color())
        top.set_title(f"{dataset}, {per_class + ' per class' if per_class else 'all images'}")
        splits = {r.get("split", "test") for r in setting_rows}
        top.set_ylabel(f"{'validation' if splits == {'val'} else 'test'} top-1 (%)")
        bottom.set_ylabel("training loss")
        bottom.set_xlabel("epoch")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_attention(
    maps: list[torch.Tensor],
    grid: tuple[int, int],
    path: Path,
    title: str = "",
    zoom_rows: int = 2,
    dpi: int = 110,
) -> None:
    """Attention maps (one (heads, N, N) tensor of grid tokens per layer) as a layers x heads figure,
    each with an inset that zooms on the top-left corner (the first `zoom_rows` grid rows), where
    an impulse filter shows as a diagonal shifted by its offset."""
    layers, heads = len(maps), maps[0].shape[0]
    fig, axes = plt.subplots(layers, heads, figsize=(1.9 * heads, 1.9 * layers), squeeze=False)
    corner = zoom_rows * grid[1]
    for i, layer_maps in enumerate(maps):
        for h in range(heads):
            ax = axes[i][h]
            image = layer_maps[h].float().cpu().numpy()
            ax.imshow(image, cmap="viridis", vmin=0, vmax=max(image.max(), 1e-6))
            ax.set_xticks([])
            ax.set_yticks([])
            inset = ax.inset_axes([0.55, 0.55, 0.43, 0.43])
            inset.imshow(image[:corner, :corner], cmap="viridis", vmin=0, vmax=max(image.max(), 1e-6))
            inset.set_xticks([])
            inset.set_yticks([])
            for spine in inset.spines.values():
                spine.set_edgecolor("white")
            if i == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(f"layer {i}", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def plot_ranks(ranks, path: Path, title: str = "") -> None:
    """Stable rank per layer (patch embedding, then each block), with min(N, D), the largest
    possible rank, as a dashed line: how far below it the features live."""
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(ranks)), 3.6))
    x = np.arange(len(ranks))
    ax.plot(x, [r.stable_rank for r in ranks], "o-", label="stable rank (mean over images)")
    ax.plot(x, [r.bound for r in ranks], "--", color="grey", label="min(N, D)")
    ax.set_yscale("log")
    ax.set_xticks(x, [r.name.replace("patch embedding", "patch emb.") for r in ranks], rotation=45, ha="right")
    ax.set_ylabel("stable rank")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
