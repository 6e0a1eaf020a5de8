"""The settings of what a run trains and evaluates on: the first fields of TrainConfig (settings.py),
declared as every setting is (setting.py)."""

from __future__ import annotations

from dataclasses import dataclass

from .setting import GRID_AXIS, NEW, PLACE, SEED_BOUNDS, names, setting

DATA_HELP = "digits | imagefolder:DIR | cifar10 | cifar100 | svhn | stl10 | flowers102 | pets | food101 | imagenet:DIR"


@dataclass
class DataSettings:
    """The data, where it is, which part of it a run trains and evaluates on, and at what size."""

    data: str = setting("digits", group="common", metavar="SPEC", help=DATA_HELP)
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
    download: bool = setting(False, group="data", help="download a torchvision dataset (needs internet)", **PLACE)
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
