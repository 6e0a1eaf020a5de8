"""`structinit choose`: which init for the user's own data. A short comparison (the structured init, mimetic
on PyTorch's base, PyTorch's default, and the structured init's norm-matched control) on a validation
split carved from the training images, at least two seeds, sized to a time budget, and a verdict: the init
to use, its margin, whether the margin exceeds the seed-to-seed spread, and whether what helps is the
convolutional prior or only the scale of the Q/K weights (docs/training.md, "Which init for my data")."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ..scale import head_qk_norms
from ..training.device import Dist, resolve_device
from ..training.recipe import Recipe, data_of
from ..training.settings import TrainConfig
from .grid import compare

STRUCTURED = "impulse"  # the paper's text: Q/K alone at its solve's sharpness, on PyTorch's base
BASELINES = ("mimetic[base=kaiming]", "kaiming")
SHARE_OF_BUDGET = 0.8  # the rest: building the models, evaluations, the sizing itself


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the comparison says: each init's validation top-1 over seeds, the best and the runner-up,
    the margin between them against the larger of their seed-to-seed standard deviations."""

    scores: dict[str, list[float]]
    best: str
    runner_up: str
    margin: float
    spread: float
    structured: str
    control: str | None

    @property
    def tie(self) -> bool:
        return self.margin <= self.spread

    @property
    def scale_not_structure(self) -> bool:
        """The control (the structured init's Q/K scale, no structure) ties or beats the structured init."""
        if self.control is None:
            return False
        structured, control = self.scores[self.structured], self.scores[self.control]
        return statistics.mean(control) >= statistics.mean(structured) - spread(structured, control)

    def text(self) -> str:
        lines = [f"{'init':<50} {'val top-1':>16}  seeds"]
        for init in sorted(self.scores, key=lambda i: -statistics.mean(self.scores[i])):
            values = self.scores[init]
            shown = f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
            lines.append(f"{init:<50} {shown:>16}  {len(values)}")
        about = f"margin {self.margin:.2f} over {self.runner_up}, seed spread {self.spread:.2f}"
        if self.tie:
            lines.append(f"verdict: a tie ({about}): {self.best} and {self.runner_up} are as good on this data")
        else:
            lines.append(f"verdict: use {self.best} ({about})")
        if self.scale_not_structure:
            lines.append(
                f"the control {self.control} (the structured init's Q/K scale, no structure) ties or beats "
                f"{self.structured}: what helps on this data is scale, not the convolutional prior"
            )
        return "\n".join(lines)


def spread(*scores: list[float]) -> float:
    """The seed-to-seed spread of one or more inits: the largest of their standard deviations."""
    return max(statistics.stdev(values) for values in scores)


def verdict(scores: dict[str, list[float]], structured: str, control: str | None = None) -> Verdict:
    """The verdict on each init's validation top-1 per seed (at least two inits, two seeds each)."""
    if len(scores) < 2 or any(len(values) < 2 for values in scores.values()):
        raise ValueError("a verdict needs at least two inits with at least two seeds each")
    ranked = sorted(scores, key=lambda init: -statistics.mean(scores[init]))
    best, runner_up = ranked[:2]
    margin = statistics.mean(scores[best]) - statistics.mean(scores[runner_up])
    return Verdict(scores, best, runner_up, margin, spread(scores[best], scores[runner_up]), structured, control)


def control_of(config: TrainConfig, data: Any, structured: str) -> str:
    """The norm-matched control: PyTorch's base with each head's Q/K at the structured init's mean norm."""
    recipe = Recipe(dataclasses.replace(config, init=structured, compile=False), data, torch.device("cpu"), Dist())
    norms = head_qk_norms(recipe.model)
    return f"qk-norm[norm={sum(norms) / len(norms):.3g},base=kaiming]"


def seconds_per_image(config: TrainConfig, data: Any, steps: int = 3) -> float:
    """Training seconds an image on this machine, timed over a few steps of the trainer's own step."""
    device = resolve_device(config.device, 0)
    recipe = Recipe(dataclasses.replace(config, init="kaiming"), data, device, Dist())
    recipe.schedule(max(1, len(data.train_labels) // config.batch_size), 0)
    batch = min(config.batch_size, len(data.train_labels))
    mean, std = data.train_images[:batch].float().mean(), data.train_images[:batch].float().std()
    images = ((data.train_images[:batch].float() - mean) / std).to(device)
    labels = data.train_labels[:batch].to(device)
    recipe.step(images, labels, 0)  # the first step allocates
    started = time.perf_counter()
    for step in range(steps):
        recipe.step(images, labels, step + 1).item()
    return (time.perf_counter() - started) / (steps * batch)


def epochs_for(minutes: float, runs: int, train_images: int, eval_images: int, per_image: float) -> int:
    """The most epochs every run can train in `minutes` (an evaluation costs a third of training an image)."""
    epoch = train_images * per_image + eval_images * per_image / 3
    return max(1, int(minutes * 60 * SHARE_OF_BUDGET / (runs * epoch)))


@dataclasses.dataclass(frozen=True)
class Choice:
    """A finished comparison: its verdict, its result rows (results.csv's) and the config it trained."""

    verdict: Verdict
    rows: list[dict[str, Any]]
    config: TrainConfig


def validation_size(base: TrainConfig) -> int:
    """Images a class to hold out when none are asked: a fifth of the smallest class, 2 to 100."""
    data = data_of(dataclasses.replace(base, val_per_class=None))
    smallest = int(torch.bincount(data.train_labels).min())
    return max(2, min(100, smallest // 5))


def choose(
    base: TrainConfig,
    minutes: float,
    seeds: list[int],
    out: str | Path,
    structured: str = STRUCTURED,
    parallel: int = 1,
    epochs: int | None = None,
) -> Choice:
    """Train the comparison into `out` within about `minutes`, or for `epochs` where given (on a validation
    split of base.val_per_class images a class, or validation_size's), and give its verdict."""
    if len(seeds) < 2:
        raise ValueError("--seeds: give at least two, so that a margin can be held against the seed spread")
    if not base.val_per_class:
        base = dataclasses.replace(base, val_per_class=validation_size(base))
    data = data_of(base)
    control = control_of(base, data, structured)
    inits = [structured, *BASELINES, control]
    if epochs is None:
        per_image = seconds_per_image(base, data)  # K runs at once share the same cores: the same total
        runs, images = len(inits) * len(seeds), len(data.train_labels)
        epochs = epochs_for(minutes, runs, images, len(data.val_labels), per_image)
    config = dataclasses.replace(base, epochs=epochs, warmup_epochs=min(base.warmup_epochs, epochs / 4))
    rows = compare(config, inits, seeds, [base.per_class], out, parallel=parallel)
    scores: dict[str, list[float]] = {}
    for row in rows:
        scores.setdefault(row["init"], []).append(row["top1"])
    return Choice(verdict(scores, structured, control), rows, config)
