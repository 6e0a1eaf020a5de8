"""What a run is about to do, said before it trains and kept in its init report: the data, the model, the
init as resolved (`auto` -> its label), the steps an epoch and of warm-up (with a note where they are few,
and one where accumulation would run past an epoch), and the init's fidelity on the pseudo input and on a
batch of the run's own training images."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

from torch import nn

from ..data.batches import normalised_images
from ..data.datasets import TensorData, evaluated_on
from ..errors import Notice
from ..measure import measure_on_images
from ..report import Report, images_lines
from .recipe import data_size
from .settings import TrainConfig
from .timm_settings import lr_scale_rule

SAMPLE = 16  # training images the init's maps are measured on
FEW_STEPS = 10  # an epoch or a warm-up of fewer steps gets a note


def batch_for_steps(train_images: int, steps: int = FEW_STEPS) -> int:
    """The largest power of two that gives at least `steps` steps an epoch on `train_images` (1 at least)."""
    return 1 << max(0, (train_images // steps).bit_length() - 1)


def resolved_init(config: TrainConfig, model: nn.Module) -> str:
    """The init label the run applies: `auto` as the model's family resolves it."""
    if config.initial_checkpoint:
        return f"the weights of {config.initial_checkpoint} (--initial-checkpoint)"
    if config.init != "auto":
        return config.init
    from ..inits.registry import default_label

    return f"auto -> {default_label(model)}"


