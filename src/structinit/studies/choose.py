"""`structinit choose`: which init for the user's own data. A short comparison (the structured init, mimetic
on PyTorch's base, PyTorch's default, timm's own init and the structured init's norm-matched control) on a
validation split carved from the training images, at least two seeds, sized to a time budget once (the plan,
choose_plan.py, is kept in the comparison's directory so that it resumes), and a verdict (verdict.py)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from pathlib import Path
from typing import Any

import torch

from ..data.batches import batches_for
from ..inits.labels import AUTO, label_method, read_label
from ..inits.labels import BASELINES as BASELINE_METHODS
from ..scale import head_qk_norms
from ..training.device import Dist, resolve_device
from ..training.recipe import Recipe, data_of, evaluate, feed_of
from ..training.settings import TrainConfig
from ..training.startup import batch_for_steps, eval_images
from .choose_plan import Plan, plan_of, read_plan, write_plan
from .grid import compare
from .verdict import Verdict, verdict

STRUCTURED = "impulse"  # the paper's text: Q/K alone at its solve's sharpness, on PyTorch's base
BASELINES = ("mimetic[base=kaiming]", "kaiming", "timm")
SHARE_OF_BUDGET = 0.8  # the rest: building the models, the sizing itself


def check_structured(label: str) -> str:
    """`label` if it is a structured init (not a baseline, 'auto' or the scale control); ValueError otherwise."""
    read_label(label)  # an unknown method or option: its own error
    method = label_method(label)
    if method in (*BASELINE_METHODS, AUTO, "qk-norm"):
        raise ValueError(
            f"--structured {label}: {method} is not a structured init (it is a baseline or the control choose adds "
            "itself); give impulse, impulse-neurips, impulse-soft or impulse[...]"
        )
    return label


def control_of(config: TrainConfig, data: Any, structured: str) -> str:
    """The norm-matched control: PyTorch's base with each head's Q/K at the structured init's mean norm."""
    recipe = Recipe(dataclasses.replace(config, init=structured, compile=False), data, torch.device("cpu"), Dist())
    norms = head_qk_norms(recipe.model)
    return f"qk-norm[norm={sum(norms) / len(norms):.3g},base=kaiming]"


def seconds_per_image(config: TrainConfig, data: Any, steps: int = 3) -> tuple[float, float]:
    """Seconds an image to train and to evaluate on this machine, timed on the trainer's own step and batches
    (reading and decoding included where the images stream from files)."""
    device = resolve_device(config.device, 0)
    recipe = Recipe(dataclasses.replace(config, init="kaiming"), data, device, Dist())
    batches = batches_for(data, recipe.model, feed_of(config, Dist()), device, recipe.mixup)
    recipe.schedule(max(1, batches.steps), 0)
    generator = torch.Generator().manual_seed(config.seed)
    train = itertools.chain.from_iterable(batches.train(epoch, generator) for epoch in itertools.count())
    recipe.step(*next(train), 0)  # the first step allocates
    started = time.perf_counter()
    for step in range(steps):
        recipe.step(*next(train), step + 1).item()
    training = (time.perf_counter() - started) / (steps * config.batch_size)
    started = time.perf_counter()
    counted = evaluate(recipe.eval_forward, itertools.islice(batches.evaluate(), 2), device, Dist(), recipe.amp_dtype)
    return training, (time.perf_counter() - started) / counted["test_images"]


def epochs_for(minutes: float, runs: int, train_images: int, eval_images: int, per_image: tuple[float, float]) -> int:
    """The most epochs every run can train in `minutes` (each epoch trains and evaluates once)."""
    epoch = train_images * per_image[0] + eval_images * per_image[1]
    return max(1, int(minutes * 60 * SHARE_OF_BUDGET / (runs * epoch)))


def fitted_batch(batch_size: int, train_images: int) -> int:
    """`batch_size`, or the batch (a power of two) that gives FEW_STEPS steps an epoch on `train_images`."""
    return min(batch_size, batch_for_steps(train_images))


