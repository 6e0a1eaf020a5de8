"""What a new `choose` comparison's budget holds, checked before anything long runs: the fewest epochs a verdict
rests on, at the pace measured here, with a one-off solve the structured init needs (impulse's sharpness for a
shape outside the shipped table: timed on its first steps before it runs) counted in; and, where the minutes do
not hold them, a refusal with the minutes that would and the settings that fit the minutes given (two seeds, a
smaller batch, fewer images a class), each worked out from the pace measured here."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Iterator

import torch

from ..inits.paper_solve import STEPS, paper_solve
from ..inits.sharpness import BEFORE_SOLVE, SOLVE_DEVICE
from ..inits.threads import available_threads
from ..training.settings import TrainConfig
from .choose_pace import MIN_STEPS, RESERVE_SECONDS, SIZED_SHARE, SMALL_BATCH, Pace, Timing, fewest_epochs, sized_epochs

MIN_PER_CLASS = 5  # the fewest training images a class a refusal offers


@dataclasses.dataclass(frozen=True)
class Budget:
    """A new comparison's budget, `minutes` from `started` (time.monotonic()), and what sizes its runs: the
    inits and seeds, the runs at once, the recipe (its batch), each class's training images and the images
    each evaluation counts."""

    minutes: float
    started: float
    inits: int
    seeds: list[int]
    parallel: int
    base: TrainConfig
    counts: list[int]
    eval_images: int

    def waves(self, seeds: int | None = None) -> int:
        return math.ceil(self.inits * (seeds or len(self.seeds)) / self.parallel)

    def pace(self, timing: Timing, batch: int | None = None, per_class: int | None = None) -> tuple[Pace, int]:
        """A run's pace among those that train at once, and its steps an epoch, at `batch` and `per_class`
        (default: the recipe's)."""
        images = sum(min(count, per_class) for count in self.counts) if per_class else sum(self.counts)
        batch = batch or self.base.batch_size
        steps = images // batch
        pace = timing.pace(steps, self.eval_images, batch)
        return Pace(pace.setup, pace.epoch * self.parallel, pace.checkpoint * self.parallel), steps

    def needed(self, timing: Timing, solve: float, batch=None, per_class=None, seeds=None) -> float:
        """The minutes a comparison needs from its start: what was spent so far, the solve, the fewest epochs
        of every run in SIZED_SHARE of the time, and the reserve."""
        pace, steps = self.pace(timing, batch, per_class)
        runs = self.waves(seeds) * pace.seconds_for(fewest_epochs(steps, self.base)) / SIZED_SHARE
        return math.ceil((time.monotonic() - self.started + solve + runs + RESERVE_SECONDS) / 60 * 10) / 10


def sized_to(budget: Budget, timing: Timing, solve: float = 0.0) -> int:
    """The epochs every run can train in the time left less `solve` (the seconds of a solve still to run);
    ValueError where they are fewer than a verdict rests on, with the minutes that would do and what fits."""
    pace, steps = budget.pace(timing)
    left = budget.started + budget.minutes * 60 - RESERVE_SECONDS - time.monotonic() - solve
    epochs, least = sized_epochs(pace, budget.waves(), left), fewest_epochs(steps, budget.base)
    if epochs >= least:
        return epochs
    solving = (
        f", after a one-off solve of the structured init's sharpness for this model (about {solve:.0f} s here; "
        "kept, so that later commands skip it)"
        if solve
        else ""
    )
    fits = fitting(budget, timing, solve)
    offer = (
        f"; or, in {_minutes(budget.minutes)} here: {fits}"
        if fits
        else f" (no smaller batch or fewer images a class fit {_minutes(budget.minutes)} here), or a smaller --model"
    )
    raise ValueError(
        f"too short to compare here: a verdict needs every run to train at least {least} epochs "
        f"({least * steps} steps: {MIN_STEPS} at least, past the warm-up), about {pace.seconds_for(least):.0f} s a "
        f"run on this machine ({pace.setup:.1f} s to start, {pace.epoch:.2f} s an epoch){solving}: give --minutes "
        f"{budget.needed(timing, solve):g} or more{offer}"
    )


def _minutes(minutes: float) -> str:
    return f"{minutes:g} minute{'' if minutes == 1 else 's'}"


def fitting(budget: Budget, timing: Timing, solve: float) -> str:
    """The settings that fit the budget at the pace measured here, each with its minutes: two seeds (where
    more were asked), the largest smaller batch with every image, and the most images a class at a batch larger
    than that (fewer images at the same batch fit too, but answer less)."""
    fits = []
    if len(budget.seeds) > 2 and budget.needed(timing, solve, seeds=2) <= budget.minutes:
        fits.append((f"--seeds {','.join(map(str, budget.seeds[:2]))}", {"seeds": 2}))
    batches = [budget.base.batch_size >> i for i in range(budget.base.batch_size.bit_length())]
    smaller = [b for b in batches if SMALL_BATCH <= b < budget.base.batch_size and b % 2 == 0]  # mixup pairs
    batch = next((b for b in smaller if budget.needed(timing, solve, batch=b) <= budget.minutes), None)
    if batch is not None:
        fits.append((f"-b {batch}", {"batch": batch}))
    larger = [b for b in [budget.base.batch_size, *smaller] if batch is None or b > batch]  # worth fewer images
    subsets = [(b, k) for b in larger if (k := _most_per_class(budget, timing, solve, b))]
    if subsets:
        b, k = max(subsets, key=lambda fit: (fit[1], fit[0]))
        held = f"--val-per-class {budget.base.val_per_class}"  # the validation split as it is now
        fits.append((f"-b {b} --per-class {k} {held}", {"batch": b, "per_class": k}))
    return ", or ".join(f"{flags} (about {budget.needed(timing, solve, **kw):g} minutes)" for flags, kw in fits)


def _most_per_class(budget: Budget, timing: Timing, solve: float, batch: int) -> int | None:
    """The most training images a class (fewer than now, MIN_PER_CLASS at least) whose comparison fits the
    budget at `batch`: tried where an epoch holds the steps of 1, 2, 3, ... of the fewest epochs a verdict needs."""
    classes, now = len(budget.counts), max(budget.counts)
    for epochs in range(1, MIN_STEPS + 1):
        per_class = math.ceil(math.ceil(MIN_STEPS / epochs) * batch / classes)
        if per_class < MIN_PER_CLASS:
            return None
        fits = budget.needed(timing, solve, batch=batch, per_class=per_class) <= budget.minutes
        if per_class < now and per_class * classes >= batch and fits:
            return per_class
    return None


@contextlib.contextmanager
def solve_counted(check: Callable[[float], object]) -> Iterator[None]:
    """Within it, a one-off solve of impulse's sharpness is first timed on its first steps (solve_seconds) and
    `check` given its expected seconds, before the solve runs: `check` refuses by raising."""

    def before(pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int) -> None:
        check(solve_seconds(pseudo, grid, heads, kernel_size))

    token = BEFORE_SOLVE.set(before)
    try:
        yield
    finally:
        BEFORE_SOLVE.reset(token)


def solve_seconds(pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int) -> float:
    """The seconds the paper's solve of this shape takes here, at most (a solve stopped once saturated takes
    less): ten of its steps timed after the six that allocate, times its STEPS."""
    marks: dict[int, float] = {}
    paper_solve(
        pseudo,
        grid,
        heads,
        kernel_size,
        steps=16,
        device=SOLVE_DEVICE.get() or "cpu",
        threads=min(heads, available_threads()),
        on_step=lambda step: marks.setdefault(step, time.perf_counter()),
    )
    return (marks[16] - marks[6]) / 10 * STEPS
