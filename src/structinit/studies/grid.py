"""Experiment grids: the same model and recipe, only the init (and seed, and data size) differ.

`compare` runs every (setting, init, seed) into its own run directory, skips finished runs and
resumes interrupted ones (`parallel` at a time, each in its own process, or as cluster jobs through
submitit: launch.py), then writes results.csv
(one row per run), results.md (mean ± std per init and setting, with the gain over timm), curves.png
and summary.png.
Rows carry the best top-1 of the run's curve and its time to accuracy: the epochs it needed to reach
timm's mean final top-1 in the same cell (`time_to_accuracy`).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import multiprocessing
import os
import re
import statistics
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import torch

from ..data.datasets import parse_spec
from ..training.checkpoint import load_checkpoint
from ..training.provenance import ENVIRONMENT
from ..training.run import TrainConfig, read_config, train
from ..training.rundir import (
    MetricsLog,
    RunError,
    RunLock,
    clear_run,
    config_hash,
    flag,
    identity,
    load_yaml,
    read_record,
    summary_of_the_run,
    written_by_a_run,
)
from .launch import Cluster, LocalJob, run_on_cluster

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
# settings a grid varies (or that do not change the training): left out of a row's recipe hash
NOT_RECIPE = (
    "init",
    "seed",
    "per_class",
    "epochs",
    "preset",
    "snapshot_epochs",
    "eval_every",
)


SUMMARY_FIX = "delete it and run the grid again: the run's checkpoint writes it again"
REPORT_FIX = "delete it: the run is then checked by its config.yaml alone"


def run_dir(out: Path, per_class: int | None, init: str, seed: int) -> Path:
    setting = f"per_class_{per_class}" if per_class else "full"
    return out / setting / f"{init}-seed{seed}"


def compare(
    base: TrainConfig,
    inits: list[str],
    seeds: list[int],
    per_class: list[int | None],
    out: str | Path,
    parallel: int = 1,
    rerun: bool = False,
    threads: int | None = None,
    cluster: Cluster | None = None,
) -> list[dict[str, Any]]:
    """Run the grid (finished runs are skipped, interrupted ones resumed, `rerun`: runs made with
    another recipe are trained again instead of refused; `cluster`: each run a job, see run_configs)
    and write the results."""
    out = Path(out)
    for name, values in (("--inits", inits), ("--seeds", seeds), ("--per-class", per_class)):
        if not values:
            raise ValueError(f"{name} lists nothing: give at least one")
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"{name} lists {', '.join(twice)} twice: each run of the grid once")
    _check_grid_directory(out)
    configs = [
        dataclasses.replace(base, init=init, seed=seed, per_class=pc, out=str(run_dir(out, pc, init, seed)))
        for pc in per_class
        for init in inits
        for seed in seeds
    ]
    run_configs(configs, parallel, root=out, rerun=rerun, threads=threads, cluster=cluster)
    rows = collect(out)
    write_results(rows, out)
    return rows


RESULT_FILES = ("results.csv", "results.md", "curves.png", "summary.png")


def _check_grid_directory(out: Path) -> None:
    """Refuse to write a grid's results over files of those names in a directory that holds no grid."""
    present = [name for name in RESULT_FILES if (out / name).exists()]
    if present and not any(written_by_a_run(p) for p in out.glob("*/*/config.yaml")):
        raise RunError(
            f"{out} holds {', '.join(present)} but no grid's runs: use another --out (the files stay as they are)"
        )


