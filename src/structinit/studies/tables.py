"""results.md: per cell of a grid, its inits sorted by top-1, each with its margin over the best baseline
and that margin's standard error, and the number of images it was evaluated on (`wide`: the best top-1
along the curve, the time to accuracy, top-5, training loss and the gains over timm and mimetic too)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from ..files import atomic_write_text
from ..inits.labels import BASELINES, label_method
from .results import CELL_KEYS, CSV_COLUMNS

SPLITS = {"test": "test", "val": "validation"}
GAINS = ("timm", "mimetic")  # the wide table's gains: over the best label of each method in the cell


def write_results(rows: list[dict[str, Any]], out: Path, wide: bool = False, heading: str = "") -> None:
    """results.csv (one row per run) and results.md (the tables, under `heading`), each written whole
    (files.atomic_write)."""
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out / "results.csv", table.getvalue())
    atomic_write_text(out / "results.md", heading + results_markdown(rows, wide))


def results_markdown(rows: list[dict[str, Any]], wide: bool = False) -> str:
    """One table per cell (runs of different data sizes, recipes, epochs or evaluation splits are never
    averaged together), under a line that names the cell, then what the columns mean."""
    cells: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        cells.setdefault(tuple(row.get(k) for k in CELL_KEYS), []).append(row)
    several = len({row.get("recipe") for row in rows}) > 1
    parts = [
        _cell_table(runs, several, wide) for _, runs in sorted(cells.items(), key=lambda kv: tuple(map(str, kv[0])))
    ]
    return "\n".join(parts) + "\n" + LEGEND + (WIDE_LEGEND if wide else "")


LEGEND = (
    "top-1: mean ± standard deviation over the seeds. margin: the mean top-1 minus the best baseline's (the "
    f"highest mean of the {', '.join(BASELINES)} inits of the cell, options included), ± its standard error "
    "√(s₁²/n₁ + s₂²/n₂) over n seeds; for a single run, s is the binomial error of its top-1 on the N evaluation "
    "images, √(p(1 − p)/N). One image of N moves a top-1 by 100/N points.\n"
)
WIDE_LEGEND = (
    "best top-1: the highest along the run's curve. epochs to timm's final: the mean epochs the runs that got "
    "there needed to reach the mean final top-1 of timm's runs, and how many of the runs with a curve did. "
    "Where only some runs recorded a value (results kept without their curves), it says of how many the mean is.\n"
)


def _cell_table(runs: list[dict[str, Any]], several_recipes: bool, wide: bool) -> str:
    by_init: dict[str, list[dict[str, Any]]] = {}
    for row in runs:
        by_init.setdefault(row["init"], []).append(row)
    order = sorted(by_init, key=lambda init: (-_mean(by_init[init]), init))
    baseline = best_of(by_init, BASELINES)
    split = runs[0].get("split", "test")
    header = ["init", "seeds", "top-1 (%)", f"margin over {baseline or 'a baseline'} ± s.e.", f"{SPLITS[split]} images"]
    gains = {method: best_of(by_init, (method,)) for method in GAINS} if wide else {}
    if wide:
        header += ["best top-1", "epochs to timm's final", "top-5 (%)", "train loss"]
        header += [f"gain over {label or method}" for method, label in gains.items()]
    lines = [cell_line(runs[0], several_recipes), "", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for init in order:
        group = by_init[init]
        cells = [init, str(len(group)), _spread(group), _margin(group, by_init.get(baseline), init == baseline)]
        cells.append(_images(group))
        if wide:
            cells += [recorded_mean(group, "best_top1"), reached(group), recorded_mean(group, "top5")]
            cells += [recorded_mean(group, "train_loss", 3)]
            cells += [_gain(group, by_init[label]) if label and label != init else "-" for label in gains.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cell_line(row: dict[str, Any], recipe: bool = False) -> str:
    """What a cell is: data, model, heads, training images, epochs (and recipe, where a table holds several)."""
    heads = f", {row['heads']} heads" if row.get("heads") else ""
    named = f", recipe {row['recipe']}" if recipe else ""
    return f"**{row['dataset']}**, {row['model']}{heads}, {training_images(row)}, {row['epochs']} epochs{named}"


def training_images(row: dict[str, Any]) -> str:
    """The training images of a run, as its settings chose them: '200 per class', '50% of the training
    set', or 'all' (less the images a validation split holds out)."""
    if row.get("per_class"):
        return f"{row['per_class']} training images per class"
    if row.get("train_fraction"):
        return f"{float(row['train_fraction']):.0%} of the training images"
    if row.get("split") == "val":
        held = row.get("val_per_class")
        return f"the training images less {f'{held} per class' if held else 'those'} held out for validation"
    return "all training images"


