"""A grid's finished runs as rows: each run's record checked (summary, log, config and checkpoint
agree), its curve, best top-1, time to accuracy (the epochs it needed to reach timm's mean final top-1 in
the same cell) and the number of images it was evaluated on; the tables (tables.py) and figures
(plots.py) are drawn from them."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from ..data.datasets import parse_spec
from ..files import read_json_object
from ..report import recorded_heads
from ..training.checkpoint import load_checkpoint
from ..training.config_file import read_run_config
from ..training.identity import NOT_RECIPE, config_hash, identity_differences
from ..training.record import MetricsLog, RunError, read_summary, summary_of_the_run
from ..training.settings import TrainConfig, flag

CSV_COLUMNS = [
    "dataset",
    "model",
    "heads",
    "per_class",
    "init",
    "seed",
    "epochs",
    "steps",
    "split",
    "images",
    "top1",
    "best_top1",
    "epochs_to_timm",
    "top5",
    "secs",
    "train_loss",
    "recipe",
    "device",
    "precision",
]
# what makes two runs comparable: rows that differ only in init and seed
CELL_KEYS = ("dataset", "model", "heads", "per_class", "epochs", "split", "recipe")


SUMMARY_FIX = "delete it and run the grid again: the run's checkpoint writes it again"
REPORT_FIX = "delete it: the run is then checked by its config.yaml alone"


def collect(out: Path) -> list[dict[str, Any]]:
    """One row per finished run under `out`, with its per-epoch curve, its best top-1 and its time to
    accuracy. `split` is what it was evaluated on: 'test', or 'val' for a run with a validation split;
    `device` and `precision` where it ran (CPU figures differ between CPUs, bf16 or fp32). A record that
    does not hold together (summary, log, config and checkpoint, each checked against its schema) is refused,
    naming the run and the fix."""
    rows = [_row(path.parent, *_checked_record(path.parent)) for path in sorted(out.glob("*/*/summary.json"))]
    time_to_accuracy(rows)
    return rows


def row_at(run: Path, epoch: int) -> dict[str, Any]:
    """A run's row as of `epoch`, finished or not: its log's line of that epoch as its summary (choose's table,
    every run at the epoch all of them reached)."""
    resolved, ran = read_run_config(run / "config.yaml")
    curve = MetricsLog(run).epochs()[:epoch]
    return _row(run, {**curve[-1], "epochs_done": epoch}, resolved, ran or {}, curve)


# how a finished run's record is put back together from its checkpoint
REPAIR = "structinit train --resume --out RUN puts it back from its checkpoint (delete a damaged summary.json first)"


def _checked_record(path: Path) -> tuple[dict[str, Any], TrainConfig, dict[str, Any], list[dict[str, Any]]]:
    """A finished run's summary, config, environment and epoch lines, once they agree: the log ends at the
    summary's epoch with the summary's metrics, and config.yaml says what its last.pt trained."""
    summary = read_summary(path / "summary.json", SUMMARY_FIX)
    resolved, ran = read_run_config(path / "config.yaml")
    curve = MetricsLog(path).epochs()
    done, split = summary["epochs_done"], resolved.eval_split
    if not curve or curve[-1]["epoch"] != done:
        last = curve[-1]["epoch"] if curve else "none"
        raise RunError(f"{path}/metrics.jsonl ends at epoch {last}, its summary.json at {done!r}: {REPAIR}")
    if not summary_of_the_run(curve, summary):
        raise RunError(f"{path}/summary.json is not the run's (its metrics are not the log's epoch {done}): {REPAIR}")
    if done != resolved.total_epochs:
        raise RunError(
            f"{path}/summary.json ends at epoch {done}, its config.yaml at {resolved.total_epochs}: {REPAIR}"
        )
    if not {f"{split}_top1", f"{split}_top5"} <= curve[-1].keys():
        raise RunError(f"{path}/metrics.jsonl's last epoch has no evaluation on {split}, as a run's has: {REPAIR}")
    if (path / "last.pt").exists():
        checkpoint = load_checkpoint(path / "last.pt", mmap=True)
        kept = checkpoint.get("metrics")  # the epoch's metrics as the run computed them
        if kept and (checkpoint.get("epoch") != done or not summary_of_the_run([kept], summary)):
            raise RunError(
                f"{path}/summary.json and metrics.jsonl are not what its last.pt recorded of epoch "
                f"{checkpoint.get('epoch')}: {REPAIR}"
            )
        trained = checkpoint["config"]
        differ = identity_differences(trained, dataclasses.asdict(resolved))
        if differ:
            listed = ", ".join(map(flag, differ))
            raise RunError(f"{path}/config.yaml says other {listed} than its last.pt (what was trained): {REPAIR}")
    return summary, resolved, ran or {}, curve


def _row(
    path: Path, summary: dict[str, Any], resolved: TrainConfig, ran: dict[str, Any], curve: list[dict[str, Any]]
) -> dict[str, Any]:
    config = json.loads(json.dumps(dataclasses.asdict(resolved)))
    split = resolved.eval_split
    top1_curve = [(m["epoch"], m[f"{split}_top1"]) for m in curve if f"{split}_top1" in m]
    return {
        "dataset": dataset_name(config["data"]),
        "model": config["model"],
        "heads": _heads(path),
        "per_class": config["per_class"] or "",
        "init": config["init"],
        "seed": config["seed"],
        "epochs": summary["epochs_done"],
        "split": split,
        "images": summary.get(f"{split}_images", ""),  # older runs did not record it
        "val_per_class": config["val_per_class"] or "",
        "train_fraction": config["train_fraction"] or "",
        "top1": round(summary[f"{split}_top1"], 3),
        "best_top1": round(max(t for _, t in top1_curve), 3),
        "top5": round(summary[f"{split}_top5"], 3),
        "secs": round(sum(m["epoch_seconds"] for m in curve), 1),
        # wall-clock from the first epoch's start to the last record (evaluations included)
        "wall_secs": round(curve[-1]["time"] - curve[0]["time"] + curve[0]["epoch_seconds"], 1),
        "train_loss": round(curve[-1]["train_loss"], 4),
        "steps": curve[-1].get("step", ""),
        "recipe": _recipe(resolved, path),
        "device": ran.get("device_name", ""),
        "precision": ran.get("amp_dtype", ""),
        "curve": top1_curve,
        "loss_curve": [(m["epoch"], m["train_loss"]) for m in curve],
    }


def _recipe(config: TrainConfig, run: Path) -> str:
    """The hash of how the run trained: its settings but the grid's (NOT_RECIPE), and what resumes
    changed of its training, so that it is never averaged with runs trained throughout as it says."""
    values = dataclasses.asdict(config)
    changes = MetricsLog(run).training_changes()
    return config_hash({**values, "resumes": changes} if changes else values, leave_out=NOT_RECIPE)


def epochs_to_reach(curve: list[tuple[int, float]], target: float) -> int | None:
    """The first evaluated epoch at which the top-1 of `curve` ((epoch, top-1) pairs) reaches `target`;
    None if it never does. Its resolution is the curve's evaluation interval."""
    return next((epoch for epoch, top1 in sorted(curve) if top1 >= target), None)


