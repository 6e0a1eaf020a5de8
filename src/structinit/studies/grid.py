"""Experiment grids: the same model and recipe, only the init (and seed, and data size) differ.

`compare` runs every (setting, init, seed) into its own run directory, skips finished runs and
resumes interrupted ones (`parallel` at a time, each in its own process, or as cluster jobs through
submitit: launch.py), then writes the results (results.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import multiprocessing
import os
import re
import signal
import threading
import warnings
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any

import torch

from ..errors import Notice
from ..files import folders_kept_only_if_used, remove_temporaries
from ..training.lock import RunLock
from ..training.ownership import recover_aside
from ..training.record import MetricsLog
from ..training.run import train
from ..training.settings import TrainConfig
from .grid_checks import (
    RESULT_FILES,
    check_grid_directory,
    check_same_data,
    check_same_recipe,
    check_tabulated_data,
    refuse_links_to,
    replacing,
)
from .launch import Cluster, LocalJob, local_workers, new_processes_ignore_signals, run_on_cluster
from .results import collect
from .tables import write_results

# an init label that is a folder name as it is: a method or variant without options (timm, impulse-soft)
PLAIN_LABEL = re.compile(r"^[A-Za-z0-9_-]+$")


def run_dir(out: Path, per_class: int | None, init: str, seed: int) -> Path:
    """The folder of a grid's run: OUT/full or OUT/per_class_K, then NAME-seedS, where NAME is the init
    label if it is a plain name, else a slug of it and a hash of the whole label (options may hold '/' or
    '..': a label is never a path). The label itself is in the run's record (config.yaml), which is what
    results read. A run that structinit 0.2 named by its label as it is stays where it is."""
    setting = out / (f"per_class_{per_class}" if per_class else "full")
    named = setting / f"{init}-seed{seed}"
    if PLAIN_LABEL.match(init) or (named.parent == setting and named.is_dir()):
        return named
    slug = re.sub(r"[^A-Za-z0-9_]+", "-", init).strip("-")[:40]
    return setting / f"{slug}-{hashlib.sha256(init.encode()).hexdigest()[:10]}-seed{seed}"


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
    wide: bool = False,
) -> list[dict[str, Any]]:
    """Run the grid (finished runs are skipped, interrupted ones resumed, `rerun`: runs made with
    another recipe are trained again instead of refused; `cluster`: each run a job, see run_configs)
    and write the results (`wide`: results.md with every column, tables.results_markdown)."""
    out = Path(out)
    for name, values in (("--inits", inits), ("--seeds", seeds), ("--per-class", per_class)):
        if not values:
            raise ValueError(f"{name} lists nothing: give at least one")
        twice = sorted({str(v) for v in values if values.count(v) > 1})
        if twice:
            raise ValueError(f"{name} lists {', '.join(twice)} twice: each run of the grid once")
    _check_auto_once(base, inits)
    if out.is_dir():
        with RunLock(out, "grid"):  # what a killed --rerun set aside, back before the directory is judged
            recover_set_aside(out)
    check_grid_directory(out)
    with folders_kept_only_if_used(out):
        return _compare(base, inits, seeds, per_class, out, parallel, rerun, threads, cluster, wide)


def _compare(
    base: TrainConfig,
    inits: list[str],
    seeds: list[int],
    per_class: list[int | None],
    out: Path,
    parallel: int,
    rerun: bool,
    threads: int | None,
    cluster: Cluster | None,
    wide: bool,
) -> list[dict[str, Any]]:
    configs = [
        dataclasses.replace(base, init=init, seed=seed, per_class=pc, out=str(run_dir(out, pc, init, seed)))
        for pc in per_class
        for init in inits
        for seed in seeds
    ]
    run_configs(configs, parallel, root=out, rerun=rerun, threads=threads, cluster=cluster)
    check_tabulated_data(out)
    return write_grid_results(out, wide)


def write_grid_results(out: Path, wide: bool = False) -> list[dict[str, Any]]:
    """The rows of the grid's finished runs, written as its tables and figures (`wide`: results.md with
    every column)."""
    rows = collect(out)
    remove_temporaries(out, RESULT_FILES)  # what an interrupted write of the results left
    write_results(rows, out, wide)
    if rows:
        from .plots import plot_curves, plot_summary  # matplotlib: only once there is something to draw

        plot_curves(rows, out / "curves.png")
        plot_summary(rows, out / "summary.png")
    return rows


def _check_auto_once(base: TrainConfig, inits: list[str]) -> None:
    """Refuse 'auto' beside the label it stands for on the grid's model: the same init trained twice."""
    if "auto" not in inits:
        return
    from ..inits.registry import default_label
    from ..models import shape_model

    meant = default_label(shape_model(base.model, {"num_classes": 10, **base.model_kwargs}))
    if meant in inits:
        raise ValueError(f"--inits lists auto and {meant}, which auto stands for on {base.model}: each init once")


