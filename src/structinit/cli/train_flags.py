"""The flags of `train`, `compare` and `choose`, generated from the settings' declarations
(training/settings.py), and the training settings they give."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

from ..data.torchvision_sets import is_timm_dataset, timm_data
from ..training.setting import GROUPS, Setting, flag
from ..training.settings import SETTING_DEFAULTS, SETTINGS, TrainConfig
from .model_flags import ASSIGNMENTS
from .timm_flags import add_timm_flags, timm_values

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
            add(*setting_flags(name, about), **{**setting_arguments(name, about), **TIMM_FORMS.get(name, {})})
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
            add("--model-ema-decay", type=float, metavar="X", help="timm's: the decay of --model-ema (alone: no EMA)")
        if name == "amp":
            add("--amp-dtype", choices=sorted(AMP_DTYPES), help="timm's: the autocast dtype (--amp float16/bfloat16)")
    if not grid:
        add_timm_flags(parser)
    return groups


RESUME_HELP = "continue the run in --out, or PATH (default: no)"
# timm's forms of structinit's flags: a bare --amp (mixed precision on: structinit's auto picks the dtype by
# device), --resume PATH (a run's directory or its last.pt) beside a bare --resume
TIMM_FORMS: dict[str, dict[str, Any]] = {
    "amp": {"nargs": "?", "const": "auto"},
    "resume": {"action": "store", "nargs": "?", "const": True, "metavar": "PATH", "help": RESUME_HELP},
}
AMP_DTYPES = {"float16": "fp16", "bfloat16": "bf16"}  # timm's --amp-dtype -> structinit's --amp


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
    if about.nargs:
        arguments["nargs"] = about.nargs
    return arguments


def shown_default(value: Any) -> str:
    """A default as --help shows it: lists as the flag takes them, nothing given as 'none'."""
    if value is None or value in ([], {}):
        return "none"
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def train_values(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings given on the command line (not the preset's or the defaults)."""
    values = {**data_values(args), **timm_values(args), **timm_model_values(args)}
    for name, about in SETTINGS.items():
        value = getattr(args, name, None)
        if value is None or name in values or name == "preset" or (name == "per_class" and isinstance(value, str)):
            continue  # read above; the preset is resolved first; compare's subset sizes are its own
        values[name] = about.parse(value, flag(name)) if about.parse else value
    values.update(ema_values(args))
    values.update(lr_values(args))
    if getattr(args, "filters", None):
        if args.init:
            raise ValueError("--filters and --init both set the init: give one")
        values["init"] = FILTERS[args.filters]
    return values


def ema_values(args: argparse.Namespace) -> dict[str, Any]:
    """--ema-decay (structinit's: EMA on), or timm's --model-ema [--model-ema-decay X]; timm's decay alone
    keeps no EMA, as in timm (a note says so)."""
    from ..errors import Notice

    decay, timm_decay = args.ema_decay, getattr(args, "model_ema_decay", None)
    if decay is not None and timm_decay is not None and decay != timm_decay:
        raise ValueError(f"--ema-decay {decay} and --model-ema-decay {timm_decay} set the same decay: give one")
    if decay is not None or not (args.model_ema or timm_decay is not None):
        return {}
    if not args.model_ema:
        note = f"--model-ema-decay {timm_decay} without --model-ema: no EMA, as in timm (add --model-ema for one)"
        warnings.warn(note, Notice, stacklevel=3)
        return {}
    return {"ema_decay": EMA_DECAY if timm_decay is None else timm_decay}


def lr_values(args: argparse.Namespace) -> dict[str, Any]:
    """--lr given beside --lr-base: the lr is --lr's, as timm's train.py takes it (--lr-base is then unused)."""
    if getattr(args, "lr", None) is None or getattr(args, "lr_base", None) is None:
        return {}
    from ..errors import Notice

    warnings.warn(f"--lr {args.lr} given: --lr-base {args.lr_base} is unused, as in timm", Notice, stacklevel=3)
    return {"lr_base": None}


def timm_model_values(args: argparse.Namespace) -> dict[str, Any]:
    """timm's --amp-dtype, --resume PATH and the authors' fork's --model-kwargs weight_init/post_weight_init
    (as the init label that makes the same weights, said in a note)."""
    values: dict[str, Any] = {}
    dtype = getattr(args, "amp_dtype", None)
    if dtype is not None:
        if args.amp not in (None, "auto", AMP_DTYPES[dtype]):
            raise ValueError(f"--amp {args.amp} and --amp-dtype {dtype}: give one")
        values["amp"] = AMP_DTYPES[dtype]
    if isinstance(getattr(args, "resume", None), str):
        args.out, args.resume = resumed_run(args.resume, args.out), True  # the command resumes args.out
    if getattr(args, "model_kwargs", None):
        values.update(fork_values(args))
    return values


def fork_values(args: argparse.Namespace) -> dict[str, Any]:
    from ..errors import Notice
    from ..inits.fork_kwargs import fork_init

    kwargs = SETTINGS["model_kwargs"].parse(args.model_kwargs, "--model-kwargs")
    label, rest = fork_init(kwargs)
    if label is None:
        return {}
    given = " ".join(f"{k}={v}" for k, v in kwargs.items() if k in ("weight_init", "post_weight_init"))
    if getattr(args, "init", None) or getattr(args, "filters", None):
        raise ValueError(f"--model-kwargs {given} sets the init, as --init does: give one")
    warnings.warn(f"--model-kwargs {given}: the init --init {label}", Notice, stacklevel=4)
    return {"init": label, "model_kwargs": rest}


def resumed_run(path: str, out: str | None) -> str:
    """timm's --resume PATH: the run's directory (PATH, or the folder of its last.pt); --out, if given, the same."""
    run = Path(path).parent if Path(path).name == "last.pt" else Path(path)
    if Path(path).is_file() and Path(path).name != "last.pt":
        raise ValueError(f"--resume {path}: structinit resumes a run: give its directory or its last.pt")
    if out is not None and Path(out).resolve() != run.resolve():
        raise ValueError(f"--resume {path} and --out {out} name different runs: give one")
    return str(run)


def data_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of the positional DIR (--data imagefolder:DIR, or the root of timm's --dataset torch/NAME),
    of timm's --dataset names (data/torchvision_sets.py) and of --input-size (--img-size)."""
    values: dict[str, Any] = {}
    spec, folder = getattr(args, "data", None), getattr(args, "folder", None)
    if spec is not None and is_timm_dataset(spec):
        values.update(timm_data(spec, folder, getattr(args, "data_root", None)))
    elif folder:
        if spec is not None:
            raise ValueError(f"DIR {folder} and --data {spec} both name the data: give one")
        values["data"] = f"imagefolder:{folder}"
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
