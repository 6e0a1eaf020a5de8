"""Settings of timm's train.py, each with timm's meaning: the lr from --lr-base scaled by the batch (0.6.0),
layer-wise lr decay (0.6.0), the schedule's decays and its cool-down after --epochs, the model's dropout and
repeated augmentation (0.6.0). Declared as every setting is (setting.py); TrainConfig (settings.py) takes
them after the data's."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .data_settings import DataSettings
from .setting import NEW, NEW_060, int_list, setting

LR_BASE_HELP = (
    "timm's base lr: the peak lr is X x (global batch x --grad-accum-steps / --lr-base-size), or its square "
    "root (--lr-base-scale); used where --lr is not given"
)


@dataclass
class TimmSettings(DataSettings):
    """timm's lr scaling, layer decay, schedule shape, dropout and repeated augmentation."""

    lr_base: float | None = setting(None, group="optim", bounds="(0, inf)", metavar="X", help=LR_BASE_HELP, **NEW_060)
    lr_base_size: int = setting(
        256, group="optim", bounds="[1, inf)", help="the batch --lr-base is given for (timm's)", **NEW_060
    )
    lr_base_scale: str | None = setting(
        None,
        group="optim",
        choices=("linear", "sqrt"),
        help="how --lr-base scales with the batch (default: sqrt for adaptive optimisers, ada*/lamb*, else "
        "linear, as timm's train.py)",
        **NEW_060,
    )
    layer_decay: float | None = setting(
        None,
        group="optim",
        bounds="(0, 1]",
        help="layer-wise lr decay (timm.optim's): each block's lr is X times the next one's; 1.0: the same lr",
        **NEW_060,
    )
    cooldown_epochs: int = setting(
        0,
        group="optim",
        bounds="[0, inf)",
        help="K more epochs after --epochs, at --min-lr (timm's: --epochs 300 --cooldown-epochs 10 trains 310)",
        metavar="K",
        resume="schedule",
        since="0.6.0",
    )
    decay_epochs: float = setting(90, group="optim", bounds="(0, inf)", help="epochs between decays (step)", **NEW)
    decay_milestones: list[int] = setting(
        [90, 180, 270],
        group="optim",
        parse=int_list,
        metavar="E,E",
        help="epochs to decay the lr at (multistep)",
        **NEW,
    )
    decay_rate: float = setting(
        0.1,
        group="optim",
        aliases=("--dr",),
        bounds="(0, inf)",
        help="lr factor of each decay (step, multistep); the power of poly",
        **NEW,
    )
    drop_rate: float = setting(
        0.0,
        group="augment",
        aliases=("--drop",),
        bounds="[0, 1)",
        help="the model's dropout (timm's --drop)",
        **NEW_060,
    )
    aug_repeats: float = setting(
        0.0,
        group="augment",
        bounds="[0, 64]",
        help="repeated augmentation (timm's RepeatAugSampler): each image drawn N times across the processes, "
        "an epoch as long as the data; off in one process, as in timm",
        **NEW_060,
    )


def lr_scale_rule(opt: str, asked: str | None) -> str:
    """timm's train.py: `sqrt` for the adaptive optimisers (a name with 'ada' or 'lamb'), else `linear`."""
    return asked or ("sqrt" if any(part in opt.lower() for part in ("ada", "lamb")) else "linear")


def scaled_lr(lr_base: float, size: int, scale: str | None, opt: str, batch: int, accum: int) -> float:
    """timm's train.py's lr where --lr is not given: lr_base x (batch x accum / size), or its square root.
    `batch`: the global batch (structinit's -b; timm's -b times its processes)."""
    ratio = batch * accum / size
    return lr_base * (math.sqrt(ratio) if lr_scale_rule(opt, scale) == "sqrt" else ratio)
