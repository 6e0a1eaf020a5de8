"""Figures of a comparison: training curves and a bar summary, each init in its own colour."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.ticker import MaxNLocator

from ..files import fitted_title, save_figure
from .results import CELL_KEYS  # the cells of results.md: tables and figures split rows alike
from .tables import SPLITS, training_images

# one colour per init label in every figure, whatever else the grid holds; other labels (with
# options) take a colour from their own text, so they too keep it from figure to figure, unless another
# label of the same figure took it first (figure_colours)
INIT_COLOURS = {
    "timm": "tab:blue",
    "mimetic": "tab:orange",
    "impulse": "tab:green",
    "impulse-authors": "tab:red",
    "kaiming": "tab:purple",
    "default": "tab:brown",
}
OTHER_COLOURS = [
    "tab:pink", "tab:olive", "tab:cyan", "tab:gray", "gold", "navy", "teal", "maroon", "lime", "indigo",
    "crimson", "darkgoldenrod", "black", "deepskyblue",
]  # fmt: skip


def init_colour(label: str) -> str:
    if label in INIT_COLOURS:
        return INIT_COLOURS[label]
    digest = int(hashlib.sha256(label.encode()).hexdigest(), 16)
    return OTHER_COLOURS[digest % len(OTHER_COLOURS)]


def figure_colours(labels: list[str]) -> dict[str, str]:
    """Each label's colour in one figure: its own (init_colour), or where a label before it in sorted
    order took that, the next free one of OTHER_COLOURS, so that no two lines of a figure share one."""
    colours = {label: INIT_COLOURS[label] for label in labels if label in INIT_COLOURS}
    for label in sorted(set(labels) - set(colours)):
        start = OTHER_COLOURS.index(init_colour(label))
        ring = OTHER_COLOURS[start:] + OTHER_COLOURS[:start]
        colours[label] = next((c for c in ring if c not in colours.values()), ring[0])
    return colours


def cells(rows: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The rows split into comparable cells (the same data, model, size, epochs, split and recipe:
    only init and seed differ), each with a title; a figure never averages across cells."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(str(row.get(k, "")) for k in CELL_KEYS), []).append(row)
    several_recipes = len({key[-1] for key in groups}) > 1
    result = []
    for key, members in sorted(groups.items()):
        dataset, model, heads, _per_class, epochs, _split, recipe = key
        title = f"{dataset}, {training_images(members[0])}, {epochs} epochs\n{model}" + (
            f", {heads} heads" if heads else ""
        )
        result.append((title + (f", recipe {recipe}" if several_recipes else ""), members))
    return result


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def evaluated_on(members: list[dict[str, Any]]) -> str:
    """'top-1 on 360 test images (one image: 0.28 points)', or without the count where no run recorded it."""
    split = SPLITS.get(members[0].get("split", "test"), "test")
    counts = sorted({r["images"] for r in members if r.get("images")})
    if not counts:
        return f"top-1 on the {split} images"
    return f"top-1 on {', '.join(map(str, counts))} {split} images (one image: {100 / counts[0]:.2g} points)"


def plot_curves(rows: list[dict[str, Any]], path: Path) -> None:
    """Per cell, a column of two panels: top-1 at the evaluated epochs and training loss at every
    epoch (does an init converge faster early, and keep it?). One line per init, the mean over its
    seeds, in the init's own colour; the band is ±1 standard deviation over the seeds (none with one seed)."""
    columns = cells(rows)
    inits = max(len({r["init"] for r in members}) for _, members in columns)  # the legend below takes a line each
    height = 6.8 + 0.3 * inits
    fig, axes = plt.subplots(2, len(columns), figsize=(5 * len(columns), height), squeeze=False, sharex="col")
    colours = figure_colours([r["init"] for r in rows])
    for column, (title, members) in enumerate(columns):
        top, bottom = axes[0][column], axes[1][column]
        for init in sorted({r["init"] for r in members}):
            runs = [r for r in members if r["init"] == init]
            colour = colours[init]
            for ax, key in ((top, "curve"), (bottom, "loss_curve")):
                curves = [dict(r[key]) for r in runs]  # epoch -> value
                epochs = np.array(sorted(set.intersection(*(set(c) for c in curves))))  # epochs every run has
                data = np.array([[c[epoch] for epoch in epochs] for c in curves])
                mean = data.mean(0)
                ax.plot(
                    epochs,
                    mean,
                    label=fitted_title(f"{init} ({_seeds(len(runs))})", 4.5, 8),
                    color=colour,
                    marker="o" if len(epochs) < 6 else None,
                )
                if len(runs) > 1:
                    std = data.std(0, ddof=1)
                    ax.fill_between(epochs, mean - std, mean + std, alpha=0.2, color=colour, linewidth=0)
        top.set_title(fitted_title(f"{title}\n{evaluated_on(members)}", 5, 9), fontsize=9)
        splits = {r.get("split", "test") for r in members}
        top.set_ylabel(f"{'validation' if splits == {'val'} else 'test'} top-1 (%)")
        bottom.set_ylabel("training loss")
        bottom.set_xlabel("epoch")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
        band = "mean; band: ±1 std over seeds" if _most_seeds(members) > 1 else "one seed each: no band"
        # below the panels: a long label never covers a curve
        bottom.legend(fontsize=8, title=band, title_fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    save_figure(fig, path, 120)
    plt.close(fig)


def plot_summary(rows: list[dict[str, Any]], path: Path, baseline: str = "timm") -> None:
    """Per cell, bars of the final top-1 (from 0, under the number of images it was measured on) and, where
    the cell has `baseline`, of the epochs each init needed to reach its final top-1: mean with ±1 std
    error bars over seeds, every seed as a dot; runs that never got there are counted under their bar
    ('2/3 reached'), and an init none of whose runs did says so."""
    columns = cells(rows)
    key = f"epochs_to_{baseline}"
    timed = any(key in r for r in rows)
    width = max(4.5, 1.2 * _widest(columns))  # of a column
    fig, axes = plt.subplots(
        1 + timed, len(columns), figsize=(width * len(columns), 7 if timed else 4.5), squeeze=False
    )
    colours = figure_colours([r["init"] for r in rows])
    for column, (title, members) in enumerate(columns):
        inits = sorted({r["init"] for r in members}, key=lambda i: (i != baseline, i))
        top = axes[0][column]
        for x, init in enumerate(inits):
            runs = [r for r in members if r["init"] == init]
            _bar(top, x, [r["top1"] for r in runs], colours[init])
            if timed:
                _reached(axes[1][column], x, runs, key, colours[init])
        for ax in axes[:, column]:
            ax.set_xticks(range(len(inits)), [wrapped_label(i) for i in inits], fontsize=7)
            ax.grid(alpha=0.3, axis="y")
        splits = {r.get("split", "test") for r in members}
        top.set_ylabel(f"final {'validation' if splits == {'val'} else 'test'} top-1 (%)")
        seeds = _most_seeds(members)
        bars = f"mean ±1 std over seeds ({_seeds(seeds)}), dots: seeds" if seeds > 1 else "one seed: no error bars"
        top.set_title(fitted_title(f"{title}\n{evaluated_on(members)}\n{bars}", width - 1, 9), fontsize=9)
        top.set_ylim(0, min(100.0, 1.1 * max(r["top1"] for r in members) + 1))  # from 0: a bar's length is its top-1
        if timed:
            axes[1][column].set_ylabel(f"epochs to {baseline}'s final top-1")
            axes[1][column].yaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole
    fig.tight_layout()
    save_figure(fig, path, 120)
    plt.close(fig)


def _reached(ax: Any, x: int, runs: list[dict[str, Any]], key: str, colour: str) -> None:
    """The epochs-to-baseline bar of one init, with how many of its runs got there."""
    reached = [r[key] for r in runs if r.get(key) is not None]
    if reached:
        _bar(ax, x, reached, colour)
    label = f"{len(reached)}/{len(runs)} reached" if reached else "never reached"
    ax.annotate(label, (x, 0), xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)


def wrapped_label(label: str, width: int = 18) -> str:
    """An init label broken after its commas and brackets into lines of about `width` characters."""
    parts = re.split(r"(?<=[,\[])", label)
    lines = [""]
    for part in parts:
        if lines[-1] and len(lines[-1]) + len(part) > width:
            lines.append("")
        lines[-1] += part
    return "\n".join(lines)


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
