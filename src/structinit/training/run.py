"""The trainer: timm's recipe (AdamW, cosine schedule with warmup, label smoothing, mixup/cutmix,
drop-path, gradient clipping, EMA) around a model initialised by structinit, on CPU, CUDA or MPS,
in one process or many (torchrun, DDP).

A run lives in one directory: config.yaml (resolved), metrics.jsonl (one line per epoch), last.pt
(written atomically after every epoch) and summary.json at the end. Every epoch reseeds its random
streams from (seed, epoch), so a run stopped after epoch k and resumed ends with the same weights
as one that never stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import yaml
from timm.data import Mixup, create_transform, resolve_data_config
from timm.data.random_erasing import RandomErasing
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from timm.utils import ModelEmaV3
from torch import nn
from tqdm.auto import tqdm

from ..data.augment import BatchAugment, parse_randaugment
from ..data.datasets import ImageError, StreamData, TensorData, fingerprint, load_data, parse_spec
from ..errors import first_line
from ..files import atomic_save, atomic_write_text
from ..inits.api import initialize
from ..inits.labels import DEFAULT, KERNEL_SIZE, parse_init, with_options
from ..models import check_model_kwargs, create_model
from ..report import Report
from .checkpoint import load_checkpoint, rng_state, set_rng_state
from .loggers import Loggers, check_loggers
from .provenance import ENVIRONMENT, environment
from .rundir import (
    RESULTS,
    RESUMABLE,
    MetricsLog,
    RunError,
    RunLock,
    check_fresh,
    checkpoint_lines,
    clear_run,
    clear_temporaries,
    flag,
    identity,
    load_yaml,
    read_record,
    resume_changes,
    snapshot_path,
    summary_of_the_run,
)

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
# steps between checks that the losses are finite (each check waits for the device)
FINITE_CHECK_STEPS = 50
# (low, high, low excluded, high excluded) of every numeric setting; high None: unbounded
LIMITS: dict[str, tuple[float, float | None, bool, bool]] = {
    "per_class": (1, None, False, False),
    "train_fraction": (0, 1, True, False),
    "val_per_class": (1, None, False, False),
    "epochs": (1, None, False, False),
    "batch_size": (1, None, False, False),
    "lr": (0, None, True, False),
    "weight_decay": (0, None, False, False),
    "warmup_epochs": (0, None, False, False),
    "warmup_lr": (0, None, False, False),
    "min_lr": (0, None, False, False),
    "smoothing": (0, 1, False, True),
    "mixup": (0, None, False, False),
    "cutmix": (0, None, False, False),
    "drop_path": (0, 1, False, True),
    "clip_grad": (0, None, True, False),
    "ema_decay": (0, 1, True, True),
    "reprob": (0, 1, False, False),
    "workers": (0, None, False, False),
    "eval_batch_size": (1, None, False, False),
    "eval_every": (1, None, False, False),
    "stop_after": (1, None, False, False),
    "seed": (0, 2**32 - 1, False, False),  # numpy's seeds
    "subset_seed": (0, 2**32 - 1, False, False),
}


@dataclass
class TrainConfig:
    """Everything a run depends on; saved as config.yaml. Defaults suit `--data digits` on a CPU."""

    data: str = "digits"
    data_root: str = "data"
    download: bool = False
    cache_dir: str | None = None
    per_class: int | None = None
    train_fraction: float | None = None
    subset_seed: int = 0
    val_per_class: int | None = None  # evaluate on K training images per class held out, not on the test set
    model: str = "vit_digits"
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    init: str = "impulse"  # an init label: method or variant, options in brackets (kernel_size among them)
    epochs: int = 30
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 3
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    drop_path: float = 0.0
    clip_grad: float | None = None
    ema_decay: float | None = None
    crop_padding: int | None = None  # None: image size / 8
    flip: bool | None = None  # None: on, except for digits and svhn
    randaugment: str | None = None  # timm RandAugment string, e.g. rand-m9-mstd0.5-inc1
    reprob: float = 0.0
    amp: str = "auto"  # auto | bf16 | fp16 | none
    compile: bool = False
    device: str = "auto"
    log: list[str] = field(default_factory=list)  # more loggers beside metrics.jsonl: tensorboard, wandb
    workers: int = 4
    eval_batch_size: int = 512
    eval_every: int = 1  # evaluate every k epochs, and after the last
    snapshot_epochs: list[int] = field(default_factory=list)  # keep the weights after these epochs (0: at init)
    seed: int = 0
    out: str = "runs/run"
    resume: bool = False
    stop_after: int | None = None
    quiet: bool = False
    preset: str | None = None

    def __post_init__(self) -> None:
        """Bad values fail here, in flag terms, before any data is loaded or any directory is made."""
        for f in dataclasses.fields(self):
            check_type(f.name, f.type, getattr(self, f.name))
        parse_init(self.init)
        parse_spec(self.data)
        for name, (low, high, low_open, high_open) in LIMITS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{flag(name)} takes a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{flag(name)} takes a finite number, got {value}")
            if abs(value) > FLOAT32_MAX and name not in ("seed", "subset_seed"):
                raise ValueError(f"{flag(name)} {value} does not fit in float32, which the run computes in")
            below = value <= low if low_open else value < low
            above = high is not None and (value >= high if high_open else value > high)
            if below or above:
                bounds = f"{'>' if low_open else '>='} {low}" + (
                    f" and {'<' if high_open else '<='} {high}" if high is not None else ""
                )
                raise ValueError(f"{flag(name)} must be {bounds}, got {value}")
        if self.amp not in ("auto", "bf16", "fp16", "none"):
            raise ValueError(f"--amp must be auto, bf16, fp16 or none, got {self.amp!r}")
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
    def eval_split(self) -> str:
        """What the run evaluates on, and the prefix of its metrics: 'val' with a validation split
        (choose settings there; the test set is not touched), else 'test'."""
        return "val" if self.val_per_class else "test"

    @classmethod
    def from_preset(cls, preset: str | None, **overrides: Any) -> TrainConfig:
        """Defaults, then the preset's YAML, then the explicit overrides."""
        values: dict[str, Any] = {}
        if preset:
            values.update(load_preset(preset))
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = sorted(set(values) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"unknown training setting(s): {', '.join(unknown)}")
        return cls(preset=preset, **values)


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


