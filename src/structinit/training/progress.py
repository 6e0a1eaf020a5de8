"""A run's progress as it trains: tqdm's bar over the epochs on a terminal and, where stdout is not a
terminal (a log file, a pipe), one line per epoch: its loss, top-1 when evaluated, img/s and the time
left, which counts the training epochs and the evaluations still to come, each at its measured pace."""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tqdm.auto import tqdm


class Progress:
    """The epochs `start` to `last` of a run evaluated on `split` (its metrics' prefix; `name`: as the lines name
    it); nothing where `show` is off (--quiet, the processes other than the first)."""

    def __init__(
        self, start: int, last: int, show: bool, split: str, evaluated: Callable[[int], int], name: str | None = None
    ) -> None:
        self.bar = tqdm(range(start, last), desc="epochs", disable=not show or None, initial=start, total=last)
        self.lines = show and not sys.stdout.isatty()
        self.start, self.last, self.split, self.evaluated = start, last, split, evaluated
        self.name = name or split  # as the lines name the split: an evaluation folder by its name (val/)
        self.training: list[float] = []  # seconds of each epoch's training
        self.per_image: list[float] = []  # seconds an evaluated image, of each evaluation

    def left(self, done: int) -> float:
        """Seconds left after epoch `done`: the epochs still to train at their mean, and the images still to
        evaluate (`evaluated(epoch)`: after that epoch) at the evaluations' mean pace."""
        training = sum(self.training) / len(self.training) * (self.last - done)
        images = sum(self.evaluated(epoch) for epoch in range(done + 1, self.last + 1))
        return training + (sum(self.per_image) / len(self.per_image) * images if self.per_image else 0.0)

    def __iter__(self):
        return iter(self.bar)

    def epoch(self, metrics: dict[str, Any]) -> None:
        """Record the times of the epoch just finished and show its metrics."""
        self.training.append(metrics["epoch_seconds"])
        if metrics.get("eval_seconds") and metrics.get(f"{self.split}_images"):
            self.per_image.append(metrics["eval_seconds"] / metrics[f"{self.split}_images"])
        top1 = metrics.get(f"{self.split}_top1")
        if top1 is not None:
            self.bar.set_postfix(loss=f"{metrics['train_loss']:.3f}", top1=f"{top1:.1f}")
        if self.lines:
            print(self.line(metrics), flush=True)

    def line(self, metrics: dict[str, Any]) -> str:
        """e.g. 'epoch 3/30: train loss 1.2345, test top-1 56.70%, 1234 img/s, 0:05:12 left'."""
        done = metrics["epoch"]
        left = timedelta(seconds=round(self.left(done)))
        top1 = metrics.get(f"{self.split}_top1")
        evaluated = f", {self.name} top-1 {top1:.2f}%" if top1 is not None else ""
        return (
            f"epoch {done}/{self.last}: train loss {metrics['train_loss']:.4f}{evaluated}, "
            f"{metrics['img_per_s']:.0f} img/s, {left} left"
        )