def run_configs(
    configs: list[TrainConfig],
    parallel: int = 1,
    root: Path | None = None,
    rerun: bool = False,
    threads: int | None = None,
    cluster: Cluster | None = None,
    lock: bool = True,
) -> None:
    """Train every config whose run directory has no summary.json (resuming those with a checkpoint).

    A run directory made with another recipe, or finished on data that has changed since, is refused
    before anything trains (`rerun`: trained again, once every run is checked; its files set aside until its
    new run has checkpointed: grid_checks.replacing). `root`, the grid's directory, is locked (`lock`; False:
    its caller holds the lock): a second grid on it is refused.
    parallel > 1: that many runs at once, each in its own process (two one-thread runs train ~1.25x
    faster than one two-thread run of a small ViT on 2 cores), on the visible GPUs in turn where there
    are several. Every run uses `threads` torch threads (default: the CPU's cores shared equally
    among the runs at once); on a CPU a run's numbers depend on that count (reductions split across
    threads), so a grid repeats bit for bit, in parallel or not, at the same `threads` (tested). The
    first failure stops the grid; finished runs stay finished and interrupted ones resume on the next
    call. `cluster`: each run is a job (a SLURM array, or local processes) submitted through
    submitit, with its scripts and logs in ROOT/jobs; this call waits for them (`parallel` is then
    ignored: `cluster.parallel` bounds the jobs at once) and `threads` defaults to cluster.cpus_per_run."""
    if cluster is not None:
        cluster.submitit()  # what the jobs need, before anything is made
    with RunLock(root, "grid") if root is not None and lock else contextlib.nullcontext():
        fingerprints: dict[str, str] = {}
        stale = []
        for config in configs:
            refuse_links_to(Path(config.out), root)
            if check_same_recipe(config, rerun) or check_same_data(config, rerun, fingerprints):
                stale.append(Path(config.out))
        with replacing(stale, root):
            _run_all(configs, parallel, threads, root, cluster)


def recover_set_aside(root: Path) -> None:
    """What a --rerun killed before its replacements were accepted left in `root` put back (ownership.recover_aside),
    and said. Hold the directory's lock; compare and choose call it before they read the directory."""
    restored = sorted(str(path.relative_to(root)) for path in recover_aside(root))
    if restored:
        warnings.warn(
            f"put back {len(restored)} file(s) a --rerun set aside in {root} and was stopped before it replaced them "
            f"({', '.join(restored[:3])}{', ...' if len(restored) > 3 else ''})",
            Notice,
            stacklevel=2,
        )


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
    pool, stop = local_workers(parallel)
    progress = _GridProgress(todo, disable=quiet)
    with _sigterm_as_interrupt(), pool:
        with new_processes_ignore_signals():
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
            stop.set()
            for future in pending:
                future.cancel()
            for child in multiprocessing.active_children():
                child.terminate()  # SIGTERM: an interrupt in a running LocalJob, which cleans up
            raise
        finally:
            progress.close()


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """While a parallel grid runs, SIGTERM is Ctrl-C in its process (unless a handler is set, as the CLI
    sets one), so that the grid stops its workers, which clean up and exit, rather than dying and leaving
    them idle (a benchmark script calls the grid directly)."""
    unhandled = signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)
    if not unhandled or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _GridProgress:
    """One bar for a parallel grid, in epochs over all its runs (read from their metrics.jsonl), with a
    line per finished run."""

    def __init__(self, configs: list[TrainConfig], disable: bool) -> None:
        from tqdm.auto import tqdm

        self.runs = [Path(c.out) for c in configs]
        total = sum(c.total_epochs for c in configs)
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