def check_type(name: str, declared: str, value: Any) -> None:
    """A setting's value is of its declared type (None where the type allows it): a YAML file can hold
    'false' for a flag or 1.5 for a count, which would otherwise act as something else."""
    base, _, optional = declared.partition(" | ")
    if value is None and optional == "None":
        return
    kinds, what = SETTING_TYPES[base]
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise ValueError(f"{flag(name)} takes {what}, got {value!r}")
    if base == "list[str]" and not all(isinstance(item, str) for item in value):
        raise ValueError(f"{flag(name)} takes {what}, got {value!r}")


def config_values(values: Any, source: str) -> dict[str, Any]:
    """The settings in a config.yaml (or a checkpoint's copy), ready for TrainConfig: the environment
    record is left out, older versions' `init_kwargs` and `kernel_size` are folded into the init label,
    and an unknown key fails naming the file."""
    if not isinstance(values, dict):
        raise ValueError(f"{source}: expected a mapping of settings (a run's config.yaml), got {type(values).__name__}")
    values = {k: v for k, v in values.items() if k != ENVIRONMENT}
    legacy = dict(values.pop("init_kwargs", None) or {})
    kernel_size = values.pop("kernel_size", None)
    if legacy or kernel_size is not None:
        label = values.get("init", TrainConfig.init)
        if kernel_size is not None and KERNEL_SIZE not in {**parse_init(label)[1], **legacy}:
            legacy[KERNEL_SIZE] = kernel_size
        values["init"] = with_options(label, legacy)
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; the settings are {', '.join(sorted(known))}"
        )
    return values


def read_config(path: str | Path) -> TrainConfig:
    """The TrainConfig of a run's config.yaml; one line naming the file if it is damaged."""
    path = Path(path)
    fix = "restore it, or delete it: --resume writes it again from last.pt"
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise RunError(f"{path} is damaged (not text): {fix}") from None
    if not text.endswith("\n"):  # a run writes it whole, ending with a newline
        raise RunError(f"{path} is truncated: {fix}")
    try:
        values = load_yaml(text)
    except yaml.YAMLError as error:
        raise RunError(f"{path} is damaged (not valid YAML: {first_line(error)}): {fix}") from None
    try:
        return TrainConfig(**config_values(values, str(path)))
    except (ValueError, TypeError) as error:
        raise RunError(str(error) if str(error).startswith(str(path)) else f"{path}: {error}") from None


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("structinit.presets").iterdir())


def load_preset(name: str) -> dict[str, Any]:
    if name not in presets():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(presets())}")
    return load_yaml(resources.files("structinit.presets").joinpath(f"{name}.yaml").read_text())


class TrainingDiverged(RunError):
    """The loss became NaN or infinite."""


# --- distributed -----------------------------------------------------------------------------


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: torch.device) -> Dist:
    """Join the process group torchrun describes in the environment (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Dist()
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(name: str, local_rank: int) -> torch.device:
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError:
            raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps") from None
        if device.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {name}: PyTorch sees no CUDA GPU here; use --device cpu (or auto)")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: there are {torch.cuda.device_count()} CUDA GPUs")
        if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"--device {name}: MPS is not available here; use --device cpu (or auto)")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 on CPUs with AVX-512/AMX and on CUDA with bf16, fp16 on other GPUs."""
    if amp == "none":
        return None
    if amp == "bf16":
        return torch.bfloat16
    if amp == "fp16":
        return torch.float16
    if amp != "auto":
        raise ValueError(f"amp must be auto, bf16, fp16 or none, got {amp!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        return torch.bfloat16 if capability.startswith(("AVX512", "AMX")) else None
    return None


# --- the run ---------------------------------------------------------------------------------


def epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + 17) % (2**31)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(config: TrainConfig) -> dict[str, Any]:
    """Run (or resume) one training run; returns the summary written to summary.json."""
    device = resolve_device(config.device, int(os.environ.get("LOCAL_RANK", "0")))
    world = setup_distributed(device)
    try:
        if Path(config.out).exists() and not Path(config.out).is_dir():
            raise ValueError(f"--out {config.out} is a file: give a directory for the run")
        if config.resume and not any((Path(config.out) / f).exists() for f in ("config.yaml", "last.pt")):
            raise FileNotFoundError(f"--resume: there is no run in {config.out}")
        out = Path(config.out)
        made = [p for p in (out, *out.parents) if not p.exists()]  # the folders this run makes, deepest first
        try:
            with RunLock(out) if world.main else contextlib.nullcontext():
                return Run(config, device, world).run()
        except Exception as error:
            if made and world.main and not config.resume and not isinstance(error, TrainingDiverged):
                remove_unstarted(made)
            raise
    finally:
        if world.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def remove_unstarted(made: list[Path]) -> None:
    """Remove the folders (`made`, deepest first) a fresh run made if it failed before its first
    checkpoint (an unbuildable model, bad data): they hold only that run's config and init report."""
    out = made[0]
    if (out / "last.pt").exists():
        return
    with contextlib.suppress(RunError):  # files it cannot account for stay, and the folder with them
        clear_run(out)
    with contextlib.suppress(OSError):
        for folder in made:
            folder.rmdir()  # not if anything else is there