def updates_per_epoch(steps: int, accum: int) -> int:
    """Optimiser steps an epoch of `steps` batches: one per `accum` (--grad-accum-steps), the last of fewer (timm's)."""
    return -(-steps // accum)


def accumulation_note(accum: int, batches: int) -> str | None:
    """A note where --grad-accum-steps exceeds an epoch's batches: accumulation ends with the epoch, as
    timm's train.py ends it (its last_accum_steps), so each optimiser step takes fewer batches than asked."""
    if accum <= batches:
        return None
    return (
        f"--grad-accum-steps {accum} exceeds the {batches} batches of an epoch: accumulation ends with the epoch, "
        f"as in timm's train.py, so each epoch is one optimiser step of {batches} batches, not {accum}; give "
        f"--grad-accum-steps {batches} to say so, or a smaller --batch-size for more batches"
    )


def tokens_of(model: nn.Module) -> str:
    """', input 32 px, 65 tokens (8x8 + 1 prefix)' for a model structinit can measure, else ''."""
    with contextlib.suppress(Exception):  # a family without attention (ConvMixer) has no tokens
        from ..adapters import get_adapter

        adapter = get_adapter(model)
        (rows, cols), prefix = adapter.grid, adapter.num_prefix_tokens
        size = getattr(getattr(model, "patch_embed", None), "img_size", None)
        shown = f", input {size[0]} px" if isinstance(size, (tuple, list)) else ""
        return f"{shown}, {rows * cols + prefix} tokens ({rows}x{cols}" + (f" + {prefix} prefix)" if prefix else ")")
    return ""


def measure_init(report: Report, model: nn.Module, data: Any, kernel_size: int) -> None:
    """Put the init's fidelity on SAMPLE of the run's training images into `report` (where it can be measured)."""
    if report.mean_fidelity is None:
        return
    with contextlib.suppress(ValueError, TypeError, NotImplementedError, KeyError):
        device = next(model.parameters()).device
        images = normalised_images(model, data, SAMPLE, "train").to(device)
        was_training = model.training
        model.eval()
        measure_on_images(report, model, images, kernel_size)
        model.train(was_training)


def eval_images(data: Any, split: str) -> int:
    """The images of the evaluation split `split` ("val" or "test") of in-memory or streamed data."""
    return len(getattr(data, f"{split}_labels")) if isinstance(data, TensorData) else len(getattr(data, split))


def startup_lines(config: TrainConfig, data: Any, model: nn.Module, report: Report, batches: int) -> list[str]:
    """The lines a run says before its first step (`batches`: an epoch's), and a Notice where accumulation
    would run past an epoch."""
    if note := accumulation_note(config.grad_accum_steps, batches):
        warnings.warn(note, Notice, stacklevel=2)
    steps, accum = updates_per_epoch(batches, config.grad_accum_steps), min(config.grad_accum_steps, batches)
    size = data_size(config, data)
    held = f", {config.val_per_class} a class held out for validation" if config.val_per_class else ""
    split, named = config.eval_split, evaluated_on(data, config.eval_split)
    logged = f", logged as {split}_*" if named != split else ""
    evaluated = f"evaluated on {named} ({eval_images(data, split)} images{logged})"
    if config.eval_per_class:
        final = "the last evaluation on all of them" if config.eval_final == "full" else "the last one too"
        evaluated += f", during training on {config.eval_per_class} a class of them ({final})"
    subset = f" ({config.per_class} a class)" if config.per_class else ""
    params = sum(p.numel() for p in model.parameters())
    warmup = math.ceil(config.warmup_epochs * steps)
    accumulated = f" x {accum} accumulated" if accum > 1 else ""
    lines = [
        f"data: {config.data}, {len(data.train_labels)} training images{subset} of {data.num_classes} classes"
        f"{f', {size} px' if size else ''}{held}; {evaluated}",
        f"model: {config.model}, {params / 1e6:.2f} M parameters{tokens_of(model)}",
        f"init: {resolved_init(config, model)}"
        + (f", fidelity {report.mean_fidelity:.3f} on the pseudo input" if report.mean_fidelity is not None else ""),
        *(f"  {line}" for line in (images_lines(report.mean_fidelity, report.on_images) if report.on_images else [])),
        f"steps: {steps} an epoch at batch {config.batch_size}{accumulated}, {steps * config.total_epochs} in "
        f"{config.total_epochs} epochs; warm-up {warmup} steps ({config.warmup_epochs:g} epochs)",
    ]
    if steps < FEW_STEPS or 0 < warmup < FEW_STEPS:
        lines.append(
            f"  few steps: an epoch is {steps} step(s) and the warm-up {warmup}: a smaller --batch-size gives more "
            "(the lr schedule and EMA move by steps)"
        )
    return lines + recipe_lines(config, model, isinstance(data, TensorData))


def recipe_lines(config: TrainConfig, model: nn.Module, in_memory: bool) -> list[str]:
    """What timm's train.py flags became: the epochs in all, the lr from --lr-base, the autocast dtype, dropout,
    layer decay, EMA and repeated augmentation (each where it applies)."""
    from .device import distributed_processes, resolve_amp

    lines = []
    if config.cooldown_epochs:
        lines.append(
            f"epochs in all: {config.total_epochs} ({config.epochs} + {config.cooldown_epochs} of cool-down at "
            f"--min-lr {config.min_lr:g}, as timm's train.py)"
        )
    if config.lr_base is not None:
        rule = lr_scale_rule(config.opt, config.lr_base_scale)
        lines.append(
            f"lr: {config.peak_lr:.4g} = --lr-base {config.lr_base:g} x {'sqrt of ' if rule == 'sqrt' else ''}"
            f"({config.batch_size} x {config.grad_accum_steps} / {config.lr_base_size}), {rule} as timm's train.py; "
            f"batch {config.batch_size} in all: timm's -b is per process (its -b {config.batch_size} under torchrun "
            f"with 8 processes trains {8 * config.batch_size} a step)"
        )
    dtype = resolve_amp(config.amp, next(model.parameters()).device)
    became = str(dtype).removeprefix("torch.") if dtype is not None else "none: float32"
    why = "structinit's auto picks by device; timm's --amp is float16: --amp-dtype float16"
    lines.append(f"amp: {config.amp} -> {became}" + (f" ({why})" if config.amp == "auto" else ""))
    extras = [
        f"dropout {config.drop_rate:g} (--drop)" if config.drop_rate else "",
        f"layer decay {config.layer_decay:g} (timm.optim's)" if config.layer_decay not in (None, 1.0) else "",
        f"EMA of the weights, decay {config.ema_decay:g}" if config.ema_decay else "",
    ]
    if config.aug_repeats:
        repeats, world = f"--aug-repeats {config.aug_repeats:g}", distributed_processes().world
        off = "one process, as timm's train.py" if world == 1 else "in-memory data (timm's sampler streams images)"
        on = f"{repeats}: timm's RepeatAugSampler, each image drawn {config.aug_repeats:g} times across the processes"
        on += f" in an epoch as long as the data (about 1/{config.aug_repeats:g} of the images an epoch)"
        extras.append(f"{repeats}: off in {off}" if world == 1 or in_memory else on)
    return lines + ([", ".join(e for e in extras if e)] if any(extras) else [])


def process_batch(config: TrainConfig, world: int, images: int) -> int:
    """The batch each of `world` processes takes, once --batch-size is found to split evenly among them, to fit
    the `images` training images, and to be even where timm's Mixup pairs each image with its mirror."""
    batch = config.batch_size // world
    if batch * world != config.batch_size or batch < 1:
        raise ValueError(f"--batch-size {config.batch_size} must be a multiple of the {world} processes")
    if batch % 2 and (config.mixup > 0 or config.cutmix > 0):
        raise ValueError(
            f"--mixup/--cutmix mix each image with its mirror in the batch (timm's Mixup): a batch of {batch} "
            "a process is odd; give an even --batch-size"
        )
    if images < config.batch_size:
        raise ValueError(
            f"--batch-size {config.batch_size} exceeds the {images} training images: give -b {images} or "
            f"less (-b {batch_for_steps(images)}: {images // batch_for_steps(images)} steps an epoch)"
        )
    return batch
