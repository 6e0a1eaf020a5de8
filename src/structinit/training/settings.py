"""The training settings: each declared once, in TrainConfig, with everything the tool needs to know
about it (its flag and help, the values it takes, whether a resume may change it, whether it decides
what the run computes, whether a grid's recipe includes it). The CLI, the checks, the run's identity
and the grid's recipe hash all read these declarations; docs/layout.md shows how to add one."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from ..inits.labels import InitSpec
from .presets import load_preset
from .setting import (
    GRID_AXIS,
    NEW,
    PLACE,
    SEED_BOUNDS,
    WATCHED,
    Setting,
    assignments,
    check_value,
    float_list,
    lower,
    names,
    optional_int_list,
    setting,
)
from .setting import (
    flag as flag,  # studies/results.py takes it from here
)
from .settings_yaml import MAX_BYTES
from .timm_settings import TimmSettings, scaled_lr

SCHEDULES = ("cosine", "tanh", "step", "multistep", "poly")  # timm's schedules that need no metric
COMPILE_HELP = "torch.compile the model (inductor); default: on CUDA only (--no-compile: eager there too)"
COMPILE_MODE_HELP = "torch.compile's mode for training (reduce-overhead: CUDA graphs); giving one compiles"
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
COMPILE_MODE = {"aliases": ("--torchcompile-mode",), "choices": COMPILE_MODES, "since": "0.4.0"}
ACCUM_HELP = "batches whose gradients add up to one optimiser step (timm's): each step sees N x --batch-size images"
INIT_SHORT = "init label, e.g. impulse, timm (init --list-options); auto: mimetic[base=kaiming] on ViTs"


@dataclass
class TrainConfig(TimmSettings):
    """Everything a run depends on; saved as config.yaml, the data's settings (DataSettings) first, then
    timm's schedule shape, lr scaling, layer decay, dropout and repeated augmentation (TimmSettings).
    Defaults suit `--data digits` on a CPU."""

    model: str = setting(
        "vit_digits", group="common", metavar="NAME", help="timm model or preset (structinit init --list-models)"
    )
    model_kwargs: dict[str, Any] = setting(
        {},
        group="model",
        parse=assignments,
        metavar="K=V,...",
        help="timm.create_model keywords, e.g. depth=6,num_heads=12,patch_size=4",
    )
    # an init label: method or variant, options in brackets (kernel_size among them)
    init: str = setting("auto", group="common", grid=False, metavar="LABEL", help=INIT_SHORT, **GRID_AXIS)
    teacher: str | None = setting(
        None,
        group="model",
        help="the larger model of --init select (weight selection): a timm model name (pretrained), a .safetensors "
        "or .pth file, or a run directory",
        **NEW,
    )
    initial_checkpoint: str | None = setting(
        None,
        group="model",
        metavar="FILE",
        help="start from these weights instead of an init: `structinit init --save`'s file or any state dict "
        "(.safetensors, .pth, .pt, .bin; timm's .pth.tar checkpoints too), checked as docs/training.md says",
        since="0.3.2",
    )
    epochs: int = setting(
        30,
        group="common",
        bounds="[1, inf)",
        metavar="N",
        help="epochs before --cooldown-epochs",
        resume="schedule",
        **GRID_AXIS,
    )
    batch_size: int = setting(
        128, group="common", aliases=("-b",), bounds="[1, inf)", metavar="N", help="global batch size"
    )
    grad_accum_steps: int = setting(1, group="optim", bounds="[1, inf)", metavar="N", help=ACCUM_HELP, since="0.5.0")
    lr: float = setting(1e-3, group="common", bounds="(0, inf)", help="peak learning rate", resume="schedule")
    opt: str = setting(
        "adamw",
        group="optim",
        parse=lower,
        help="timm's optimiser by name (timm.optim.list_optimizers()), e.g. adamw, sgd, momentum, lamb, lion",
        **NEW,
    )
    opt_eps: float | None = setting(None, group="optim", bounds="(0, inf)", help="eps (none: the opt's own)", **NEW)
    opt_betas: list[float] | None = setting(
        None,
        group="optim",
        parse=float_list,
        metavar="B1,B2",
        help="betas, e.g. 0.9,0.999 (none: the opt's own)",
        **NEW,
    )
    momentum: float = setting(0.9, group="optim", bounds="[0, 1)", help="momentum of sgd and the like", **NEW)
    weight_decay: float = setting(0.05, group="optim", bounds="[0, inf)", help="weight decay (not on norms and biases)")
    sched: str = setting("cosine", group="optim", choices=SCHEDULES, help="timm's lr schedule, per step", **NEW)
    warmup_epochs: float = setting(3, group="optim", bounds="[0, inf)", help="epochs of linear warm-up")
    warmup_lr: float = setting(1e-6, group="optim", bounds="[0, inf)", help="lr the warm-up starts at")
    min_lr: float = setting(1e-5, group="optim", bounds="[0, inf)", help="final lr (cosine, tanh, poly)")
    smoothing: float = setting(0.1, group="augment", bounds="[0, 1)", help="label smoothing")
    mixup: float = setting(0.0, group="augment", bounds="[0, inf)", help="mixup alpha (0: off)")
    cutmix: float = setting(0.0, group="augment", bounds="[0, inf)", help="cutmix alpha (0: off)")
    drop_path: float = setting(0.0, group="augment", bounds="[0, 1)", help="stochastic depth rate")
    clip_grad: float | None = setting(None, group="optim", bounds="(0, inf)", help="clip the gradient norm to this")
    ema_decay: float | None = setting(
        None,
        group="augment",
        bounds="(0, 1)",
        help="keep an EMA of the weights with this decay and report its accuracy (timm's --model-ema "
        "--model-ema-decay X)",
    )
    crop_padding: int | None = setting(None, flag=False)  # None: image size / 8
    flip: bool | None = setting(None, flag=False)  # None: on, except for digits and svhn
    randaugment: str | None = setting(
        None,
        group="augment",
        aliases=("--aa",),
        help="timm RandAugment string, e.g. rand-m9-mstd0.5-inc1",
    )
    reprob: float = setting(0.0, group="augment", bounds="[0, 1]", help="random erasing probability")
    amp: str = setting(
        "auto",
        group="model",
        choices=("auto", "bf16", "fp16", "none"),
        help="autocast dtype (auto: bf16 where the device has it, fp16 on older GPUs)",
    )
    compile: bool | None = setting(None, group="model", aliases=("--torchcompile",), help=COMPILE_HELP, **WATCHED)
    compile_mode: str | None = setting(None, group="model", help=COMPILE_MODE_HELP, **COMPILE_MODE, **WATCHED)
    device: str = setting("auto", help="auto, cpu, cuda, cuda:1, mps", **WATCHED)
    log: list[str] = setting(
        [],
        parse=names,
        metavar="NAME,NAME",
        help="loggers beside metrics.jsonl: tensorboard (OUT/tensorboard), wandb ($WANDB_PROJECT or structinit)",
        resume="recorded",
        identity=False,
    )
    workers: int = setting(
        4, group="data", aliases=("-j",), bounds="[0, inf)", help="DataLoader workers for large images", **WATCHED
    )
    eval_batch_size: int = setting(512, flag=False, bounds="[1, inf)", **WATCHED)
    eval_every: int = setting(
        1,
        bounds="[1, inf)",
        metavar="K",
        help="evaluation every K epochs and after the last",
        resume="recorded",
        **GRID_AXIS,
    )
    snapshot_epochs: list[int] = setting(
        [],
        parse=optional_int_list,
        metavar="E,E",
        help="keep the weights after these epochs in OUT/snapshots (0: at init)",
        resume="recorded",
        **GRID_AXIS,
    )
    seed: int = setting(0, grid=False, bounds=SEED_BOUNDS, help="seed of the model and the batches", **GRID_AXIS)
    out: str = setting(
        "runs/run",
        group="common",
        grid=False,
        aliases=("--output",),
        metavar="DIR",
        help="the run's directory (timm's --output is its parent)",
        **PLACE,
    )
    resume: bool = setting(
        False, group="common", grid=False, help="continue the run in --out from its last checkpoint", identity=False
    )
    stop_after: int | None = setting(
        None,
        grid=False,
        bounds="[1, inf)",
        metavar="K",
        help="end after epoch K, leaving a resumable checkpoint",
        **WATCHED,
    )
    quiet: bool = setting(False, help="no progress bar or lines", **WATCHED)
    preset: str | None = setting(
        None, group="common", metavar="NAME", help="recipe preset: small-data, imagenet, cpu-quick", **GRID_AXIS
    )

    def __post_init__(self) -> None:
        check_config(self)

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
    def total_epochs(self) -> int:
        """The epochs the run trains: --epochs, then --cooldown-epochs at --min-lr (timm's)."""
        return self.epochs + self.cooldown_epochs

    @property
    def peak_lr(self) -> float:
        """The lr the schedule rises to: --lr, or --lr-base scaled by the global batch as timm's train.py does."""
        if self.lr_base is None:
            return self.lr
        return scaled_lr(
            self.lr_base, self.lr_base_size, self.lr_base_scale, self.opt, self.batch_size, self.grad_accum_steps
        )

    @property
    def eval_split(self) -> str:
        """What the run evaluates on, and the prefix of its metrics: 'val' with a validation split
        (choose settings there; the test set is not touched), else 'test'."""
        return "val" if self.val_per_class else "test"


def check_config(config: TrainConfig) -> None:
    """Bad values fail here, in flag terms, before any data is loaded or any directory is made. (The
    checks that need torch, timm or the data's modules import them here: the settings' declarations,
    which the command's --help reads, need none of them.)"""
    from ..data.datasets import parse_spec
    from ..data.randaugment import RandAugmentSpec
    from ..models import check_model_kwargs
    from .data_settings import check_data_settings
    from .loggers import check_loggers

    for f in dataclasses.fields(config):
        check_value(f.name, f.type, SETTINGS[f.name].bounds, getattr(config, f.name))
    if not config.out:  # Path("") is the current directory
        raise ValueError("--out is empty: give the run's directory, e.g. --out runs/mine")
    spec = InitSpec.parse(config.init)
    if spec.method == "select" and config.teacher is None and spec.options.get("teacher") is None:
        raise ValueError(f"--init {config.init} selects from a larger model: give it with --teacher")
    # a resumed run started from one of the two: the one given now is a change its resume names and refuses
    if config.initial_checkpoint is not None and spec.method not in ("auto", "default") and not config.resume:
        raise ValueError(f"--initial-checkpoint and --init {config.init} both set the starting weights: give one")
    parse_spec(config.data)
    check_data_settings(config)
    check_loggers(config.log)
    check_model_kwargs(config.model_kwargs)
    from_data = sorted({"num_classes", "in_chans"} & set(config.model_kwargs))
    if from_data:
        raise ValueError(
            f"--model-kwargs {', '.join(from_data)}: the data sets it (its classes and channels); "
            "--num-classes checks the data's classes"
        )
    from .optimizer_checks import check_optimizer, check_optimizer_options  # timm: loaded once a run is checked

    check_optimizer(config.opt)
    epochs = config.snapshot_epochs
    if len(set(epochs)) < len(epochs):
        raise ValueError(f"--snapshot-epochs takes distinct integers, got {epochs}")
    if any(not 0 <= e <= config.total_epochs for e in epochs):
        raise ValueError(f"--snapshot-epochs must lie in 0..{config.total_epochs}, got {epochs}")
    lr = f"--lr {config.lr}" if config.lr_base is None else f"the lr {config.peak_lr:.3g} (--lr-base)"
    if config.min_lr > config.peak_lr:
        raise ValueError(f"--min-lr {config.min_lr} exceeds {lr}: the cosine schedule would climb")
    if config.warmup_lr > config.peak_lr:
        raise ValueError(f"--warmup-lr {config.warmup_lr} exceeds {lr}: the warm-up would fall to it")
    milestones = config.decay_milestones
    if any(m < 1 for m in milestones) or milestones != sorted(set(milestones)):
        raise ValueError(f"--decay-milestones takes increasing epochs >= 1, got {','.join(map(str, milestones))}")
    check_optimizer_options(config.opt, config.opt_betas, config.opt_eps, config.device)
    check_written_size(config)
    check_subsets(config)
    if config.randaugment:
        RandAugmentSpec.parse(config.randaugment).check_draws(config.batch_size)
    if config.compile_mode is not None and config.compile is False:
        raise ValueError(f"--compile-mode {config.compile_mode} compiles the model: leave out --no-compile")


def check_subsets(config: TrainConfig) -> None:
    """The parts of the data a run trains and is evaluated on: one way to take a subset, and an evaluation
    subset where the last evaluation is asked on it."""
    if config.per_class is not None and config.train_fraction is not None:
        raise ValueError("give --per-class or --train-fraction, not both")
    if config.eval_final == "subset" and config.eval_per_class is None:
        raise ValueError("--eval-final subset evaluates on --eval-per-class's subset: give --eval-per-class K too")


def check_written_size(config: TrainConfig) -> None:
    """The settings fit the run's config.yaml, which is read back bounded (settings_yaml.MAX_BYTES): a
    70,000-character label would train and then leave a record no command can read."""
    written = {f.name: len(json.dumps(getattr(config, f.name), default=str)) for f in dataclasses.fields(config)}
    if sum(written.values()) > MAX_BYTES // 4:
        longest = max(written, key=lambda name: written[name])
        raise ValueError(
            f"{flag(longest)}: {written[longest]:,} characters; a run's settings must fit its config.yaml "
            f"({MAX_BYTES // 4 >> 10} KiB of them): give a shorter value"
        )


SETTINGS: dict[str, Setting] = {f.name: f.metadata["setting"] for f in dataclasses.fields(TrainConfig)}
SETTING_DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
    for f in dataclasses.fields(TrainConfig)
}