def resume_config(out: str | Path, **changes: Any) -> TrainConfig:
    """The config of the run in `out` (its checkpoint's, which is what was trained; config.yaml's before
    the first checkpoint), with `changes` (only RESUMABLE settings may differ), to resume it."""
    out = Path(out)
    if (out / "last.pt").exists():
        values = config_values(load_checkpoint(out / "last.pt", mmap=True)["config"], str(out / "last.pt"))
        saved = TrainConfig(**values)
    elif (out / "config.yaml").exists():
        saved = read_config(out / "config.yaml")
    else:
        raise FileNotFoundError(f"--resume: there is no run in {out}")
    return dataclasses.replace(saved, **{"stop_after": None, **changes}, out=str(out), resume=True)


class Run:
    """One training run, step by step: open its directory (fresh, or resumed with the changes
    allowed), build what it trains, restore a checkpoint, then for every epoch train, evaluate, check
    that the weights are good and checkpoint them before the epoch is logged; finish with summary.json."""

    def __init__(self, config: TrainConfig, device: torch.device, world: Dist) -> None:
        self.config, self.device, self.world = config, device, world
        self.out = Path(config.out)
        self.log = MetricsLog(self.out)
        self.checkpointed: int | None = None  # the epoch of the last good checkpoint on disk
        # what a resume changed (log events, and whether config.yaml changes): written with its first
        # checkpoint, so that the record never says what was not trained
        self.pending: list[dict[str, Any]] = []
        self.rewrite_config = False

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "last.pt"

    @property
    def last_epoch(self) -> int:
        """The epoch this process trains to."""
        config = self.config
        return config.epochs if config.stop_after is None else min(config.epochs, config.stop_after)

    def run(self) -> dict[str, Any]:
        checkpoint = self.open()
        summary = self.out / "summary.json"
        if checkpoint is not None and summary.exists() and checkpoint["epoch"] >= self.config.epochs:
            return read_record(summary, "delete it: --resume writes it again")  # finished, nothing asked: no-op
        self.build()
        start = self.restore(checkpoint)
        config, last = self.config, self.last_epoch
        show = self.world.main and not config.quiet
        bar = tqdm(range(start, last), desc="epochs", disable=not show or None, initial=start, total=last)
        metrics: dict[str, Any] = {}
        names = config.log if self.world.main else []
        self.loggers = Loggers(names, self.out, dataclasses.asdict(config), start)
        try:
            for epoch in bar:
                metrics = self.train_epoch(epoch)
                if metrics.get(f"{config.eval_split}_top1") is not None:
                    top1 = metrics[f"{config.eval_split}_top1"]
                    bar.set_postfix(loss=f"{metrics['train_loss']:.3f}", top1=f"{top1:.1f}")
        finally:
            self.loggers.close()
        return self.finish(last, metrics)

    # --- the directory ----------------------------------------------------------------------------

    def open(self) -> dict[str, Any] | None:
        """A fresh run claims its directory and writes its config; a resumed one loads its checkpoint,
        repairs a record a crash left behind it, and keeps the changes it may make (refusing the
        others) to write with its first new checkpoint."""
        config = self.config
        env = environment(self.device, resolve_amp(config.amp, self.device), self.world.world)
        folders = [
            name
            for name, used in (("snapshots", config.snapshot_epochs), ("tensorboard", "tensorboard" in config.log))
            if used and (self.out / name).exists() and not (self.out / name).is_dir()
        ]
        if folders:
            raise RunError(f"{self.out / folders[0]} is a file, where the run keeps its {folders[0]}: move it away")
        if not config.resume:
            if self.world.main:
                check_fresh(self.out)
                self.out.mkdir(parents=True, exist_ok=True)
                _write_config(self.out, dataclasses.asdict(config), env)
            return None
        checkpoint = self.load_last()
        done = checkpoint["epoch"]
        saved = TrainConfig(**{**config_values(checkpoint["config"], "last.pt"), "resume": True})
        changes = self.allowed_changes(saved, done)
        self.checkpointed = done
        if self.world.main:
            self.refuse_files_ahead(saved, done, checkpoint["model"])
            clear_temporaries(self.out)
            self.log.reconcile(done, checkpoint_lines(checkpoint))
            before = self.repair_record(saved, done)
            if changes:
                self.pending.append({"event": "resume", "after_epoch": done, "changed": changes})
            if env != before:  # resumed elsewhere: config.yaml says where it goes on, the log where it was
                self.pending.append({"event": "environment", "after_epoch": done, ENVIRONMENT: env})
            self.rewrite_config = True  # with the first checkpoint, where the file says otherwise
            self.env = env
        return checkpoint

    def load_last(self) -> dict[str, Any]:
        if not self.checkpoint_path.exists():
            held = [name for name in RESULTS if (self.out / name).exists()]
            if held:
                raise RunError(
                    f"{self.out} has no last.pt to resume from, only {', '.join(held)}: its results stay as they "
                    "are; train again into another --out"
                )
            raise RunError(
                f"{self.out} has no checkpoint yet (it stopped before its first epoch ended): "
                "run it again without --resume"
            )
        return load_checkpoint(self.checkpoint_path)

    def allowed_changes(self, saved: TrainConfig, done: int) -> dict[str, list[Any]]:
        """What this resume changes of the run (resume_changes), refusing changes that would train
        nothing, a --stop-after it is past and snapshot epochs it is past."""
        config = self.config
        changes = resume_changes(dataclasses.asdict(saved), dataclasses.asdict(config), done)
        if changes and done >= self.last_epoch:
            if "epochs" in changes:
                raise RunError(
                    f"--epochs {config.epochs}: {self.out} has done {done} epochs of a {saved.epochs}-epoch schedule, "
                    "and a run cannot be declared finished on a schedule it did not follow: use its last.pt as it "
                    "is, or train on"
                )
            listed = ", ".join(f"{flag(k)} {v[1]!r}" for k, v in changes.items())
            raise RunError(
                f"{self.out} has done {done} of its epochs, so {listed} would change nothing and nothing was "
                "written: add --epochs N to train longer"
            )
        if config.stop_after is not None and config.stop_after <= done < config.epochs:
            raise RunError(
                f"--stop-after {config.stop_after}: {self.out} has already done {done} epochs, so it would train "
                f"nothing: give a later epoch, or leave it out to train to epoch {config.epochs}"
            )
        past = [e for e in config.snapshot_epochs if e <= done and not snapshot_path(self.out, e).exists()]
        if past and "snapshot_epochs" in changes:
            raise RunError(
                f"--snapshot-epochs {','.join(map(str, past))}: the run is past them (it has done {done} epochs) "
                "and did not keep them: list only later epochs"
            )
        return changes

    def refuse_files_ahead(self, saved: TrainConfig, done: int, model: dict[str, torch.Tensor]) -> None:
        """Refuse files the run would write over that it has not written: a snapshot of an epoch it has not
        reached that is not weights of its model (its own, kept before a crash or a prev.pt copied over
        last.pt, is trained again, to the same weights), a prev.pt that is not its checkpoint before last.pt."""
        ahead = [snapshot_path(self.out, e) for e in self.config.snapshot_epochs if e > done]
        ahead = [path for path in ahead if path.exists() and not _snapshot_of(path, model)]
        prev = self.out / "prev.pt"
        if prev.exists():
            try:
                before = load_checkpoint(prev, mmap=True)
                ours = before["epoch"] <= done and _same_run(before["config"], dataclasses.asdict(saved))
            except (RunError, TypeError, KeyError):
                ours = False
            if not ours:
                ahead.append(prev)
        if ahead:
            raise RunError(
                f"{ahead[0]} is not this run's (it is at epoch {done}), and the run would write over it: move it "
                "away (it stays as it is), then --resume"
            )

    def repair_record(self, saved: TrainConfig, done: int) -> dict[str, Any] | None:
        """Make config.yaml and summary.json agree with the checkpoint (a crash between a checkpoint and
        its record, or a record an older structinit wrote ahead of it); returns the recorded environment."""
        path = self.out / "config.yaml"
        try:
            recorded = read_config(path) if path.exists() else None
            before = (load_yaml(path.read_text()) or {}).get(ENVIRONMENT) if recorded else None
        except RunError:
            recorded = before = None
        values = {**dataclasses.asdict(saved), "resume": False}
        if recorded is None or identity(dataclasses.asdict(recorded)) != identity(values):
            _write_config(self.out, values, before or {})
        summary = self.out / "summary.json"
        if summary.exists():
            record = read_record(summary, "move it away: --resume writes the run's own when it finishes")
            if not summary_of_the_run(self.out, record):
                raise RunError(
                    f"{summary} is not this run's (no epoch of its metrics.jsonl ends with it): move it away "
                    "(it stays as it is); --resume writes the run's own when it finishes"
                )
            if record["epochs_done"] != done:
                summary.unlink()  # this run's own, behind its checkpoint: written again when it finishes
        return before

    # --- building ---------------------------------------------------------------------------------

    def build(self) -> None:
        """Data, model (initialised), optimiser, EMA, mixing, loss and the batch source."""
        config, device, world = self.config, self.device, self.world
        self.data = load_data(
            config.data,
            root=config.data_root,
            download=config.download,
            cache_dir=config.cache_dir,
            per_class=config.per_class,
            train_fraction=config.train_fraction,
            subset_seed=config.subset_seed,
            val_per_class=config.val_per_class,
        )
        self.in_memory = isinstance(self.data, TensorData)
        self.data_fingerprint = fingerprint(self.data)
        self.model, self.init_report = build_model(config, self.data)
        self.model.to(device)
        self.amp_dtype = resolve_amp(config.amp, device)
        prefer_math_attention(self.model, device, self.amp_dtype)
        train_model: nn.Module = self.model
        if world.world > 1:
            ids = [device.index] if device.type == "cuda" else None
            train_model = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        self.forward = torch.compile(train_model) if config.compile else train_model
        self.batch = config.batch_size // world.world
        if self.batch * world.world != config.batch_size or self.batch < 1:
            raise ValueError(f"--batch-size {config.batch_size} must be a multiple of the {world.world} processes")
        self.steps_per_epoch = len(self.data.train_labels) // config.batch_size
        if self.steps_per_epoch < 1:
            raise ValueError(
                f"--batch-size {config.batch_size} exceeds the {len(self.data.train_labels)} training images"
            )
        self.optimizer = create_optimizer(self.model, config, device)
        self.ema = ModelEmaV3(self.model, decay=config.ema_decay) if config.ema_decay else None
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None
        mixing = config.mixup > 0 or config.cutmix > 0
        self.mixup = (
            Mixup(config.mixup, config.cutmix, label_smoothing=config.smoothing, num_classes=self.data.num_classes)
            if mixing
            else None
        )
        self.criterion = SoftTargetCrossEntropy() if mixing else LabelSmoothingCrossEntropy(config.smoothing)
        self.build_batches()

    def build_batches(self) -> None:
        """Augmentation on whole batches for small images held in memory; DataLoaders otherwise."""
        config, data = self.config, self.data
        channels = data.image_shape[0] if self.in_memory else data.channels
        self.mean, self.std = _normalisation(self.model, channels)
        if not self.in_memory:
            self.loaders = _stream_loaders(data, self.model, config, self.batch, self.world)
            return
        padding = config.crop_padding if config.crop_padding is not None else data.image_shape[1] // 8
        flip = config.flip if config.flip is not None else data.name not in ("digits", "svhn")
        self.augment = BatchAugment(self.mean, self.std, padding, flip, self.mixup, config.randaugment)
        self.train_images = data.train_images.to(self.device)
        self.train_labels = data.train_labels.to(self.device)
        self.eraser = RandomErasing(config.reprob, mode="pixel", device=str(self.device)) if config.reprob > 0 else None

    def restore(self, checkpoint: dict[str, Any] | None) -> int:
        """Load the checkpoint's state (or save the init's snapshot) and build the lr schedule, which
        is a function of the step: a resumed run with more epochs or a new lr follows the new one.
        Returns the epoch to start from."""
        start = 0
        if checkpoint is not None:
            if checkpoint.get("data", self.data_fingerprint) != self.data_fingerprint:
                raise RunError(
                    f"the data of {self.out} ({self.config.data}) changed since its checkpoint (images added, "
                    "removed or replaced): resume it on the data it trained on, or start a new run"
                )
            try:
                self.model.load_state_dict(checkpoint["model"])
                self.optimizer.load_state_dict(checkpoint["optimizer"])
                if self.ema is not None:
                    self.ema.load_state_dict(checkpoint["ema"])
                if self.scaler is not None and checkpoint.get("scaler"):
                    self.scaler.load_state_dict(checkpoint["scaler"])
                set_rng_state(checkpoint["rng"])
            except (KeyError, RuntimeError, ValueError, TypeError) as error:
                raise RunError(
                    f"{self.checkpoint_path} does not fit its run ({first_line(error)}): it was changed, or is "
                    "another run's; prev.pt, if present, holds the epoch before"
                ) from None
            start = checkpoint["epoch"]
        elif self.world.main:
            atomic_write_text(self.out / "init_report.json", json.dumps(self.init_report.to_dict(), indent=2))
            if 0 in self.config.snapshot_epochs:
                save_snapshot(self.model, self.out, 0)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.config.lr
            group.update(adamw_kernel(self.device))  # this device's, not the one the checkpoint was written on
        self.scheduler = create_schedule(self.optimizer, self.config, self.steps_per_epoch)
        if start:
            self.scheduler.step_update(start * self.steps_per_epoch)
        return start

    # --- an epoch ---------------------------------------------------------------------------------

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Train one epoch, evaluate when due, and checkpoint it if its weights are good."""
        config, world = self.config, self.world
        seed = epoch_seed(config.seed, epoch)
        seed_everything(seed + world.rank)
        np.random.seed(seed)  # mixup's lambda: the same on every process
        generator = torch.Generator().manual_seed(seed)
        self.model.train()
        started = time.perf_counter()
        total_loss, seen = torch.zeros((), device=self.device), 0
        losses, checked, done = torch.empty(self.steps_per_epoch, device=self.device), 0, 0
        for step, (images, labels) in enumerate(self.batches(epoch, generator)):
            loss = self.train_step(images, labels, epoch, step).detach()
            losses[step] = loss
            total_loss += loss * len(images)
            seen, done = seen + len(images), step + 1
            if done % FINITE_CHECK_STEPS == 0:
                self.check_losses(losses[checked:done], epoch, checked)
                checked = done
        self.check_losses(losses[checked:done], epoch, checked)
        seconds = time.perf_counter() - started
        metrics: dict[str, Any] = {
            "epoch": epoch + 1,
            "step": (epoch + 1) * self.steps_per_epoch,
            "train_loss": _all_reduce_sum(total_loss, world).item() / (seen * world.world),
        }
        if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs:
            metrics.update(self.evaluate(self.model))
            if self.ema is not None:
                metrics.update({f"ema_{k}": v for k, v in self.evaluate(self.ema.module).items()})
        metrics.update(
            lr=self.optimizer.param_groups[0]["lr"],
            img_per_s=self.steps_per_epoch * config.batch_size / seconds,
            epoch_seconds=seconds,
            time=time.time(),
        )
        self.check_good(metrics)
        self.save(metrics)
        return metrics

    def batches(self, epoch: int, generator: torch.Generator):
        """The process's (images, labels) of every step of `epoch`, augmented."""
        config, world, steps = self.config, self.world, self.steps_per_epoch
        show = world.main and not config.quiet
        if self.in_memory:
            order = torch.randperm(len(self.train_labels), generator=generator)[: steps * config.batch_size]
            source = order.view(steps, config.batch_size)
        else:
            if world.world > 1:
                self.loaders[0].sampler.set_epoch(epoch)
            source = _named_images(self.loaders[0])
        for item in tqdm(source, desc=f"epoch {epoch + 1}", leave=False, disable=not show or None, total=steps):
            if not self.in_memory:
                images, labels = (t.to(self.device, non_blocking=True) for t in item)
                yield self.mixup(images, labels) if self.mixup is not None else (images, labels)
                continue
            index = item.to(self.device)
            images, labels = self.augment(self.train_images[index], self.train_labels[index], generator)
            mine = slice(world.rank * self.batch, (world.rank + 1) * self.batch)
            images, labels = images[mine], labels[mine]
            yield (self.eraser(images) if self.eraser is not None else images), labels

    def train_step(self, images: torch.Tensor, labels: torch.Tensor, epoch: int, step: int) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
            loss = self.criterion(self.forward(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.config.clip_grad:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_grad)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step_update(epoch * self.steps_per_epoch + step + 1)
        if self.ema is not None:
            self.ema.update(self.model)
        return loss

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Top-1, top-5 and loss of `model` on the evaluation split (validation or test)."""
        config, world, data = self.config, self.world, self.data
        split = config.eval_split

        def batches():
            if not self.in_memory:
                yield from ((x.to(self.device), y.to(self.device)) for x, y in _named_images(self.loaders[1]))
                return
            images, labels = (
                (data.val_images, data.val_labels) if split == "val" else (data.test_images, data.test_labels)
            )
            normalise = BatchAugment(self.mean, self.std).normalise
            for idx in torch.arange(world.rank, len(labels), world.world).split(config.eval_batch_size):
                yield normalise(images[idx].to(self.device)), labels[idx].to(self.device)

        return _evaluate(model, batches(), self.device, world, self.amp_dtype, split)

    # --- checkpoints ------------------------------------------------------------------------------

    def check_losses(self, losses: torch.Tensor, epoch: int, first: int) -> None:
        """Stop at the first loss (of steps first, first + 1, ...) that is not finite. Checked every
        FINITE_CHECK_STEPS steps rather than at each: reading a value off a GPU makes the host wait for
        it, and a small model's steps are short enough that the wait would stall the launch queue."""
        bad = (~torch.isfinite(losses)).nonzero()
        if len(bad):
            index = int(bad[0])
            step = first + index + 1
            raise TrainingDiverged(
                self.diverged(f"the loss became {losses[index].item()} at epoch {epoch + 1}, step {step}")
            )

    def check_good(self, metrics: dict[str, Any]) -> None:
        """Weights that are not finite, or an evaluation loss that is not, never become a checkpoint."""
        loss = metrics.get(f"{self.config.eval_split}_loss")
        if loss is not None and not math.isfinite(loss):
            raise TrainingDiverged(
                self.diverged(f"the {self.config.eval_split} loss became {loss} at epoch {metrics['epoch']}")
            )
        if not torch.stack([torch.isfinite(p).all() for p in self.model.parameters()]).all():  # one sync
            raise TrainingDiverged(self.diverged(f"the weights stopped being finite at epoch {metrics['epoch']}"))

    def diverged(self, what: str) -> str:
        if self.checkpointed is None:
            return f"{what}; no checkpoint was kept (it diverged in its first epoch): start again with a lower --lr"
        return (
            f"{what}; the last good checkpoint is {self.checkpoint_path} (epoch {self.checkpointed}): "
            "continue from it with --resume --lr <lower>"
        )

    def save(self, metrics: dict[str, Any]) -> None:
        """Checkpoint the epoch (durably, keeping the previous one, with its log lines), then write the
        record: what a resume changed (with its first checkpoint), the epoch's line. A snapshot comes first."""
        epoch = metrics["epoch"]
        if self.world.main:
            lines = [*self.pending, metrics]
            state = {
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "ema": self.ema.state_dict() if self.ema is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "epoch": epoch,
                "rng": rng_state(),
                "config": dataclasses.asdict(self.config),
                "data": self.data_fingerprint,
                "metrics": metrics,
                "log": lines,
            }
            if epoch in self.config.snapshot_epochs:  # before the checkpoint: an epoch checkpointed has its snapshot
                save_snapshot(self.model, self.out, epoch)
            atomic_save(state, self.checkpoint_path, keep_previous=True)
            if self.rewrite_config:
                (self.out / "summary.json").unlink(missing_ok=True)  # the run goes on past it
                _write_config(self.out, {**dataclasses.asdict(self.config), "resume": False}, self.env, if_changed=True)
            self.log.append(*lines)
            self.pending, self.rewrite_config = [], False
            self.loggers.log(metrics)
        self.checkpointed = epoch

    def finish(self, last: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """summary.json once the run has done all its epochs (a resume that had none left to do
        takes the last logged epoch's metrics)."""
        if not metrics and self.world.main:
            metrics = (self.log.epochs() or [{}])[-1]
        summary = {"finished": last == self.config.epochs, "epochs_done": last, **metrics}
        report = self.init_report.to_dict()
        summary["init"] = {k: report[k] for k in ("method", "mean_fidelity", "min_fidelity", "seconds")}
        if self.world.main and summary["finished"]:
            atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2), then=" and --resume")
        return summary


