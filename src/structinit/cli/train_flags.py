"""The flags of `train`, `compare` and `choose`, generated from the settings' declarations
(training/settings.py), and the training settings they give."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..training.setting import GROUPS, Setting, flag
from ..training.settings import SETTING_DEFAULTS, SETTINGS, TrainConfig
from .model_flags import ASSIGNMENTS

# `train --filters`, for ConvMixer: the init label each choice stands for
FILTERS = {
    "trained": "default",
    "random": "random[freeze=True]",
    "impulse": "impulse[freeze=True]",
    "box": "box[freeze=True]",
}
EMA_DECAY = 0.9998  # timm's --model-ema-decay default
# flags of structinit 0.1 whose settings now live elsewhere, and where
REMOVED = {
    "--options": "write the options in the init label: --init 'impulse[target_fidelity=0.9]'",
    "--init-kwargs": "write the options in the init label: --init 'impulse[target_fidelity=0.9]'",
    "--kernel-size": "write it in the init label: --init 'impulse[kernel_size=5]'",
}


class _Removed(argparse.Action):
    """A flag that was renamed: fail with where its setting went, not with 'unrecognized arguments'."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        parser.error(f"{option_string} is gone: {REMOVED[option_string]}")


class _OneSpelling(argparse._StoreAction):
    """A setting with several spellings (--randaugment, --aa): two spellings with different values are
    refused, not the last taken silently (timm has one spelling; the same flag twice: the last, as argparse)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        seen = f"_{self.dest}_given_as"
        before = getattr(namespace, seen, None)
        if before is not None and before[0] != option_string and before[1] != values:
            parser.error(f"{before[0]} {before[1]} and {option_string} {values} set the same setting: give one")
        setattr(namespace, seen, (option_string, values))
        super().__call__(parser, namespace, values, option_string)


def add_removed_flags(parser: argparse.ArgumentParser) -> None:
    for name in REMOVED:
        parser.add_argument(name, action=_Removed, help=argparse.SUPPRESS)


def add_train_arguments(parser: argparse.ArgumentParser, grid: bool = False) -> dict[str, Any]:
    """Flags of `train`, one per setting TrainConfig declares with a flag, and of `compare` (`grid`: lists
    of subset sizes; the init and seed come from --inits/--seeds), each in its --help section (GROUPS,
    the common ones first); returns the sections. None means the preset's value or the default. `train`
    has --filters beside --init, --model-ema beside --ema-decay and --input-size beside --img-size."""
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    common = groups["common"].add_argument
    common("-h", "--help", action="help", help="show this help and exit")
    parser.add_argument("folder", nargs="?", metavar="DIR", help="an image folder: the same as --data imagefolder:DIR")
    common("-c", "--config", metavar="FILE", help="YAML of settings; flags override it")
    add_removed_flags(parser)
    for name, about in SETTINGS.items():
        add = groups[about.group].add_argument
        if grid and name in GRID_FLAGS:
            add(*GRID_FLAGS[name][0], **GRID_FLAGS[name][1])
        elif about.flag and (about.grid or not grid):
            add(*setting_flags(name, about), **setting_arguments(name, about))
        if name == "init" and not grid:
            groups["model"].add_argument(
                "--filters",
                choices=sorted(FILTERS),
                help="ConvMixer, instead of --init: trained (learned from the default init), or frozen at "
                "random (the default init), impulse (one-hot) or box (all 1/f^2) values",
            )
        if name == "img_size":
            add(
                "--input-size",
                nargs=3,
                type=int,
                metavar=("C", "H", "W"),
                help="timm's form of --img-size: C H W, square (H = W); C is the data's channels",
            )
        if name == "ema_decay":
            add("--model-ema", action="store_true", help=f"keep an EMA of the weights (decay {EMA_DECAY} unless given)")
    return groups


# the settings `compare` takes as its own flags: the subset sizes it goes through, the grid's directory
GRID_FLAGS = {
    "per_class": (
        ("--per-class",),
        {"help": "comma-separated subset sizes per class, e.g. 100,200,500 (default: all images)"},
    ),
    "out": (
        ("--out", "--output"),
        {"default": "runs/compare", "metavar": "DIR", "help": "directory of the grid's runs and results"},
    ),
}


def setting_flags(name: str, about: Setting) -> list[str]:
    """A setting's option strings: its short alias first, then --its-name, then its other aliases."""
    short = [a for a in about.aliases if not a.startswith("--")]
    return [*short, flag(name), *(a for a in about.aliases if a.startswith("--"))]


