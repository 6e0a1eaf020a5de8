"""A run's optimiser and lr schedule, made by timm's factories (create_optimizer_v2,
create_scheduler_v2) from the settings named as timm's train.py names them (--opt, --sched, ...), and
the names they take."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch
from timm.optim import create_optimizer_v2, get_optimizer_class
from timm.scheduler import create_scheduler_v2
from timm.scheduler.scheduler import Scheduler
from torch import nn

if TYPE_CHECKING:
    from .settings import TrainConfig


def optimizer_kernel(device: torch.device) -> dict[str, bool | None]:
    """The fused kernel on CUDA (one launch for every parameter instead of several per tensor: the
    optimiser step of a small model is launch-bound); torch's default (foreach) elsewhere. For the
    optimisers that have both (AdamW, Adam, SGD)."""
    fused = device.type == "cuda"
    return {"fused": True if fused else None, "foreach": False if fused else None}


def create_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """timm's optimiser `config.opt` (no weight decay on norms, biases and position embeddings) at the
    config's peak lr (--lr, or --lr-base's), decay, momentum, eps and betas (eps and betas: the optimiser's
    own unless given), with timm's layer-wise lr decay where --layer-decay is given."""
    extra = {k: v for k, v in (("eps", config.opt_eps), ("betas", config.opt_betas)) if v is not None}
    if "betas" in extra:
        extra["betas"] = tuple(extra["betas"])
    name = config.opt.removeprefix("lookahead_")
    if "fused" in inspect.signature(get_optimizer_class(name, bind_defaults=False)).parameters:
        extra.update(optimizer_kernel(device))
    return create_optimizer_v2(
        model,
        config.opt,
        lr=config.peak_lr,
        weight_decay=config.weight_decay,
        momentum=config.momentum,
        layer_decay=config.layer_decay,
        **extra,
    )


def create_schedule(optimizer: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int) -> Scheduler:
    """timm's schedule `config.sched` with linear warm-up, stepped once per optimiser step: every length
    is given in steps (updates_per_epoch=1), the warm-up rounded to a whole step. It decays over --epochs,
    then holds --min-lr for --cooldown-epochs more, as timm's train.py."""
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=config.sched,
        num_epochs=config.epochs * steps_per_epoch,
        decay_epochs=config.decay_epochs * steps_per_epoch,
        decay_milestones=[m * steps_per_epoch for m in config.decay_milestones],
        cooldown_epochs=config.cooldown_epochs * steps_per_epoch,
        decay_rate=config.decay_rate,
        min_lr=config.min_lr,
        warmup_lr=config.warmup_lr,
        warmup_epochs=round(config.warmup_epochs * steps_per_epoch),
        step_on_epochs=False,
        updates_per_epoch=1,
    )
    return scheduler