# --- pieces ----------------------------------------------------------------------------------


def build_model(config: TrainConfig, data: TensorData | StreamData):
    """The run's model, created for the data's classes, channels and image size and initialised;
    returns (model, init report). Seeded, so that it is the same model every time."""
    in_memory = isinstance(data, TensorData)
    seed_everything(config.seed)  # the weights timm draws before the init (MLPs, head) depend on it
    model = create_model(
        config.model,
        num_classes=data.num_classes,
        in_chans=data.image_shape[0] if in_memory else data.channels,
        data_size=data.image_shape[1] if in_memory else None,
        drop_path=config.drop_path,
        **config.model_kwargs,
    )
    method, options = parse_init(config.init)
    if method == DEFAULT:
        return model, Report(DEFAULT, type(model).__name__, [], seed=config.seed)
    kernel_size = options.pop(KERNEL_SIZE, None)
    report = initialize(model, method, kernel_size=kernel_size, seed=config.seed, **options)
    return model, report


def adamw_kernel(device: torch.device) -> dict[str, bool | None]:
    """AdamW's fused kernel on CUDA (one launch for every parameter instead of several per tensor: the
    optimiser step of a small model is launch-bound); torch's default (foreach) elsewhere."""
    fused = device.type == "cuda"
    return {"fused": True if fused else None, "foreach": False if fused else None}


