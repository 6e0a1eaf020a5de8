"""Long init work announced: work expected to take over NOTICE_SECONDS says so (a Notice with the
expected time) and shows a progress bar on a terminal; neither where the caller is quiet."""

from __future__ import annotations

import contextvars
import importlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future, as_completed
from typing import Any

from ..errors import Notice, notices_quiet

NOTICE_SECONDS = 2.0  # work expected to take longer is announced

ProgressBar = Callable[[int, str], Any]  # (total, description) -> an object with update(n) and close()
# the bar's maker where a caller sets one (tests); else tqdm's on a terminal
PROGRESS_BAR: contextvars.ContextVar[ProgressBar | None] = contextvars.ContextVar("solve_progress", default=None)


def duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def announce_pool(futures: Sequence[Future], task: str, started: float, workers: int) -> None:
    """Once the first of `futures` (items alike, run `workers` at a time since `started`) is done, where the
    whole is expected (at the pace of those done by then) to take over NOTICE_SECONDS: a notice naming `task`
    and the time, and the progress bar (progress_bar), advanced as the rest finish."""
    finished = as_completed(futures)
    next(finished)
    done = sum(future.done() for future in futures)  # more than one where items were drawn as others ran
    expected = (time.perf_counter() - started) * math.ceil(len(futures) / max(done, workers))
    if expected <= NOTICE_SECONDS:
        return
    where = f"{workers} CPU thread{'s' * (workers > 1)}"
    warnings.warn(f"{task}: about {duration(expected)} on {where}", Notice, stacklevel=4)
    bar = progress_bar(len(futures), task.split(":")[0])
    if bar is None:
        return
    try:
        bar.update(1)
        for _ in finished:
            bar.update(1)
    finally:
        bar.close()


def progress_bar(total: int, description: str) -> Any:
    """The bar of long init work (`total` steps): PROGRESS_BAR's where set, else tqdm's where stderr is a
    terminal (gone when it ends); None where the caller is quiet, or tqdm is not installed. tqdm is the
    trainer's dependency (the `train` extra), not the library's: it is loaded by name, only here."""
    if notices_quiet():
        return None
    make = PROGRESS_BAR.get()
    if make is not None:
        return make(total, description)
    if not sys.stderr.isatty():
        return None
    try:
        tqdm = importlib.import_module("tqdm.auto").tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=description, unit="step", leave=False)
