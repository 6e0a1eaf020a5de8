"""The settings of what a run trains and evaluates on: the first fields of TrainConfig (settings.py),
declared as every setting is (setting.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .setting import GRID_AXIS, NEW, NEW_060, PLACE, SEED_BOUNDS, WATCHED, names, setting

# (timm's --dataset torch/NAME reads that set under DIR, --dataset '' the folder DIR: docs/training.md)
DATA_HELP = "digits | imagefolder:DIR | cifar10 | cifar100 | svhn | stl10 | flowers102 | pets | food101 | imagenet:DIR"
# the interpolations of timm's --interpolation (PIL's filters) that an evaluation resize takes
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")


def numbers(texts: list[str], flag: str) -> list[float]:
    """A flag's words (timm's `--mean 0.485 0.456 0.406`) as numbers."""
    try:
        return [float(text) for text in texts]
    except ValueError:
        raise ValueError(f"{flag} takes numbers, e.g. {flag} 0.5, got {' '.join(texts)}") from None


@dataclass
class DataSettings:
    """The data, where it is, which part of it a run trains and evaluates on, and at what size."""

    data: str = setting("digits", group="common", aliases=("--dataset",), metavar="SPEC", help=DATA_HELP)
    data_root: str = setting(
        "data",
        group="data",
        aliases=("--data-dir",),
        help="where torchvision datasets live or are downloaded",
        **PLACE,
    )
    train_split: str | None = setting(
        None,
        group="data",
        metavar="NAME",
        help="the training folder of an image folder (timm's --train-split; default: train/, else training/)",
        since="0.5.0",
    )
    val_split: str | None = setting(
        None,
        group="data",
        metavar="NAME",
        help="its evaluation folder (timm's --val-split; default: the first of test/ val/ validation/ valid/ eval/ "
        "evaluation/)",
        since="0.5.0",
    )
    download: bool = setting(
        False,
        group="data",
        aliases=("--dataset-download",),
        help="download a torchvision dataset into --data-dir/NAME (needs internet)",
        **PLACE,
    )
    cache_dir: str | None = setting(
        None,
        group="data",
        help="where decoded small images are cached (default: $STRUCTINIT_CACHE, else ~/.cache/structinit)",
        **PLACE,
    )
    per_class: int | None = setting(
        None,
        group="data",
        grid=False,
        bounds="[1, inf)",
        metavar="K",
        help="train on a stratified subset of K images per class",
        **GRID_AXIS,
    )
    train_fraction: float | None = setting(
        None, group="data", bounds="(0, 1]", help="train on a stratified fraction of each class"
    )
    subset_seed: int = setting(0, group="data", bounds=SEED_BOUNDS, help="seed of the subset draw")
    val_per_class: int | None = setting(
        None,
        group="data",
        bounds="[1, inf)",
        metavar="K",
        help="hold out K training images per class (stratified, disjoint from the subset) and evaluate on them "
        "instead of the test set: choose settings there, report the test set once",
    )
    eval_per_class: int | None = setting(
        None,
        group="data",
        bounds="[1, inf)",
        metavar="K",
        help="evaluate during training on a stratified K images per class of the evaluation split (the same "
        "images every time); the last evaluation on the whole split unless --eval-final subset",
        resume="recorded",
        identity=False,
        since="0.3.2",
    )
    eval_final: str = setting(
        "full",
        group="data",
        choices=("full", "subset"),
        help="the last evaluation (the run's result): on the whole evaluation split, or on --eval-per-class's subset",
        resume="recorded",
        since="0.3.2",
    )
    classes: list[str] = setting(
        [],
        group="data",
        parse=names,
        metavar="NAME,NAME",
        help="train and evaluate on these classes only (by folder or class name), relabelled in the data's order",
        **NEW,
    )
    img_size: int | None = setting(
        None,
        group="data",
        bounds="[1, inf)",
        metavar="PX",
        help="resize every image to PX x PX as it is loaded, e.g. a folder of mixed sizes (timm's --img-size; "
        "--input-size C H W sets it too)",
        **NEW,
    )
    num_classes: int | None = setting(
        None,
        group="data",
        bounds="[2, inf)",
        help="the number of classes the data must have (checked)",
        **NEW,
    )
    mean: list[float] | None = setting(
        None,
        group="data",
        parse=numbers,
        nargs="+",
        metavar="X",
        help="normalisation mean of each channel (timm's; one value: every channel's; default: the model's, else 0.5)",
        **NEW_060,
    )
    std: list[float] | None = setting(
        None,
        group="data",
        parse=numbers,
        nargs="+",
        metavar="X",
        help="normalisation std of each channel (as --mean)",
        **NEW_060,
    )
    crop_pct: float | None = setting(
        None,
        group="data",
        bounds="(0, 1]",
        help="timm's evaluation crop: images resized to size / X, then the centre size x size taken (default: "
        "streamed images the model's, 0.9 for ViTs; images in memory as they are)",
        **NEW_060,
    )
    interpolation: str | None = setting(
        None,
        group="data",
        choices=INTERPOLATIONS,
        help="the evaluation resize's interpolation (timm's; default: the model's, bicubic for ViTs)",
        **NEW_060,
    )
    pin_mem: bool | None = setting(
        None, group="data", help="DataLoaders pin memory (default: on CUDA; timm's --pin-mem)", **NEW_060, **WATCHED
    )
    hflip: float | None = setting(
        None,
        group="augment",
        bounds="[0, 1]",
        metavar="P",
        help="flip training images left-right with probability P (timm's; default: 0.5, except digits and svhn: 0)",
        **NEW_060,
    )
    color_jitter: float | None = setting(
        None,
        group="augment",
        bounds="[0, inf)",
        help="timm's colour jitter of training images: brightness, contrast and saturation by factors in [1-X, 1+X], "
        "off under an --aa policy as in timm (default: 0.4 on streamed images, timm's; off in memory)",
        **NEW_060,
    )
    scale: list[float] | None = setting(
        None,
        group="augment",
        parse=numbers,
        nargs=2,
        metavar="X",
        help="timm's RandomResizedCrop area range of streamed training images (default: 0.08 1)",
        **NEW_060,
    )
    ratio: list[float] | None = setting(
        None,
        group="augment",
        parse=numbers,
        nargs=2,
        metavar="X",
        help="its aspect-ratio range (default: 0.75 1.333)",
        **NEW_060,
    )


def check_data_settings(config: Any) -> None:
    """What the declared types and bounds leave out: --mean and --std finite (--std positive), --scale and --ratio
    positive ranges with MIN <= MAX (timm's RandomResizedCrop)."""
    for name, low in (("mean", -math.inf), ("std", 0.0), ("scale", 0.0), ("ratio", 0.0)):
        values = getattr(config, name)
        if values is None:
            continue
        shown = f"--{name} {' '.join(f'{v:g}' for v in values)}"
        if not values or not all(math.isfinite(v) and v > low for v in values):
            raise ValueError(f"{shown}: give finite numbers{' above 0' if low == 0 else ''}")
        if name in ("scale", "ratio") and (len(values) != 2 or values[0] > values[1]):
            raise ValueError(f"{shown}: give the range as MIN MAX, MIN <= MAX")