def best_of(by_init: dict[str, list[dict[str, Any]]], methods: tuple[str, ...]) -> str | None:
    """The label of the highest mean top-1 among those of `methods` (options included), None if none."""
    labels = [init for init in by_init if label_method(init) in methods]
    return max(labels, key=lambda init: (_mean(by_init[init]), init), default=None)


def _mean(runs: list[dict[str, Any]]) -> float:
    return statistics.mean(r["top1"] for r in runs)


def _spread(runs: list[dict[str, Any]]) -> str:
    top1 = [r["top1"] for r in runs]
    return f"{_mean(runs):.2f} ± {statistics.stdev(top1):.2f}" if len(top1) > 1 else f"{_mean(runs):.2f}"


def _margin(runs: list[dict[str, Any]], baseline: list[dict[str, Any]] | None, is_baseline: bool) -> str:
    """The mean top-1 over the baseline's, ± the standard error of that difference (see LEGEND)."""
    if is_baseline:
        return "(the best baseline)"
    if not baseline:
        return "-"
    margin = f"{_mean(runs) - _mean(baseline):+.2f}"
    errors = [_squared_error(runs), _squared_error(baseline)]
    return margin if None in errors else f"{margin} ± {math.sqrt(sum(errors)):.2f}"


def _squared_error(runs: list[dict[str, Any]]) -> float | None:
    """The squared standard error of a mean top-1 (points²): s²/n over the seeds; a single run's s² is
    the binomial variance of its top-1 on its N images. None where a single run's N is not recorded."""
    if len(runs) > 1:
        return statistics.variance(r["top1"] for r in runs) / len(runs)
    p, images = runs[0]["top1"] / 100, runs[0].get("images")
    return 1e4 * p * (1 - p) / images if images else None


def _images(runs: list[dict[str, Any]]) -> str:
    counts = {r.get("images") for r in runs} - {None, ""}
    return ", ".join(str(n) for n in sorted(counts)) if counts else "-"


def _gain(runs: list[dict[str, Any]], baseline: list[dict[str, Any]]) -> str:
    return f"{_mean(runs) - _mean(baseline):+.2f}"


def recorded_mean(runs: list[dict[str, Any]], key: str, digits: int = 2) -> str:
    """The mean of `key` over the runs that recorded it, 'of k runs' after it when only k of them did
    (results kept without their curves); '-' when none did."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "-"
    mean = f"{statistics.mean(values):.{digits}f}"
    return mean if len(values) == len(runs) else f"{mean} (of {len(values)} runs)"


def reached(runs: list[dict[str, Any]], baseline: str = "timm") -> str:
    """'62, 3 of 3 runs': the mean epochs to the baseline's final top-1 over the runs that reached it, and
    how many of the runs with a time (see results.time_to_accuracy) did; 'never, 0 of 3 runs' if none did;
    '-' where no run has a time (no baseline run in the cell, or no curves)."""
    key = f"epochs_to_{baseline}"
    timed = [r for r in runs if key in r]
    if not timed:
        return "-"
    got = [r[key] for r in timed if r[key] is not None]
    count = f"{len(got)} of {len(timed)} run{'s' if len(timed) > 1 else ''}"
    return f"{statistics.mean(got):.0f}, {count}" if got else f"never, {count}"
