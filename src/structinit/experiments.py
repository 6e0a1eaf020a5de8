"""Experiment grids: the same model and recipe, only the init (and seed, and data size) differ.

`compare` runs every (setting, init, seed) into its own run directory, skips finished runs and
resumes interrupted ones, then writes results.csv (one row per run), results.md (mean ± std per init
and setting, with the gain over timm) and curves.png.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
import statistics
from pathlib import Path
from typing import Any

from .data import parse_spec
from .train import TrainConfig, train

CSV_COLUMNS = ["dataset", "model", "heads", "per_class", "init", "seed", "epochs", "top1", "top5", "secs", "train_loss"]


def run_dir(out: Path, per_class: int | None, init: str, seed: int) -> Path:
    setting = f"per_class_{per_class}" if per_class else "full"
    return out / setting / f"{init}-seed{seed}"


def compare(
    base: TrainConfig,
    inits: list[str],
    seeds: list[int],
    per_class: list[int | None],
    out: str | Path,
) -> list[dict[str, Any]]:
    """Run the grid (finished runs are skipped, interrupted ones resumed) and write the results."""
    out = Path(out)
    total = len(per_class) * len(inits) * len(seeds)
    done = 0
    for pc in per_class:
        for init in inits:
            for seed in seeds:
                done += 1
                path = run_dir(out, pc, init, seed)
                if (path / "summary.json").exists():
                    continue
                if not base.quiet:
                    print(f"[{done}/{total}] {path.relative_to(out)}", flush=True)
                config = dataclasses.replace(
                    base, init=init, seed=seed, per_class=pc, out=str(path), resume=(path / "last.pt").exists()
                )
                train(config)
    rows = collect(out)
    write_results(rows, out)
    return rows


def collect(out: Path) -> list[dict[str, Any]]:
    """One row per finished run under `out`, with its per-epoch curve."""
    rows = []
    for summary_path in sorted(out.glob("*/*/summary.json")):
        path = summary_path.parent
        summary = json.loads(summary_path.read_text())
        config = json.loads(json.dumps(_read_yaml(path / "config.yaml")))
        curve = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
        rows.append(
            {
                "dataset": dataset_name(config["data"]),
                "model": config["model"],
                "heads": _heads(path),
                "per_class": config["per_class"] or "",
                "init": config["init"],
                "seed": config["seed"],
                "epochs": summary["epochs_done"],
                "top1": round(summary["test_top1"], 3),
                "top5": round(summary["test_top5"], 3),
                "secs": round(sum(m["epoch_seconds"] for m in curve), 1),
                # wall-clock from the first epoch's start to the last record (evaluations included)
                "wall_secs": round(curve[-1]["time"] - curve[0]["time"] + curve[0]["epoch_seconds"], 1),
                "train_loss": round(curve[-1]["train_loss"], 4),
                "curve": [(m["epoch"], m["test_top1"]) for m in curve if "test_top1" in m],
                "loss_curve": [(m["epoch"], m["train_loss"]) for m in curve],
            }
        )
    return rows


def dataset_name(spec: str) -> str:
    """'cifar10:../shared/datasets/cifar10' -> 'cifar10'; 'imagefolder:/data/flowers' -> 'flowers'."""
    name, path = parse_spec(spec)
    return path.name if name == "imagefolder" else name


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.md").write_text(results_markdown(rows))
    if rows:
        from .plots import plot_curves

        plot_curves(rows, out / "curves.png")


def results_markdown(rows: list[dict[str, Any]]) -> str:
    """Mean ± std top-1 per (setting, init), with the gains over timm's and mimetic's means in the
    same setting, and the final training loss (which tells underfitting from overfitting)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = (row["dataset"], row["model"], row["heads"], row["per_class"], row["init"])
        groups.setdefault(key, []).append(row)
    lines = [
        "| dataset | model | heads | per class | init | runs | top-1 (%) mean ± std | top-5 (%) | train loss "
        "| gain over timm | gain over mimetic |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def gain(setting: tuple, baseline: str, mean: float) -> str:
        runs = groups.get((*setting, baseline))
        return f"{mean - statistics.mean(r['top1'] for r in runs):+.2f}" if runs else "-"

    for key, runs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        dataset, model, heads, per_class, init = key
        top1 = [r["top1"] for r in runs]
        mean = statistics.mean(top1)
        std = statistics.stdev(top1) if len(top1) > 1 else 0.0
        top5 = statistics.mean(r["top5"] for r in runs)
        loss = statistics.mean(r["train_loss"] for r in runs)
        setting = key[:4]
        over_timm = gain(setting, "timm", mean) if init != "timm" else "-"
        over_mimetic = gain(setting, "mimetic", mean) if init != "mimetic" else "-"
        lines.append(
            f"| {dataset} | {model} | {heads} | {per_class or 'all'} | {init} | {len(runs)} | {mean:.2f} ± {std:.2f} "
            f"| {top5:.2f} | {loss:.3f} | {over_timm} | {over_mimetic} |"
        )
    return "\n".join(lines) + "\n"


def write_generated_section(path: Path, body: str, source: str) -> None:
    """Put `body` between the `<!-- tables:begin -->` and `<!-- tables:end -->` markers of the
    markdown file `path` (created with just the markers if missing): a script regenerates its
    tables without touching the hand-written text around them."""
    path = Path(path)
    text = path.read_text() if path.exists() else "<!-- tables:begin -->\n<!-- tables:end -->\n"
    pattern = re.compile(r"<!-- tables:begin -->.*<!-- tables:end -->", re.S)
    if not pattern.search(text):
        raise ValueError(f"{path} has no <!-- tables:begin --> ... <!-- tables:end --> markers")
    generated = f"<!-- tables:begin -->\n<!-- generated by {source} -->\n\n{body}\n<!-- tables:end -->"
    path.write_text(pattern.sub(lambda _: generated, text))


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text())


def _heads(path: Path) -> int | str:
    report = path / "init_report.json"
    if not report.exists():
        return ""
    layers = json.loads(report.read_text())["layers"]
    return len(layers[0]["heads"]) if layers else ""
