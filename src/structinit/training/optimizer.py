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

EXAMPLES = ("adamw", "adam", "sgd", "momentum", "lamb", "lion", "nadamw")  # some of timm's optimisers

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
    config's lr, decay, momentum, eps and betas (eps and betas: the optimiser's own unless given)."""
    extra = {k: v for k, v in (("eps", config.opt_eps), ("betas", config.opt_betas)) if v is not None}
    if "betas" in extra:
        extra["betas"] = tuple(extra["betas"])
    name = config.opt.removeprefix("lookahead_")
    if "fused" in inspect.signature(get_optimizer_class(name, bind_defaults=False)).parameters:
        extra.update(optimizer_kernel(device))
    return create_optimizer_v2(
        model, config.opt, lr=config.lr, weight_decay=config.weight_decay, momentum=config.momentum, **extra
    )


def create_schedule(optimizer: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int) -> Scheduler:
    """timm's schedule `config.sched` with linear warm-up, stepped once per optimiser step: every length
    is given in steps (updates_per_epoch=1), the warm-up rounded to a whole step. --epochs is the whole
    run, its last --cooldown-epochs at --min-lr."""
    scheduler, _ = create_scheduler_v2(
        optimizer,
        sched=config.sched,
        num_epochs=(config.epochs - config.cooldown_epochs) * steps_per_epoch,
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


def check_optimizer(name: str) -> None:
    """An optimiser timm's factory makes (a `lookahead_` prefix allowed, as timm takes it)."""
    from timm.optim import list_optimizers

    known = list_optimizers()
    if name.removeprefix("lookahead_") not in known:
        raise ValueError(f"--opt {name}: timm has no such optimiser; e.g. {', '.join(EXAMPLES)} ({len(known)} in all)")


def runnable_optimizer(config: TrainConfig) -> str:
    """--opt's optimiser (lookahead_ dropped), where this trainer can run it: timm lists second-order ones
    (adahessian: backward(create_graph=True)) and ones only a CUDA GPU with bitsandbytes or apex runs."""
    from timm.optim import get_optimizer_info

    name = config.opt.removeprefix("lookahead_")
    info = get_optimizer_info(name)
    if info.second_order:
        raise ValueError(
            f"--opt {config.opt} is second-order (gradients of gradients), which this trainer does not take"
        )
    package = str(info.opt_class).partition(".")[0] if isinstance(info.opt_class, str) else ""
    if package in ("apex", "bitsandbytes") and (config.device.startswith(("cpu", "mps")) or not cuda_available()):
        raise ValueError(f"--opt {config.opt} is {package}'s: it runs on a CUDA GPU only (pip install {package})")
    return name


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def check_optimizer_options(config: TrainConfig) -> None:
    """--opt-betas are two numbers in [0, 1), and --opt-betas/--opt-eps only for an optimiser that takes them."""
    from timm.optim import get_optimizer_class

    betas = config.opt_betas
    if betas is not None and (len(betas) != 2 or not all(0 <= b < 1 for b in betas)):
        raise ValueError(f"--opt-betas takes two numbers in [0, 1), e.g. 0.9,0.999, got {','.join(map(str, betas))}")
    takes = inspect.signature(get_optimizer_class(runnable_optimizer(config), bind_defaults=False)).parameters
    for name, value in (("betas", betas), ("eps", config.opt_eps)):
        if value is not None and name not in takes:
            raise ValueError(f"--opt-{name} given, but --opt {config.opt} takes no {name}: leave it out")
