"""Figures: training curves and a bar summary of a comparison, attention maps per layer and head
(paper Fig. 4), and feature ranks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.ticker import MaxNLocator

from .experiments import CELL_KEYS  # the cells of results.md: tables and figures split rows alike

# one colour per init label in every figure, whatever else the grid holds; other labels (with
# options) take a colour from their own text, so they too keep it from figure to figure
INIT_COLOURS = {
    "timm": "tab:blue",
    "mimetic": "tab:orange",
    "impulse": "tab:green",
    "impulse-authors": "tab:red",
    "kaiming": "tab:purple",
    "default": "tab:brown",
}
OTHER_COLOURS = ["tab:pink", "tab:olive", "tab:cyan", "tab:gray", "gold", "navy", "teal", "maroon", "lime", "indigo"]


def init_colour(label: str) -> str:
    if label in INIT_COLOURS:
        return INIT_COLOURS[label]
    digest = int(hashlib.sha256(label.encode()).hexdigest(), 16)
    return OTHER_COLOURS[digest % len(OTHER_COLOURS)]


def cells(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows split into comparable cells (the same data, model, size, epochs, split and recipe:
    only init and seed differ), each with a title; a figure never averages across cells."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(str(row.get(k, "")) for k in CELL_KEYS), []).append(row)
    several_recipes = len({key[-1] for key in groups}) > 1
    result = []
    for key, members in sorted(groups.items()):
        dataset, model, heads, per_class, epochs, _split, recipe = key
        size = f"{per_class}/class" if per_class else "all images"
        title = f"{dataset}, {size}, {epochs} epochs\n{model}" + (f", {heads} heads" if heads else "")
        result.append((title + (f", recipe {recipe}" if several_recipes else ""), members))
    return result


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    """Per cell, a column of two panels: top-1 at the evaluated epochs and training loss at every
    epoch (does an init converge faster early, and keep it?). One line per init, the mean over its
    seeds, in the init's own colour; the band is +-1 standard deviation over the seeds."""
    columns = cells(rows)
    fig, axes = plt.subplots(2, len(columns), figsize=(5 * len(columns), 6.8), squeeze=False, sharex="col")
    for column, (title, members) in enumerate(columns):
        top, bottom = axes[0][column], axes[1][column]
        for init in sorted({r["init"] for r in members}):
            runs = [r for r in members if r["init"] == init]
            colour = init_colour(init)
            for ax, key in ((top, "curve"), (bottom, "loss_curve")):
                curves = [dict(r[key]) for r in runs]  # epoch -> value
                epochs = np.array(sorted(set.intersection(*(set(c) for c in curves))))  # epochs every run has
                data = np.array([[c[epoch] for epoch in epochs] for c in curves])
                mean = data.mean(0)
                ax.plot(
                    epochs,
                    mean,
                    label=f"{init} ({_seeds(len(runs))})",
                    color=colour,
                    marker="o" if len(epochs) < 6 else None,
                )
                if len(runs) > 1:
                    std = data.std(0, ddof=1)
                    ax.fill_between(epochs, mean - std, mean + std, alpha=0.2, color=colour, linewidth=0)
        top.set_title(title, fontsize=9)
        splits = {r.get("split", "test") for r in members}
        top.set_ylabel(f"{'validation' if splits == {'val'} else 'test'} top-1 (%)")
        bottom.set_ylabel("training loss")
        bottom.set_xlabel("epoch")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend(fontsize=8, title="mean; band: +-1 std over seeds", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_summary(rows: list[dict[str, Any]], path: Path, baseline: str = "timm") -> None:
    """Per cell, bars of the final top-1 and of the epochs each init needed to reach `baseline`'s
    final top-1: mean with +-1 std error bars over seeds, every seed as a dot; runs that never got
    there are counted under their bar ('2/3 reached'), and an init none of whose runs did says so."""
    columns = cells(rows)
    key = f"epochs_to_{baseline}"
    fig, axes = plt.subplots(
        2, len(columns), figsize=(max(4.5, 1.1 * _widest(columns)) * len(columns), 7), squeeze=False
    )
    for column, (title, members) in enumerate(columns):
        inits = sorted({r["init"] for r in members}, key=lambda i: (i != baseline, i))
        top, bottom = axes[0][column], axes[1][column]
        for x, init in enumerate(inits):
            runs = [r for r in members if r["init"] == init]
            colour = init_colour(init)
            _bar(top, x, [r["top1"] for r in runs], colour)
            reached = [r[key] for r in runs if r.get(key) is not None]
            if any(key in r for r in runs):
                if reached:
                    _bar(bottom, x, reached, colour)
                label = f"{len(reached)}/{len(runs)} reached" if reached else "never reached"
                bottom.annotate(label, (x, 0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
        for ax in (top, bottom):
            ax.set_xticks(range(len(inits)), inits, rotation=30, ha="right", fontsize=8)
            ax.grid(alpha=0.3, axis="y")
        splits = {r.get("split", "test") for r in members}
        top.set_ylabel(f"final {'validation' if splits == {'val'} else 'test'} top-1 (%)")
        top.set_title(title + f"\nmean +-1 std over seeds ({_seeds(_most_seeds(members))}), dots: seeds", fontsize=9)
        bottom.set_ylabel(f"epochs to {baseline}'s final top-1")
        bottom.yaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
        values = [r["top1"] for r in members]
        spread = max(values) - min(values)
        top.set_ylim(max(0.0, min(values) - max(2 * spread, 2)), min(100.0, max(values) + max(spread, 1)))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _bar(ax: Any, x: int, values: list[float], colour: str) -> None:
    mean = float(np.mean(values))
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    ax.bar(x, mean, color=colour, alpha=0.75, yerr=std if len(values) > 1 else None, capsize=4)
    ax.scatter([x] * len(values), values, color="black", s=8, zorder=3)


def _widest(columns: list[tuple[str, list[dict[str, Any]]]]) -> int:
    return max(len({r["init"] for r in members}) for _, members in columns)


def _most_seeds(members: list[dict[str, Any]]) -> int:
    counts: dict[str, int] = {}
    for row in members:
        counts[row["init"]] = counts.get(row["init"], 0) + 1
    return max(counts.values())


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