def run_configs(
    configs: list[TrainConfig],
    parallel: int = 1,
    root: Path | None = None,
    rerun: bool = False,
    threads: int | None = None,
    cluster: Cluster | None = None,
) -> None:
    """Train every config whose run directory has no summary.json (resuming those with a checkpoint).

    A run directory made with another recipe is refused before anything trains (`rerun`: emptied
    and trained again). `root`, the grid's directory, is locked: a second grid on it is refused.
    parallel > 1: that many runs at once, each in its own process (two one-thread runs train ~1.25x
    faster than one two-thread run of a small ViT on 2 cores), on the visible GPUs in turn where there
    are several. Every run uses `threads` torch threads (default: the CPU's cores shared equally
    among the runs at once); on a CPU a run's numbers depend on that count (reductions split across
    threads), so a grid repeats bit for bit, in parallel or not, at the same `threads` (tested). The
    first failure stops the grid; finished runs stay finished and interrupted ones resume on the next
    call. `cluster`: each run is a job (a SLURM array, or local processes) submitted through
    submitit, with its scripts and logs in ROOT/jobs; this call waits for them (`parallel` is then
    ignored: `cluster.parallel` bounds the jobs at once) and `threads` defaults to cluster.cpus_per_run."""
    with RunLock(root, "grid") if root is not None else contextlib.nullcontext():
        for config in configs:
            _check_same_recipe(config, rerun)
        _run_all(configs, parallel, threads, root, cluster)


def _check_same_recipe(config: TrainConfig, rerun: bool) -> None:
    """Refuse (or, with `rerun`, empty) a run directory whose run computes something else."""
    path = Path(config.out) / "config.yaml"
    if not path.exists():
        return
    if not written_by_a_run(path):  # a moved grid's runs are taken; only their own files may be deleted
        raise RunError(f"{path} was not written by a run: use another --out (it stays as it is)")
    if not written_by_a_run(path, Path(config.out)) and not (Path(config.out) / "last.pt").exists():
        raise RunError(
            f"{config.out} holds the start of a run of another directory (moved or copied here) and no checkpoint "
            "to go on from: delete that folder to train the run here (structinit deletes only its own files)"
        )
    saved = identity(dataclasses.asdict(read_config(path)))
    asked = identity(dataclasses.asdict(config))
    listed = ", ".join(f"{flag(k)} {saved.get(k)!r} (now {asked[k]!r})" for k in asked if saved.get(k) != asked[k])
    if not listed:
        listed = _changed_init_options(config)
    resumes = MetricsLog(Path(config.out)).training_changes() if not listed else []
    if resumes:
        listed = "resumes that changed " + ", ".join(resumes)
    if not listed:
        return
    if rerun:
        with RunLock(Path(config.out)):  # refused while a process trains it
            clear_run(Path(config.out))
        return
    raise RunError(f"{config.out} was made with {listed}: use another --out, or --rerun to train it again")


def _changed_init_options(config: TrainConfig) -> str:
    """The init options a run recorded that its label no longer resolves to (a default changed since),
    as 'init X with name=old (now new), ...'; empty when they agree or the run recorded none."""
    from ..inits.labels import DEFAULT, parse_init
    from ..inits.registry import options_then_and_now

    report = Path(config.out) / "init_report.json"
    method, given = parse_init(config.init)
    if method == DEFAULT or not report.exists():
        return ""
    recorded = read_record(report, REPORT_FIX).get("options", {})
    then, now = options_then_and_now(method, given, recorded) or ({}, {})
    differ = [f"{k}={then[k]!r} (now {v!r})" for k, v in now.items() if then[k] != v]
    return f"init {config.init!r} with {', '.join(differ)}" if differ else ""