def time_to_accuracy(
    rows: list[dict[str, Any]], baseline: str = "timm", cell_keys: tuple[str, ...] = CELL_KEYS
) -> None:
    """Set each row's `epochs_to_<baseline>`: the epochs the run needed to reach the mean final top-1
    of `baseline`'s runs in the same cell (rows equal on `cell_keys`), None if it never did. Rows of
    a cell without a baseline run, and rows whose curve was not kept (curve None: results recorded
    without it), get no such key; their final top-1 still counts in the baseline's mean."""
    finals: dict[tuple, list[float]] = {}
    for row in rows:
        if row["init"] == baseline:
            finals.setdefault(tuple(row.get(k) for k in cell_keys), []).append(row["top1"])
    for row in rows:
        target = finals.get(tuple(row.get(k) for k in cell_keys))
        if target and row["curve"] is not None:
            row[f"epochs_to_{baseline}"] = epochs_to_reach(row["curve"], statistics.mean(target))


def dataset_name(spec: str) -> str:
    """'cifar10:../shared/datasets/cifar10' -> 'cifar10'; 'imagefolder:/data/flowers' -> 'flowers'."""
    name, path = parse_spec(spec)
    return path.name if name == "imagefolder" else name


def _heads(path: Path) -> int | str:
    report = path / "init_report.json"
    if not report.exists():
        return ""
    try:
        heads = recorded_heads(read_json_object(report, REPORT_FIX))
    except ValueError as error:
        raise RunError(f"{report} is damaged ({error}): {REPORT_FIX}") from None
    return "" if heads is None else heads