def setting_arguments(name: str, about: Setting) -> dict[str, Any]:
    """argparse's keywords for setting `name`: bool settings are switches, numbers are typed, text and
    the rest (parsed by the setting's `parse`) are strings; absent means None. Its help ends with its
    default unless it says the default itself."""
    declared = TrainConfig.__dataclass_fields__[name].type
    base = declared.partition(" | ")[0]
    arguments: dict[str, Any] = {"help": about.help}
    if base == "bool":
        switch = argparse.BooleanOptionalAction if declared == "bool | None" else "store_true"  # None: by device
        return {**arguments, "action": switch, "default": None}
    if "default" not in about.help:
        arguments["help"] = f"{about.help} (default: {shown_default(SETTING_DEFAULTS[name])})"
    if name == "model_kwargs":
        arguments.update(ASSIGNMENTS)
    elif len(setting_flags(name, about)) > 1:
        arguments["action"] = _OneSpelling
    if base in ("int", "float"):
        arguments["type"] = int if base == "int" else float
        arguments["metavar"] = "N" if base == "int" else "X"
    if about.metavar:
        arguments["metavar"] = about.metavar
    if about.choices:
        arguments["choices"] = list(about.choices)
    return arguments


def shown_default(value: Any) -> str:
    """A default as --help shows it: lists as the flag takes them, nothing given as 'none'."""
    if value is None or value in ([], {}):
        return "none"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def train_values(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings given on the command line (not the preset's or the defaults)."""
    values = {**data_values(args)}
    for name, about in SETTINGS.items():
        value = getattr(args, name, None)
        if value is None or name == "preset" or (name == "per_class" and isinstance(value, str)):
            continue  # the preset is resolved first; compare's subset sizes are its own
        values[name] = about.parse(value, flag(name)) if about.parse else value
    if args.model_ema and args.ema_decay is None:
        values["ema_decay"] = EMA_DECAY
    if getattr(args, "filters", None):
        if args.init:
            raise ValueError("--filters and --init both set the init: give one")
        values["init"] = FILTERS[args.filters]
    return values


def data_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of the positional DIR (--data imagefolder:DIR) and of --input-size (--img-size)."""
    values: dict[str, Any] = {}
    if getattr(args, "folder", None):
        if args.data is not None:
            raise ValueError(f"DIR {args.folder} and --data {args.data} both name the data: give one")
        values["data"] = f"imagefolder:{args.folder}"
    if getattr(args, "input_size", None):
        _, height, width = args.input_size
        if height != width or (args.img_size is not None and args.img_size != height):
            shown = " ".join(map(str, args.input_size))
            raise ValueError(
                f"--input-size {shown}: images are resized square; give one size, e.g. --img-size {height}"
            )
        values["img_size"] = height
    return values


def train_config(args: argparse.Namespace, **overrides: Any):
    """Defaults, then the preset, then --config's file, then the flags, then `overrides`."""
    values = {**file_values(args), **train_values(args), **overrides}
    preset = args.preset or values.pop("preset", None)
    values.pop("preset", None)
    config = TrainConfig.from_preset(preset, **values)
    if getattr(args, "input_size", None):
        check_input_channels(args.input_size[0], config)
    return config


def check_input_channels(channels: int, config: TrainConfig) -> None:
    """--input-size's C is the data's channels: checked against the data (loaded only for this flag)."""
    from ..training.recipe import data_of

    data = data_of(config)
    has = data.channels
    if channels != has:
        size = config.img_size
        raise ValueError(
            f"--input-size {channels} {size} {size}: the data ({config.data}) has {has} channel(s); give C = {has}"
        )


def file_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of --config FILE (none without it)."""
    from ..training.config_file import read_config_file

    return read_config_file(Path(args.config)) if args.config else {}
