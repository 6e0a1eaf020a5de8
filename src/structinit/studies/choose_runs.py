"""A `choose` comparison's runs, trained within its deadline: in waves (seed by seed), each wave brought to the
epoch every remaining run can still reach in the time left at the pace measured so far (never past the plan, nor
past the epoch the waves before it reached), so that a slower machine shortens every run alike instead of
overrunning and no run trains where the verdict cannot read it; time left after a pass brings every run on
together. The scores are read at the epoch all runs reached, which the same command later carries on to the
plan's."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..training.checkpoint import load_checkpoint
from ..training.record import MetricsLog
from ..training.settings import TrainConfig
from .choose_pace import Pace, reachable
from .choose_plan import RERUN, Plan
from .grid import run_configs, run_dir

# an epoch this much slower than planned, at several torch threads, and the runs go on at one: beside a process
# that came to keep a core busy, two threads that wait on each other made an epoch 2.4x slower (bench_choose.md)
SLOWED = 1.5


def run_configs_of(plan: Plan, config: TrainConfig, out: Path) -> list[TrainConfig]:
    """The comparison's runs, seed by seed (a comparison cut short has every init at the same seeds)."""
    return [
        dataclasses.replace(config, init=init, seed=seed, out=str(run_dir(out, config.per_class, init, seed)))
        for seed in plan.seeds
        for init in plan.inits
    ]


def epochs_done(config: TrainConfig) -> list[dict[str, Any]]:
    return MetricsLog(Path(config.out)).epochs() if Path(config.out).is_dir() else []


def observed(pace: Pace, wave: list[TrainConfig], before: list[int], seconds: float) -> Pace:
    """The pace a wave just showed: its slowest run's epochs (steps and evaluation, as logged, and the
    checkpoint as measured) and the rest of its `seconds` as the setup; `pace` where it trained no epoch."""
    lines = [epochs_done(c)[done:] for c, done in zip(wave, before)]
    trained = [run for run in lines if run]
    if not trained:
        return pace
    slowest = max(
        sum(line["epoch_seconds"] + line.get("eval_seconds", 0.0) for line in run) / len(run) for run in trained
    )
    epoch = slowest + pace.checkpoint
    most = max(len(run) for run in lines)
    return Pace(max(0.0, seconds - most * epoch), epoch, pace.checkpoint)


class _Bar:
    """One bar over the comparison's epochs, kept up to date from the runs' logs while they train."""

    def __init__(self, configs: list[TrainConfig], total: int, show: bool) -> None:
        from tqdm.auto import tqdm

        self.configs, self.stop = configs, threading.Event()
        self.bar = tqdm(total=total, desc="choose", unit="epoch", disable=not show or None, leave=False)
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(1.0):
            self.update()

    def update(self) -> None:
        self.bar.update(sum(len(epochs_done(c)) for c in self.configs) - self.bar.n)

    def write(self, line: str) -> None:
        self.bar.write(line) if not self.bar.disable else print(line, flush=True)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.bar.close()


def train_runs(
    plan: Plan, configs: list[TrainConfig], root: Path, parallel: int, deadline: float | None, pace: Pace, show: bool
) -> int:
    """Train the comparison's runs (in `root`) `parallel` at a time within `deadline` (time.monotonic();
    None: to the plan's epochs), saying each run's result (`show`: with a bar); returns the epoch every run
    has reached. No run trains past the epoch the runs before it reached in a pass (the verdict reads every
    run there); where time is left after a pass, another brings every run on to the epoch all can reach."""
    waves = _Waves(plan, configs, root, parallel, pace, show)
    try:
        while waves.bring_on(deadline):
            pass
    finally:
        waves.bar.close()
    return min(len(epochs_done(c)) for c in configs)


