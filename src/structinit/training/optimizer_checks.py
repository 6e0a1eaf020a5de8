"""Which of timm's optimisers a run may name: those timm's factory makes and this trainer can run (not the
second-order ones, not those only a CUDA GPU with bitsandbytes or apex runs), with the options each takes."""

from __future__ import annotations

import inspect

EXAMPLES = ("adamw", "adam", "sgd", "momentum", "lamb", "lion", "nadamw")  # some of timm's optimisers


def check_optimizer(name: str) -> None:
    """An optimiser timm's factory makes (a `lookahead_` prefix allowed, as timm takes it)."""
    from timm.optim import list_optimizers

    known = list_optimizers()
    if name.removeprefix("lookahead_") not in known:
        raise ValueError(f"--opt {name}: timm has no such optimiser; e.g. {', '.join(EXAMPLES)} ({len(known)} in all)")


def runnable_optimizer(opt: str, device: str) -> str:
    """`opt`'s optimiser (lookahead_ dropped), where this trainer can run it on `device` (--device): timm
    lists second-order ones (adahessian: backward(create_graph=True)) and CUDA-only ones."""
    import torch
    from timm.optim import get_optimizer_info

    name = opt.removeprefix("lookahead_")
    info = get_optimizer_info(name)
    if info.second_order:
        raise ValueError(f"--opt {opt} is second-order (gradients of gradients), which this trainer does not take")
    package = str(info.opt_class).partition(".")[0] if isinstance(info.opt_class, str) else ""
    if package in ("apex", "bitsandbytes") and (device.startswith(("cpu", "mps")) or not torch.cuda.is_available()):
        raise ValueError(f"--opt {opt} is {package}'s: it runs on a CUDA GPU only (pip install {package})")
    return name


def check_optimizer_options(opt: str, betas: list[float] | None, eps: float | None, device: str) -> None:
    """--opt-betas are two numbers in [0, 1), and --opt-betas/--opt-eps only for an optimiser that takes them."""
    from timm.optim import get_optimizer_class

    if betas is not None and (len(betas) != 2 or not all(0 <= b < 1 for b in betas)):
        raise ValueError(f"--opt-betas takes two numbers in [0, 1), e.g. 0.9,0.999, got {','.join(map(str, betas))}")
    takes = inspect.signature(get_optimizer_class(runnable_optimizer(opt, device), bind_defaults=False)).parameters
    for name, value in (("betas", betas), ("eps", eps)):
        if value is not None and name not in takes:
            raise ValueError(f"--opt-{name} given, but --opt {opt} takes no {name}: leave it out")
