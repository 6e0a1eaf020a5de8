"""The training settings: each declared once, in TrainConfig, with everything the tool needs to know
about it (its flag and help, the values it takes, whether a resume may change it, whether it decides
what the run computes, whether a grid's recipe includes it). The CLI, the checks, the run's identity
and the grid's recipe hash all read these declarations; docs/layout.md shows how to add one."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import torch

from ..data.augment import parse_randaugment
from ..data.datasets import DATASETS_HELP, parse_spec
from ..errors import quoted
from ..inits.api import MAX_SEED
from ..inits.labels import VARIANTS, InitSpec, parse_assignments, split_top_level
from ..inits.registry import METHODS
from ..models import PRESETS, check_model_kwargs
from .loggers import check_loggers
from .settings_yaml import load_yaml

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
INIT_HELP = (
    f"init label (default impulse): a method ({', '.join(sorted(METHODS))}), a variant ({', '.join(VARIANTS)}), "
    "'default' (the model as constructed), or any of them with options in brackets, e.g. "
    "impulse[target_fidelity=0.9,kernel_size=5] (structinit init --list-options)"
)


@dataclass(frozen=True)
class Setting:
    """What the tool knows of one setting. `bounds` is an interval such as "[0, 1)" or "(0, inf)".
    `resume`: "fixed" (another value is another run), "free" (how the run is watched or where it runs),
    "recorded" (a resume may change it, and the log says so) or "schedule" (recorded, and it changes
    what the run trains from then on). `identity`: whether it decides what the run computes; `recipe`:
    whether a grid's recipe hash includes it (not the grid's own axes). `flag`: a `train` flag, and
    `grid` a `compare` flag too; `parse` turns the flag's text into the value. `since`: the version
    that added it (runs recorded before did what its default does, so its default is no part of
    their identity or hash)."""

    help: str | None = None
    flag: bool = True
    grid: bool = True
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str, str], Any] | None = None
    bounds: str | None = None
    resume: str = "fixed"
    identity: bool = True
    recipe: bool = True
    since: str | None = None


def setting(default: Any, **about: Any) -> Any:
    """A TrainConfig field with its Setting (a list or dict default is copied for every config)."""
    meta = {"setting": Setting(**about)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} needs at least one integer, got {text!r}")
    return values


def _optional_int_list(text: str, flag: str) -> list[int]:
    return int_list(text, flag) if text else []


def _assignments(text: str, flag: str) -> dict[str, Any]:
    return parse_assignments(text, flag)


def _names(text: str, flag: str) -> list[str]:
    return split_top_level(text)


WATCHED = {"resume": "free", "identity": False}  # how a run is watched or where it runs
PLACE = {"identity": False}  # where files are, not what is computed
GRID_AXIS = {"recipe": False}  # a grid varies it, so it is no part of the grid's recipe
SEED_BOUNDS = f"[0, {MAX_SEED}]"  # numpy's seeds


@dataclass
class TrainConfig:
    """Everything a run depends on; saved as config.yaml. Defaults suit `--data digits` on a CPU."""

    data: str = setting("digits", help=f"dataset (default digits): {DATASETS_HELP}")
    data_root: str = setting(
        "data",
        aliases=("--data-dir",),
        help="where torchvision datasets live or are downloaded (default ./data)",
        **PLACE,
    )
    download: bool = setting(False, help="download a torchvision dataset (needs internet)", **PLACE)
    cache_dir: str | None = setting(
        None, help="where decoded small-image datasets are cached (default ~/.cache/structinit)", **PLACE
    )
    per_class: int | None = setting(
        None, grid=False, bounds="[1, inf)", help="train on a stratified subset of K images per class", **GRID_AXIS
    )
    train_fraction: float | None = setting(None, bounds="(0, 1]", help="train on a stratified fraction of each class")
    subset_seed: int = setting(0, bounds=SEED_BOUNDS, help="seed of the subset draw (default 0)")
    val_per_class: int | None = setting(
        None,
        bounds="[1, inf)",
        metavar="K",
        help="hold out K training images per class (stratified, disjoint from the subset) and evaluate on them "
        "instead of the test set: choose settings there, report the test set once",
    )
    classes: list[str] = setting(
        [],
        parse=_names,
        metavar="NAME,NAME",
        help="train and evaluate on these classes only (by folder or class name), relabelled in the data's order",
        since="0.3.0",
    )
    model: str = setting("vit_digits", help=f"timm model name or preset ({', '.join(PRESETS)})")
    model_kwargs: dict[str, Any] = setting(
        {}, parse=_assignments, help="timm.create_model keywords, e.g. depth=6,num_heads=12,global_pool=avg"
    )
    # an init label: method or variant, options in brackets (kernel_size among them)
    init: str = setting("impulse", grid=False, help=INIT_HELP, **GRID_AXIS)
    teacher: str | None = setting(
        None,
        help="the larger model of --init select (weight selection): a timm model name (pretrained), a .safetensors "
        "or .pth file, or a run directory",
        since="0.3.0",
    )
    epochs: int = setting(30, bounds="[1, inf)", resume="schedule", **GRID_AXIS)
    batch_size: int = setting(
        128, aliases=("-b",), bounds="[1, inf)", help="global batch size (split across processes)"
    )
    lr: float = setting(1e-3, bounds="(0, inf)", resume="schedule")
    weight_decay: float = setting(0.05, bounds="[0, inf)")
    warmup_epochs: float = setting(3, bounds="[0, inf)")
    warmup_lr: float = setting(1e-6, flag=False, bounds="[0, inf)")
    min_lr: float = setting(1e-5, bounds="[0, inf)", help="final learning rate of the cosine schedule")
    smoothing: float = setting(0.1, bounds="[0, 1)", help="label smoothing")
    mixup: float = setting(0.0, bounds="[0, inf)", help="mixup alpha (0 = off)")
    cutmix: float = setting(0.0, bounds="[0, inf)", help="cutmix alpha (0 = off)")
    drop_path: float = setting(0.0, bounds="[0, 1)")
    clip_grad: float | None = setting(None, bounds="(0, inf)")
    ema_decay: float | None = setting(
        None,
        aliases=("--model-ema-decay",),
        bounds="(0, 1)",
        help="keep an EMA of the weights with this decay and report its accuracy",
    )
    crop_padding: int | None = setting(None, flag=False)  # None: image size / 8
    flip: bool | None = setting(None, flag=False)  # None: on, except for digits and svhn
    randaugment: str | None = setting(
        None, aliases=("--aa",), help="timm RandAugment string, e.g. rand-m9-mstd0.5-inc1"
    )
    reprob: float = setting(0.0, bounds="[0, 1]", help="random erasing probability")
    amp: str = setting("auto", choices=("auto", "bf16", "fp16", "none"))
    compile: bool | None = setting(
        None,
        aliases=("--torchcompile",),
        help="torch.compile the model (inductor); default: on CUDA only (--no-compile: eager there too)",
        **WATCHED,
    )
    device: str = setting("auto", help="auto (default), cpu, cuda, cuda:1, mps", **WATCHED)
    log: list[str] = setting(
        [],
        parse=_names,
        metavar="NAME,NAME",
        help="loggers beside metrics.jsonl: tensorboard (OUT/tensorboard), wandb (WANDB_PROJECT, default structinit)",
        resume="recorded",
        identity=False,
    )
    workers: int = setting(4, aliases=("-j",), bounds="[0, inf)", help="DataLoader workers for large images", **WATCHED)
    eval_batch_size: int = setting(512, flag=False, bounds="[1, inf)", **WATCHED)
    eval_every: int = setting(
        1,
        bounds="[1, inf)",
        metavar="K",
        help="evaluation every K epochs and after the last (default 1)",
        resume="recorded",
        **GRID_AXIS,
    )
    snapshot_epochs: list[int] = setting(
        [],
        parse=_optional_int_list,
        metavar="E,E",
        help="keep the weights after these epochs in OUT/snapshots (0: at init)",
        resume="recorded",
        **GRID_AXIS,
    )
    seed: int = setting(0, grid=False, bounds=SEED_BOUNDS, **GRID_AXIS)
    out: str = setting(
        "runs/run",
        grid=False,
        aliases=("--output",),
        help="the run's directory (default runs/run; timm's --output is its parent)",
        **PLACE,
    )
    resume: bool = setting(False, grid=False, help="continue the run in --out from its last checkpoint", identity=False)
    stop_after: int | None = setting(
        None,
        grid=False,
        bounds="[1, inf)",
        metavar="K",
        help="end after epoch K, leaving a resumable checkpoint",
        **WATCHED,
    )
    quiet: bool = setting(False, help="no progress bars", **WATCHED)
    preset: str | None = setting(
        None, help="recipe preset: small-data, imagenet, cpu-quick (under --config and the flags)", **GRID_AXIS
    )

    def __post_init__(self) -> None:
        """Bad values fail here, in flag terms, before any data is loaded or any directory is made."""
        for f in dataclasses.fields(self):
            check_value(f.name, f.type, SETTINGS[f.name].bounds, getattr(self, f.name))
        if not self.out:  # Path("") is the current directory
            raise ValueError("--out is empty: give the run's directory, e.g. --out runs/mine")
        spec = InitSpec.parse(self.init)
        if spec.method == "select" and self.teacher is None and spec.options.get("teacher") is None:
            raise ValueError(f"--init {self.init} selects from a larger model: give it with --teacher")
        parse_spec(self.data)
        check_loggers(self.log)
        check_model_kwargs(self.model_kwargs)
        from_data = sorted({"num_classes", "in_chans"} & set(self.model_kwargs))
        if from_data:
            raise ValueError(f"--model-kwargs {', '.join(from_data)}: the data sets it (its classes and channels)")
        epochs = self.snapshot_epochs
        if any(isinstance(e, bool) or not isinstance(e, int) for e in epochs) or len(set(epochs)) < len(epochs):
            raise ValueError(f"--snapshot-epochs takes distinct integers, got {epochs}")
        if any(not 0 <= e <= self.epochs for e in epochs):
            raise ValueError(f"--snapshot-epochs must lie in 0..{self.epochs}, got {epochs}")
        if self.min_lr > self.lr:
            raise ValueError(f"--min-lr {self.min_lr} exceeds --lr {self.lr}: the cosine schedule would climb")
        if self.per_class is not None and self.train_fraction is not None:
            raise ValueError("give --per-class or --train-fraction, not both")
        if self.randaugment:
            parse_randaugment(self.randaugment)

    @property
    def init_spec(self) -> InitSpec:
        """The init label, parsed (InitSpec.parse reads a label once per process)."""
        return InitSpec.parse(self.init)

    @classmethod
    def from_preset(cls, preset: str | None, **overrides: Any) -> TrainConfig:
        """Defaults, then the preset's YAML, then the explicit overrides (None: not given)."""
        values: dict[str, Any] = {}
        if preset:
            values.update(load_preset(preset))
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown training setting(s): {', '.join(unknown)}")
        return cls(**{**values, "preset": preset})

    @property
    def eval_split(self) -> str:
        """What the run evaluates on, and the prefix of its metrics: 'val' with a validation split
        (choose settings there; the test set is not touched), else 'test'."""
        return "val" if self.val_per_class else "test"


SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in dataclasses.fields(TrainConfig)}
SETTING_DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
    for f in dataclasses.fields(TrainConfig)
}
# a setting's declared type -> (the Python types it takes, its name in messages)
SETTING_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "str": ((str,), "text"),
    "dict[str, Any]": ((dict,), "a mapping of keywords"),
    "list[int]": ((list, tuple), "a list of integers"),
    "list[str]": ((list, tuple), "a list of names"),
}
BOUNDS = re.compile(r"^([\[(])(-?[\d.e+]+), (-?[\d.e+]+|inf)([\])])$")


def check_value(name: str, declared: str, bounds: str | None, value: Any) -> None:
    """A setting's value is of its declared type (None where the type allows it: a YAML file can hold
    'false' for a flag or 1.5 for a count, which would otherwise act as something else) and within
    its bounds."""
    base, _, optional = declared.partition(" | ")
    if value is None and optional == "None":
        return
    kinds, what = SETTING_TYPES[base]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise ValueError(f"{flag(name)} takes {what}, got {quoted(value)}")
    if base == "list[str]" and not all(isinstance(item, str) for item in value):
        raise ValueError(f"{flag(name)} takes {what}, got {quoted(value)}")
    if bounds is not None:
        check_bounds(name, bounds, value)


def check_bounds(name: str, bounds: str, value: float) -> None:
    opening, low_text, high_text, closing = BOUNDS.match(bounds).groups()
    low, high = float(low_text), float(high_text)
    if not math.isfinite(value):
        raise ValueError(f"{flag(name)} takes a finite number, got {value}")
    if abs(value) > FLOAT32_MAX and math.isinf(high):
        raise ValueError(f"{flag(name)} {value} does not fit in float32, which the run computes in")
    below = value <= low if opening == "(" else value < low
    above = value >= high if closing == ")" else value > high
    if below or above:
        low_shown, high_shown = (int(x) if x.is_integer() else x for x in (low, high))
        shown = f"{'>' if opening == '(' else '>='} {low_shown}"
        if math.isfinite(high):
            shown += f" and {'<' if closing == ')' else '<='} {high_shown}"
        raise ValueError(f"{flag(name)} must be {shown}, got {value}")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("structinit.presets").iterdir())


def load_preset(name: str) -> dict[str, Any]:
    if name not in presets():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(presets())}")
    return load_yaml(resources.files("structinit.presets").joinpath(f"{name}.yaml").read_text())