def batch_for(base: TrainConfig, images: int, fit: bool, say) -> TrainConfig:
    """`base` with a batch that gives at least FEW_STEPS steps an epoch when `fit` (said through `say`);
    ValueError where the batch asked exceeds the training images."""
    batch = fitted_batch(base.batch_size, images)
    if fit and batch < base.batch_size:
        say(f"batch size {batch} (not {base.batch_size}): {images} training images, {images // batch} steps an epoch")
        return dataclasses.replace(base, batch_size=batch)
    if base.batch_size > images:
        raise ValueError(
            f"--batch-size {base.batch_size} exceeds the {images} training images: give -b {images} or less, or "
            "leave -b out (choose fits it to the data)"
        )
    return base


def new_plan(base: TrainConfig, data: Any, structured: str, seeds: list[int], minutes: float, epochs: int | None):
    """The comparison's inits (its control solved), and its epochs: `epochs`, or what `minutes` allows."""
    control = control_of(base, data, structured)
    inits = [structured, *BASELINES, control]
    if epochs is None:
        per_image = seconds_per_image(base, data)  # K runs at once share the same cores: the same total
        runs, images = len(inits) * len(seeds), len(data.train_labels)
        return plan_of(
            base,
            inits,
            seeds,
            epochs_for(minutes, runs, images, eval_images(data, "val"), per_image),
            minutes,
            structured,
            control,
        )
    return plan_of(base, inits, seeds, epochs, None, structured, control)


@dataclasses.dataclass(frozen=True)
class Choice:
    """A finished comparison: its verdict, its result rows (results.csv's), the config it trained and its plan."""

    verdict: Verdict
    rows: list[dict[str, Any]]
    config: TrainConfig
    plan: Plan


def validation_size(base: TrainConfig) -> int:
    """Images a class to hold out when none are asked: a fifth of the smallest class, 2 to 100."""
    data = data_of(dataclasses.replace(base, val_per_class=None))
    smallest = int(torch.bincount(data.train_labels).min())
    return max(2, min(100, smallest // 5))


def check_minutes(minutes: float) -> float:
    if not (math.isfinite(minutes) and minutes > 0):
        raise ValueError(f"--minutes must be a finite number > 0, got {minutes}")
    return minutes


def choose(
    base: TrainConfig,
    minutes: float,
    seeds: list[int],
    out: str | Path,
    structured: str = STRUCTURED,
    parallel: int = 1,
    epochs: int | None = None,
    fit_batch: bool = True,
    say=print,
    rerun: bool = False,
) -> Choice:
    """Train the comparison into `out` within about `minutes`, or for `epochs` where given (on a validation
    split of base.val_per_class images a class, or validation_size's), and give its verdict. A comparison
    already in `out` is resumed as planned when asked again with the same flags and refused otherwise;
    `rerun`: as compare's; `fit_batch`: batch_for's."""
    check_minutes(minutes)
    if len(seeds) < 2:
        raise ValueError("--seeds: give at least two, so that a margin can be held against the seed spread")
    check_structured(structured)
    out = Path(out)
    if not base.val_per_class:
        base = dataclasses.replace(base, val_per_class=validation_size(base))
    data = data_of(base)
    base = batch_for(base, len(data.train_labels), fit_batch, say)
    plan = read_plan(out, base, structured, seeds, epochs)
    if plan is None:
        plan = new_plan(base, data, structured, seeds, minutes, epochs)
        write_plan(out, plan)
    else:
        say(f"resuming the comparison planned in {out / 'choose.json'}: {plan.epochs} epochs a run")
    config = dataclasses.replace(base, epochs=plan.epochs, warmup_epochs=min(base.warmup_epochs, plan.epochs / 4))
    sized = f" (sized to {plan.minutes:g} minutes)" if plan.minutes is not None else ""
    say(
        f"comparing {', '.join(plan.inits)} x seeds {','.join(map(str, plan.seeds))}: {plan.epochs} epochs a run"
        f"{sized} at batch {config.batch_size}, into {out}"
    )
    rows = compare(config, plan.inits, plan.seeds, [base.per_class], out, parallel=parallel, rerun=rerun)
    rows = [r for r in rows if r["init"] in plan.inits and r["seed"] in plan.seeds]
    scores: dict[str, list[float]] = {}
    for row in rows:
        scores.setdefault(row["init"], []).append(row["top1"])
    result = verdict(scores, plan.structured, plan.control, chance=100 / data.num_classes)
    return Choice(result, rows, config, plan)