def create_optimizer(model: nn.Module, config: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """timm's AdamW (no weight decay on norms, biases and position embeddings) at the config's lr and decay."""
    return create_optimizer_v2(model, "adamw", lr=config.lr, weight_decay=config.weight_decay, **adamw_kernel(device))


def create_schedule(optimizer: torch.optim.Optimizer, config: TrainConfig, steps_per_epoch: int) -> CosineLRScheduler:
    """timm's cosine schedule with linear warm-up, stepped once per optimiser step."""
    return CosineLRScheduler(
        optimizer,
        t_initial=config.epochs * steps_per_epoch,
        lr_min=config.min_lr,
        warmup_t=round(config.warmup_epochs * steps_per_epoch),
        warmup_lr_init=config.warmup_lr,
        t_in_epochs=False,
    )


def prefer_math_attention(model: nn.Module, device: torch.device, amp_dtype: torch.dtype | None) -> None:
    """On CPU under bf16 autocast, timm's attention runs faster unfused: torch's CPU
    scaled_dot_product_attention has no fast bf16 path for short sequences of small heads
    (2.4x faster with 12 heads of dimension 16: benchmarks/bench_train.py). Same maths."""
    if device.type == "cpu" and amp_dtype == torch.bfloat16:
        for module in model.modules():
            if isinstance(getattr(module, "fused_attn", None), bool):
                module.fused_attn = False


def _snapshot_of(path: Path, model: dict[str, torch.Tensor]) -> bool:
    """Whether `path` holds weights of the model `model` is the state of (the same names and shapes)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return False
    return (
        isinstance(state, dict)
        and state.keys() == model.keys()
        and all(isinstance(v, torch.Tensor) and v.shape == model[k].shape for k, v in state.items())
    )


def _same_run(one: dict[str, Any], other: dict[str, Any]) -> bool:
    """Whether two configs are of one run: the same identity, but for what a resume may change."""
    fixed = [json.loads(json.dumps({k: v for k, v in identity(c).items() if k not in RESUMABLE})) for c in (one, other)]
    return fixed[0] == fixed[1]


def _write_config(out: Path, values: dict[str, Any], env: dict[str, Any], if_changed: bool = False) -> None:
    """The settings as asked (read back with read_config), then where they ran (`if_changed`: only if
    the file says otherwise)."""
    text = yaml.safe_dump({**values, ENVIRONMENT: env}, sort_keys=False)
    path = out / "config.yaml"
    if not (if_changed and path.exists() and path.read_text() == text):
        atomic_write_text(path, text)


def save_snapshot(model: nn.Module, out: Path, epoch: int) -> None:
    """The model's weights after `epoch` (0: at init) in OUT/snapshots, for measuring how what the
    init put in changes along training (benchmarks/bench_mechanism.py --part training)."""
    path = snapshot_path(out, epoch)
    path.parent.mkdir(exist_ok=True)
    atomic_save(model.state_dict(), path)


def normalise_for(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """uint8 images (B, C, H, W) as `model` sees them at evaluation."""
    mean, std = _normalisation(model, images.shape[1])
    return BatchAugment(mean, std).normalise(images)


def normalised_test_images(model: nn.Module, data: TensorData | StreamData, count: int) -> torch.Tensor:
    """The first `count` test images, as the model sees them at evaluation."""
    if isinstance(data, TensorData):
        return normalise_for(model, data.test_images[:count])
    transform = create_transform(**_data_config(model), is_training=False)
    return torch.stack([transform(data.test[i][0]) for i in range(min(count, len(data.test)))])


def _all_reduce_sum(value: torch.Tensor, world: Dist) -> torch.Tensor:
    if world.world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


def _normalisation(model: nn.Module, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    config = getattr(model, "pretrained_cfg", {}) or {}
    mean, std = config.get("mean", (0.5,) * 3), config.get("std", (0.5,) * 3)
    if channels != len(mean):
        mean, std = (0.5,) * channels, (0.5,) * channels
    return tuple(mean), tuple(std)


@torch.no_grad()
def _evaluate(
    model: nn.Module, batches, device: torch.device, world: Dist, amp_dtype, split: str = "test"
) -> dict[str, float]:
    """Top-1/top-5 (percent) and loss over the evaluation batches of every process, named by `split`."""
    model.eval()
    totals = torch.zeros(4, device=device, dtype=torch.float64)  # top-1, top-5, loss sum, count
    for images, labels in batches:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            logits = model(images).float()
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        totals[0] += (top[:, 0] == labels).sum()
        totals[1] += (top == labels[:, None]).any(1).sum()
        totals[2] += nn.functional.cross_entropy(logits, labels, reduction="sum")
        totals[3] += len(labels)
    c1, c5, loss, n = _all_reduce_sum(totals, world).tolist()
    return {f"{split}_top1": 100 * c1 / n, f"{split}_top5": 100 * c5 / n, f"{split}_loss": loss / n}


def _stream_loaders(data: StreamData, model: nn.Module, config: TrainConfig, batch: int, world: Dist):
    """DataLoaders with timm's transforms (and a DistributedSampler under DDP) for large images."""
    data_config = _data_config(model)
    train_tf = create_transform(
        **data_config,
        is_training=True,
        auto_augment=config.randaugment,
        re_prob=config.reprob,
        hflip=0.5 if config.flip is not False else 0.0,
    )
    test_tf = create_transform(**data_config, is_training=False)
    train_set = _Transformed(data.train, train_tf)
    test_set = _Transformed(data.val if config.eval_split == "val" else data.test, test_tf)
    sampler = (
        torch.utils.data.DistributedSampler(
            train_set, world.world, world.rank, shuffle=True, seed=config.seed, drop_last=True
        )
        if world.world > 1
        else torch.utils.data.RandomSampler(train_set)
    )
    test_sampler = (
        torch.utils.data.DistributedSampler(test_set, world.world, world.rank, shuffle=False)
        if world.world > 1
        else None
    )
    common = dict(
        num_workers=config.workers, pin_memory=torch.cuda.is_available(), persistent_workers=config.workers > 0
    )
    train_loader = torch.utils.data.DataLoader(train_set, batch, sampler=sampler, drop_last=True, **common)
    test_loader = torch.utils.data.DataLoader(test_set, config.eval_batch_size, sampler=test_sampler, **common)
    return train_loader, test_loader


def _data_config(model: nn.Module) -> dict[str, Any]:
    """timm's data config of the model, with the input size the model was built for."""
    config = resolve_data_config({}, model=model)
    size = getattr(getattr(model, "patch_embed", None), "img_size", None)
    if size is not None:
        config["input_size"] = (config["input_size"][0], *size)
    return config


def _named_images(loader: torch.utils.data.DataLoader):
    """The loader's batches; an image a worker cannot decode ends the run in one line naming it."""
    try:
        yield from loader
    except ImageError as error:
        raise ImageError.from_worker(error) from None


class _Transformed(torch.utils.data.Dataset):
    def __init__(self, dataset, transform) -> None:
        self.dataset, self.transform = dataset, transform

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        image, label = self.dataset[index]
        return self.transform(image), label


def print_summary(summary: dict[str, Any], out: str | Path) -> None:
    split = next((s for s in ("test", "val") if f"{s}_top1" in summary), None)
    if split is None:
        return
    status = "finished" if summary["finished"] else f"stopped after epoch {summary['epochs_done']}"
    print(
        f"{status}: {split} top-1 {summary[f'{split}_top1']:.2f}%, top-5 {summary[f'{split}_top5']:.2f}%, "
        f"train loss {summary['train_loss']:.4f} -> {out}"
    )


__all__ = ["Run", "TrainConfig", "TrainingDiverged", "presets", "read_config", "resume_config", "train"]