class _Waves:
    """The comparison's runs in waves of `parallel` (seed by seed), the pace they showed so far and the torch
    threads they train at."""

    def __init__(
        self, plan: Plan, configs: list[TrainConfig], root: Path, parallel: int, pace: Pace, show: bool
    ) -> None:
        self.plan, self.configs, self.root, self.pace = plan, configs, root, pace
        self.waves = [configs[i : i + parallel] for i in range(0, len(configs), parallel)]
        self.threads, self.planned = plan.threads, Pace(*plan.pace).epoch
        self.bar = _Bar(configs, plan.epochs * len(configs), show)

    def bring_on(self, deadline: float | None) -> bool:
        """One pass over the waves, each brought to the epoch every run from it on can reach in the time left,
        and never past the epoch the waves before it reached; whether any run trained."""
        trained, reached = False, self.plan.epochs
        for index, wave in enumerate(self.waves):
            done = [[len(epochs_done(c)) for c in w] for w in self.waves[index:]]
            left = None if deadline is None else deadline - time.monotonic()
            target = self.plan.epochs if left is None else reachable(self.pace, done, self.plan.epochs, left)
            target = min(target, reached)
            if target == 0:
                break  # not even one more epoch of every run fits: the runs after this one would answer nothing
            todo = [(c, d) for c, d in zip(wave, done[0]) if d < target]
            if todo:
                trained = self._train(todo, target) or trained
            reached = min(reached, *(len(epochs_done(c)) for c in wave))
        return trained

    def _train(self, todo: list[tuple[TrainConfig, int]], target: int) -> bool:
        """Train the runs `todo` (each with its epochs done) to `target` at once, then say their results;
        whether any trained an epoch."""
        stop = target if target < self.plan.epochs else None
        started = time.monotonic()
        stopping = [dataclasses.replace(c, stop_after=stop) for c, _ in todo]
        run_configs(stopping, len(todo), self.root, threads=self.threads, lock=False)
        self.pace = observed(self.pace, [c for c, _ in todo], [d for _, d in todo], time.monotonic() - started)
        if self.threads > 1 and self.pace.epoch > SLOWED * self.planned:  # threads that wait on each other's cores
            self.threads = 1
            slowed = f"{self.pace.epoch:.2f} s an epoch ({self.planned:.2f} planned)"
            self.bar.write(f"the runs slowed to {slowed}: one thread from here")
        for config, _ in todo:
            line = epochs_done(config)[-1]
            self.bar.write(
                f"[{self.configs.index(config) + 1}/{len(self.configs)}] {config.init} seed {config.seed}: val top-1 "
                f"{line['val_top1']:.2f} after {line['step']} steps (epoch {line['epoch']} of {self.plan.epochs})"
            )
        return any(len(epochs_done(config)) > done for config, done in todo)


def scores_at(configs: list[TrainConfig], epoch: int) -> dict[str, list[float]]:
    """Each init's validation top-1 after `epoch`, a value a seed."""
    scores: dict[str, list[float]] = {}
    for config in configs:
        line = next(line for line in epochs_done(config) if line["epoch"] == epoch)
        scores.setdefault(config.init, []).append(line["val_top1"])
    return scores


def check_trained_on_plan(plan: Plan, configs: list[TrainConfig], out: Path) -> None:
    """Refuse the comparison where a run's checkpoint records other data than the plan's fingerprint (images
    replaced while it ran, or between two calls): one table and one verdict would rest on two data sets. Refused,
    not trained again: the images the plan was made on may be gone, and which are meant is the user's to say
    (--rerun compares again from scratch on the images as they are)."""
    other = [c for c in configs if (Path(c.out) / "last.pt").exists() and _trained_on(c) not in (None, plan.data)]
    if other:
        names = [str(Path(c.out).relative_to(out)) for c in other]
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        raise RunError(
            f"{len(other)} of the comparison's {len(configs)} runs trained on other images than it was planned on "
            f"(images added, removed or replaced while it ran, or since): {shown}; no verdict rests on two data "
            f"sets: {RERUN}"
        )


def _trained_on(config: TrainConfig) -> str | None:
    """The data's fingerprint the run's checkpoint records (None: an older run's, which did not record it)."""
    return load_checkpoint(Path(config.out) / "last.pt", mmap=True).get("data")