def _run_all(
    configs: list[TrainConfig], parallel: int, threads: int | None, root: Path | None, cluster: Cluster | None
) -> None:
    todo = [c for c in configs if not (Path(c.out) / "summary.json").exists()]
    todo = [dataclasses.replace(c, resume=(Path(c.out) / "last.pt").exists()) for c in todo]
    quiet = all(c.quiet for c in todo)

    def name(config: TrainConfig) -> str:
        return str(Path(config.out).relative_to(root)) if root else config.out

    def finished(config: TrainConfig, summary: dict[str, Any]) -> str:
        return f"{name(config)}: {config.eval_split} top-1 {summary[f'{config.eval_split}_top1']:.2f}"

    if cluster is not None:
        if not todo:
            return
        folder = (root or Path(todo[0].out).parent) / "jobs"
        progress = _GridProgress(todo, disable=quiet)
        try:
            run_on_cluster(todo, cluster, folder, threads, lambda c, s: progress.write(finished(c, s)), progress.update)
        finally:
            progress.close()
        return
    threads = threads or max(1, (os.cpu_count() or 1) // parallel)
    todo = _spread_over_gpus(todo)
    if parallel <= 1:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for i, config in enumerate(todo, 1):
                if not quiet:
                    print(f"[{i}/{len(todo)}] {name(config)}", flush=True)
                train(config)
        finally:
            torch.set_num_threads(before)
        return
    context = multiprocessing.get_context("spawn")  # no forked torch thread pools
    progress = _GridProgress(todo, disable=quiet)
    with ProcessPoolExecutor(parallel, mp_context=context) as pool:
        futures = {pool.submit(LocalJob(threads), c): c for c in todo}
        pending = set(futures)
        try:
            while pending:
                done, pending = wait(pending, timeout=2, return_when=FIRST_COMPLETED)
                for future in done:
                    if future.exception() is not None:
                        raise future.exception()
                    progress.write(finished(futures[future], future.result()))
                progress.update()
        except BaseException:  # a failed run, Ctrl-C or SIGTERM: no run starts, the running ones stop cleanly
            for future in pending:
                future.cancel()
            for child in multiprocessing.active_children():
                child.terminate()  # SIGTERM: an interrupt in LocalJob, which cleans up
            raise
        finally:
            progress.close()


class _GridProgress:
    """One bar for a parallel grid, in epochs over all its runs (read from their metrics.jsonl), with a
    line per finished run."""

    def __init__(self, configs: list[TrainConfig], disable: bool) -> None:
        from tqdm.auto import tqdm

        self.runs = [Path(c.out) for c in configs]
        total = sum(c.epochs for c in configs)
        self.bar = tqdm(total=total, desc=f"grid ({len(configs)} runs)", unit="epoch", disable=disable or None)
        self.finished, self.count = 0, len(configs)
        self.update()

    def update(self) -> None:
        done = sum(len(MetricsLog(run).epochs()) for run in self.runs)
        self.bar.update(done - self.bar.n)

    def write(self, line: str) -> None:
        self.finished += 1
        self.bar.write(f"[{self.finished}/{self.count}] {line}")

    def close(self) -> None:
        self.bar.close()


def _spread_over_gpus(configs: list[TrainConfig]) -> list[TrainConfig]:
    """Runs that would take the default device go round-robin over the visible GPUs (several per GPU
    when the grid runs more at once than there are GPUs)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        return configs
    return [
        dataclasses.replace(c, device=f"cuda:{i % count}") if c.device == "auto" else c for i, c in enumerate(configs)
    ]


def collect(out: Path) -> list[dict[str, Any]]:
    """One row per finished run under `out`, with its per-epoch curve, its best top-1 and its time to
    accuracy. `split` is what it was evaluated on: 'test', or 'val' for a run with a validation split;
    `device` and `precision` where it ran (CPU figures differ between CPUs, bf16 or fp32). A record that
    does not hold together (summary, log, config and checkpoint) is refused, naming the run and the fix."""
    rows = []
    for summary_path in sorted(out.glob("*/*/summary.json")):
        path = summary_path.parent
        summary, resolved, curve = _checked_record(path)
        try:
            rows.append(_row(path, summary, resolved, curve))
        except (KeyError, TypeError, ValueError) as error:
            raise RunError(
                f"{path} has a damaged record ({error!r} in summary.json or metrics.jsonl): mend the line, "
                "or train the run again (compare --rerun): a checkpoint holds only its own epoch's lines"
            ) from None
    time_to_accuracy(rows)
    return rows


# how a finished run's record is put back together from its checkpoint
REPAIR = "structinit train --resume --out RUN puts it back from its checkpoint (delete a damaged summary.json first)"


def _checked_record(path: Path) -> tuple[dict[str, Any], TrainConfig, list[dict[str, Any]]]:
    """A finished run's summary, config and epoch lines, once they agree: the log ends at the summary's
    epoch with the summary's metrics, and config.yaml says what its last.pt trained."""
    summary = read_record(path / "summary.json", SUMMARY_FIX)
    resolved = read_config(path / "config.yaml")
    curve = MetricsLog(path).epochs()
    done = summary.get("epochs_done")
    if not curve or curve[-1]["epoch"] != done:
        last = curve[-1]["epoch"] if curve else "none"
        raise RunError(f"{path}/metrics.jsonl ends at epoch {last}, its summary.json at {done!r}: {REPAIR}")
    if not summary_of_the_run(path, summary):
        raise RunError(f"{path}/summary.json is not the run's (its metrics are not the log's epoch {done}): {REPAIR}")
    if (path / "last.pt").exists():
        # as plain JSON values: a tuple in the checkpoint is a list in YAML
        trained = json.loads(json.dumps(identity(load_checkpoint(path / "last.pt", mmap=True)["config"])))
        said = json.loads(json.dumps(identity(dataclasses.asdict(resolved))))
        differ = [flag(k) for k in sorted(trained.keys() | said.keys()) if trained.get(k) != said.get(k)]
        if differ:
            raise RunError(
                f"{path}/config.yaml says other {', '.join(differ)} than its last.pt (what was trained): {REPAIR}"
            )
    return summary, resolved, curve


def _row(path: Path, summary: dict[str, Any], resolved: TrainConfig, curve: list[dict[str, Any]]) -> dict[str, Any]:
    config = json.loads(json.dumps(dataclasses.asdict(resolved)))
    ran = load_yaml((path / "config.yaml").read_text()).get(ENVIRONMENT, {})
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


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "results.md").write_text(results_markdown(rows))
    if rows:
        from .plots import plot_curves, plot_summary

        plot_curves(rows, out / "curves.png")
        plot_summary(rows, out / "summary.png")


