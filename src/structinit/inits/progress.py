"""Long init work announced: work expected to take over NOTICE_SECONDS says so (a Notice with the
expected time) and shows the command line's progress bar where one is set."""

from __future__ import annotations

import contextvars
import math
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, as_completed
from typing import Any

from ..errors import Notice

NOTICE_SECONDS = 2.0  # work expected to take longer is announced

ProgressBar = Callable[[int, str], Any]  # (total, description) -> an object with update(n) and close()
PROGRESS_BAR: contextvars.ContextVar[ProgressBar | None] = contextvars.ContextVar("solve_progress", default=None)


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def announce_pool(futures: Sequence[Future], task: str, started: float, workers: int) -> None:
    """Once the first of `futures` (items alike, run `workers` at a time since `started`) is done, where the
    whole is expected to take over NOTICE_SECONDS: a notice naming `task` and the time, and the progress
    bar where one is set, advanced as the rest finish."""
    finished = as_completed(futures)
    next(finished)
    expected = (time.perf_counter() - started) * math.ceil(len(futures) / workers)
    if expected <= NOTICE_SECONDS:
        return
    where = f"{workers} CPU thread{'s' * (workers > 1)}"
    warnings.warn(f"{task}: about {duration(expected)} on {where}", Notice, stacklevel=4)
    make = PROGRESS_BAR.get()
    if make is None:
        return
    bar = make(len(futures), task.split(":")[0])
    try:
        bar.update(1)
        for _ in finished:
            bar.update(1)
    finally:
        bar.close()
