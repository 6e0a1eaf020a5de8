"""How long a `choose` comparison takes, and so how long it can train: the pace of a run on this machine
(measured on the trainer's own model, batches, evaluation and checkpoint before anything trains, then read off
the runs as they go), the epochs a budget allows every run, and the fewest a verdict can rest on."""

from __future__ import annotations

import dataclasses
import itertools
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from ..data.batches import batches_for
from ..files import atomic_save
from ..training.device import Dist, resolve_device, usable_cores
from ..training.recipe import Recipe, evaluate, feed_of
from ..training.settings import TrainConfig
from ..training.startup import tokens_of

MIN_STEPS = 100  # the fewest optimiser steps a verdict rests on (docs/training.md: why)
RESERVE_SECONDS = 5.0  # the budget kept for the tables and figures after the last run
SIZED_SHARE = 0.85  # a new comparison is sized to this share of the time left: room for a slower machine
OVERRUN = 0.1  # the runs may go on past the budget by this share of it before they are shortened


@dataclasses.dataclass(frozen=True)
class Pace:
    """Seconds a run takes besides its epochs (loading the data, building and initialising the model, its
    first step), and seconds an epoch (its steps, its evaluation, its checkpoint), of a run among those that
    train at once."""

    setup: float
    epoch: float
    checkpoint: float = 0.0  # the part of `epoch` that writes its checkpoint

    def seconds_for(self, epochs: int) -> float:
        return self.setup + epochs * self.epoch

    def waves(self, done: list[list[int]], epochs: int) -> float:
        """Seconds to bring every run to `epochs`: runs go in waves (`done`: each wave's runs' epochs done),
        a wave as long as its furthest-behind run."""
        behind = [epochs - min(wave) for wave in done if min(wave) < epochs]
        return sum(self.seconds_for(epochs_left) for epochs_left in behind)


def least_epochs(steps: int, warmup_epochs: float) -> int:
    """The fewest epochs a verdict can rest on: MIN_STEPS steps, and past the warm-up."""
    return max(math.ceil(MIN_STEPS / steps), math.floor(warmup_epochs) + 1)


def warmup_for(base: TrainConfig, epochs: int) -> float:
    """The warm-up of a comparison of `epochs` epochs: the recipe's, at most a quarter of the run."""
    return min(base.warmup_epochs, epochs / 4)


def reachable(pace: Pace, done: list[list[int]], planned: int, seconds: float) -> int:
    """The most epochs (at most `planned`) every run can reach in `seconds` from where it is (`done`: each
    wave's epochs done); 0 where not even the furthest-behind run's next epoch fits."""
    low, high = 0, planned  # the time to reach an epoch grows with it: the last that fits, by bisection
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if pace.waves(done, middle) <= seconds else (low, middle - 1)
    return low


def fewest_epochs(steps: int, base: TrainConfig) -> int:
    """The fewest epochs of `steps` steps a verdict can rest on (least_epochs, at the warm-up of a comparison
    that long: a quarter of it at most, so they are past it)."""
    return least_epochs(steps, warmup_for(base, math.ceil(MIN_STEPS / steps)))


def sized_epochs(pace: Pace, waves: int, seconds: float) -> int:
    """The epochs every run of a new comparison can train in SIZED_SHARE of `seconds` (0 where none fits)."""
    return max(0, math.floor((seconds * SIZED_SHARE / waves - pace.setup) / pace.epoch))


@dataclasses.dataclass(frozen=True)
class Timing:
    """A run's pace as measured here, in parts: the seconds it takes besides its epochs (loading, the build of
    its model at the baseline init, the first step), a step at its batch and at a smaller one (SMALL_BATCH, the
    same batches cut), an evaluation image and a checkpoint; and the baseline init's build alone."""

    setup: float
    batch: int
    step: float
    small: tuple[int, float]
    per_image: float
    checkpoint: float
    built: float

    def step_at(self, batch: int) -> float:
        """Seconds a step at `batch`: the line through the two batches timed (at least the smaller's time)."""
        small, seconds = self.small
        if self.batch == small:
            return self.step
        return max(seconds, seconds + (self.step - seconds) * (batch - small) / (self.batch - small))

    def pace(self, steps: int, eval_images: int, batch: int | None = None) -> Pace:
        """The pace of a run of `steps` steps an epoch at `batch` (default: the batch timed)."""
        epoch = steps * self.step_at(batch or self.batch) + eval_images * self.per_image + self.checkpoint
        return Pace(self.setup, epoch, self.checkpoint)


SMALL_BATCH = 8  # the smaller batch a step is timed at: the smallest a refused budget is offered (choose_fit.py)


def measure(config: TrainConfig, data: Any, loading: float, timed_steps: int = 4) -> tuple[Timing, str, int]:
    """The timing of one run of `config` on this machine (`loading`: the seconds the data took to load), the
    model in words and the torch threads its runs are fastest at (fastest_threads), timed on the trainer's
    own model (at the baseline init: the structured init's build is timed apart), batches, evaluation and
    checkpoint."""
    device = resolve_device(config.device, 0)
    started = time.perf_counter()
    recipe = Recipe(dataclasses.replace(config, init="kaiming"), data, device, Dist())
    built = time.perf_counter() - started
    batches = batches_for(data, recipe.model, feed_of(config, Dist()), device, recipe.mixup)
    recipe.schedule(max(1, batches.steps), 0)
    generator = torch.Generator().manual_seed(config.seed)
    train = itertools.chain.from_iterable(batches.train(epoch, generator) for epoch in itertools.count())
    recipe.step(*next(train), 0).item()  # the first step allocates (and starts the loader's workers)
    first = time.perf_counter() - started
    steps = itertools.count(1)
    threads, step = fastest_threads(lambda: recipe.step(*next(train), next(steps)).item(), device, timed_steps)
    small = min(config.batch_size, SMALL_BATCH)
    cut = _timed(lambda: recipe.step(*(t[:small] for t in next(train)), next(steps)).item(), threads, timed_steps)
    started = time.perf_counter()
    counted = evaluate(recipe.eval_forward, itertools.islice(batches.evaluate(), 2), device, Dist(), recipe.amp_dtype)
    per_image = (time.perf_counter() - started) / counted["test_images"]
    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        for _ in range(2):  # the second keeps the first as prev.pt, as every epoch after the first does
            atomic_save(recipe.state(), Path(folder) / "last.pt", keep_previous=True)
        checkpoint = (time.perf_counter() - started) / 2
    timing = Timing(loading + first, config.batch_size, step, (small, cut), per_image, checkpoint, built)
    params = sum(p.numel() for p in recipe.model.parameters()) / 1e6
    return timing, f"{config.model}, {params:.2f} M parameters{tokens_of(recipe.model)}", threads


def fastest_threads(step, device: torch.device, timed: int) -> tuple[int, float]:
    """The torch threads a run's `step` is fastest at on this CPU now (every core it may use, or one: beside
    a busy process, threads that wait on each other's cores spin), and its seconds a step there; on an
    accelerator, the threads as they are."""
    candidates = [torch.get_num_threads()] if device.type != "cpu" else sorted({usable_cores(), 1}, reverse=True)
    timings = {threads: _timed(step, threads, timed) for threads in candidates}
    threads = min(timings, key=timings.get)
    return threads, timings[threads]


def _timed(step, threads: int, timed: int) -> float:
    """Seconds a `step` takes at `threads` torch threads: `timed` of them, after one that starts the threads."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        step()
        started = time.perf_counter()
        for _ in range(timed):
            step()
        return (time.perf_counter() - started) / timed
    finally:
        torch.set_num_threads(before)