def results_markdown(rows: list[dict[str, Any]]) -> str:
    """Mean ± std top-1 per cell and init (runs of different recipes, epochs or evaluation splits are
    never averaged together; a `recipe` column names the recipe where a table holds several), with
    the gains over timm's and mimetic's means in the same cell, the best top-1 along the curve, the
    epochs to reach timm's final top-1 (runs that got there: mean, and how many), and the final
    training loss (which tells underfitting from overfitting)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        key = (*(row.get(k) for k in CELL_KEYS), row["init"])
        groups.setdefault(key, []).append(row)
    several = len({row.get("recipe") for row in rows}) > 1
    lines = [
        "| dataset | model | heads | per class | epochs | on |"
        + (" recipe |" if several else "")
        + " init | runs | top-1 (%) mean ± std | best top-1 "
        "| epochs to timm's final | top-5 (%) | train loss | gain over timm | gain over mimetic |",
        "|---|---|---|---|---|---|" + ("---|" if several else "") + "---|---|---|---|---|---|---|---|---|",
    ]

    def gain(setting: tuple, baseline: str, mean: float) -> str:
        runs = groups.get((*setting, baseline))
        return f"{mean - statistics.mean(r['top1'] for r in runs):+.2f}" if runs else "-"

    for key, runs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        dataset, model, heads, per_class, epochs, split, recipe, init = key
        top1 = [r["top1"] for r in runs]
        mean = statistics.mean(top1)
        spread = f"{statistics.stdev(top1):.2f}" if len(top1) > 1 else "-"  # one run has no spread
        setting = key[:-1]
        over_timm = gain(setting, "timm", mean) if init != "timm" else "-"
        over_mimetic = gain(setting, "mimetic", mean) if init != "mimetic" else "-"
        lines.append(
            f"| {dataset} | {model} | {heads} | {per_class or 'all'} | {epochs} | {split} |"
            + (f" {recipe} |" if several else "")
            + f" {init} | {len(runs)} | {mean:.2f} ± {spread} | {recorded_mean(runs, 'best_top1')} | {reached(runs)} "
            f"| {recorded_mean(runs, 'top5')} | {recorded_mean(runs, 'train_loss', 3)} | {over_timm} | {over_mimetic} |"
        )
    return "\n".join(lines) + "\n"


def recorded_mean(runs: list[dict[str, Any]], key: str, digits: int = 2) -> str:
    """The mean of `key` over the runs that recorded it, '(k/n)' after it when only k of the n did
    (results kept without their curves); '-' when none did."""
    values = [r[key] for r in runs if r.get(key) is not None]
    if not values:
        return "-"
    mean = f"{statistics.mean(values):.{digits}f}"
    return mean if len(values) == len(runs) else f"{mean} ({len(values)}/{len(runs)})"


def reached(runs: list[dict[str, Any]], baseline: str = "timm") -> str:
    """'62 (3/3)': the mean epochs to the baseline's final top-1 over the runs that reached it, and how
    many of the runs with a time (see time_to_accuracy) did; 'never (0/3)' if none did; '-' where
    no run has a time (no baseline run in the cell, or no curves)."""
    key = f"epochs_to_{baseline}"
    timed = [r for r in runs if key in r]
    if not timed:
        return "-"
    got = [r[key] for r in timed if r[key] is not None]
    return f"{statistics.mean(got):.0f} ({len(got)}/{len(timed)})" if got else f"never (0/{len(timed)})"


LedgerKey = tuple[str, int, str, int]  # a study's run: grid, per class, init, seed


def ledger_key(row: dict[str, Any]) -> LedgerKey:
    return row["grid"], row["per_class"], row["init"], row["seed"]


def read_ledger(path: Path) -> dict[LedgerKey, dict[str, Any]]:
    """The rows of a study's committed ledger (JSON lines; none if `path` is absent), by run: one per
    finished run, curve included, so that its docs can be rewritten and its grids resumed on a
    checkout that has no run directories."""
    path = Path(path)
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {ledger_key(r): r for r in rows}


def write_ledger(path: Path, rows: list[dict[str, Any]]) -> None:
    Path(path).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def is_recorded(ledger: dict[LedgerKey, dict[str, Any]], key: LedgerKey, config: TrainConfig, path: Path) -> bool:
    """Whether the ledger (read from `path`) holds the run `key`, trained as `config` would train it.
    A row of another recipe or data is refused (SystemExit), as it would be averaged with runs of
    this one; rows recorded before the ledger kept a recipe hash have none, and count."""
    row = ledger.get(key)
    if row is None:
        return False
    if row.get("recipe_hash") not in (None, config_hash(dataclasses.asdict(config), leave_out=NOT_RECIPE)):
        grid, per_class, init, seed = key
        raise SystemExit(
            f"{path} holds {grid} {per_class}/class {init} seed {seed} from another recipe or --data: remove its "
            "row (and its run directory) to train it again"
        )
    return True


def ledger_and_runs(
    ledger: dict[LedgerKey, dict[str, Any]], out: Path, cells: list[tuple[str, int]], recipes: dict[str, Any]
) -> list[dict[str, Any]]:
    """A study's finished runs of `cells` ((grid, per class), in the study's order): the ledger's rows
    and those of the run directories under OUT/<grid> (newer: they replace the ledger's), each row
    named by its grid and the grid's recipe (`recipes`, by grid; the run's own hash kept as
    `recipe_hash`). Times to accuracy are recomputed over them all: the baseline's mean moves as
    runs come in, from whichever checkout trained them."""
    rows = dict(ledger)
    for name, recipe in recipes.items():
        if (out / name).exists():
            for r in collect(out / name):
                row = {**r, "grid": name, "recipe": recipe, "recipe_hash": r["recipe"]}
                rows[ledger_key(row)] = row
    order = {cell: i for i, cell in enumerate(cells)}
    kept = sorted(
        (r for r in rows.values() if (r["grid"], r["per_class"]) in order),
        key=lambda r: (order[r["grid"], r["per_class"]], r["init"], r["seed"]),
    )
    time_to_accuracy(kept)
    return kept


def write_generated_section(path: Path, body: str, source: str, name: str = "tables") -> None:
    """Put `body` between the `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers of the markdown
    file `path` (appended if the file lacks them): a script regenerates its tables without touching
    the hand-written text around them, and several scripts can write one file."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"{re.escape(begin)}.*{re.escape(end)}", re.S)
    if not pattern.search(text):
        text += f"{begin}\n{end}\n"
    generated = f"{begin}\n<!-- generated by {source} -->\n\n{body}\n{end}"
    path.write_text(pattern.sub(lambda _: generated, text))


def _heads(path: Path) -> int | str:
    report = path / "init_report.json"
    if not report.exists():
        return ""
    layers = read_record(report, REPORT_FIX).get("layers")
    return len(layers[0]["heads"]) if layers else ""
