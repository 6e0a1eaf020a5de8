"""The trainer: timm's recipe (AdamW, cosine schedule with warmup, label smoothing, mixup/cutmix,
drop-path, gradient clipping, EMA) around a model initialised by structinit, on CPU, CUDA or MPS,
in one process or many (torchrun, DDP).

A run lives in one directory: config.yaml (resolved), metrics.jsonl (one line per epoch), last.pt
(written atomically after every epoch) and summary.json at the end. Every epoch reseeds its random
streams from (seed, epoch), so a run stopped after epoch k and resumed ends with the same weights
as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import json
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

from .augment import BatchAugment
from .data import StreamData, TensorData, load_data
from .methods import initialize
from .models import create_model
from .options import DEFAULT, parse_init
from .report import Report


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
    init: str = "impulse"
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    kernel_size: int | None = None  # None: 3 for ViTs, a ConvMixer's own filter size
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
        parse_init(self.init)  # a typo fails here, not after the data has loaded
        if self.eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {self.eval_every}")
        if any(not 0 <= e <= self.epochs for e in self.snapshot_epochs):
            raise ValueError(f"snapshot epochs must lie in 0..{self.epochs}, got {self.snapshot_epochs}")

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


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("structinit.presets").iterdir())


def load_preset(name: str) -> dict[str, Any]:
    if name not in presets():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(presets())}")
    return yaml.safe_load(resources.files("structinit.presets").joinpath(f"{name}.yaml").read_text())


class TrainingDiverged(RuntimeError):
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
        return torch.device(name)
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
        return _train(config, device, world)
    finally:
        if world.world > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(config: TrainConfig, device: torch.device, world: Dist) -> dict[str, Any]:
    out = Path(config.out)
    checkpoint_path = out / "last.pt"
    checkpoint = None
    if config.resume:
        if not checkpoint_path.exists():
            raise FileNotFoundError(f"--resume: no checkpoint at {checkpoint_path}")
        checkpoint = torch.load(checkpoint_path, map_location="cpu", weights_only=False)
        saved = checkpoint["config"]
        config = dataclasses.replace(
            TrainConfig(**{**saved, "resume": True}), stop_after=config.stop_after, quiet=config.quiet
        )
    elif world.main and (out / "metrics.jsonl").exists():
        raise FileExistsError(f"{out} already holds a run: use --resume to continue it or another --out")
    show = world.main and not config.quiet

    data = load_data(
        config.data,
        root=config.data_root,
        download=config.download,
        cache_dir=config.cache_dir,
        per_class=config.per_class,
        train_fraction=config.train_fraction,
        subset_seed=config.subset_seed,
        val_per_class=config.val_per_class,
    )
    in_memory = isinstance(data, TensorData)
    channels = data.image_shape[0] if in_memory else data.channels
    model, init_report = build_model(config, data)
    model.to(device)
    amp_dtype = resolve_amp(config.amp, device)
    prefer_math_attention(model, device, amp_dtype)
    train_model: nn.Module = model
    if world.world > 1:
        train_model = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    forward = torch.compile(train_model) if config.compile else train_model

    batch = config.batch_size // world.world
    if batch * world.world != config.batch_size or batch < 1:
        raise ValueError(f"--batch-size {config.batch_size} must be a multiple of the {world.world} processes")
    steps_per_epoch = len(data.train_labels) // config.batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"--batch-size {config.batch_size} exceeds the {len(data.train_labels)} training images")
    optimizer = create_optimizer_v2(model, "adamw", lr=config.lr, weight_decay=config.weight_decay)
    scheduler = CosineLRScheduler(
        optimizer,
        t_initial=config.epochs * steps_per_epoch,
        lr_min=config.min_lr,
        warmup_t=round(config.warmup_epochs * steps_per_epoch),
        warmup_lr_init=config.warmup_lr,
        t_in_epochs=False,
    )
    ema = ModelEmaV3(model, decay=config.ema_decay) if config.ema_decay else None
    scaler = torch.amp.GradScaler(device.type) if amp_dtype == torch.float16 else None
    mixing = config.mixup > 0 or config.cutmix > 0
    mixup = (
        Mixup(
            mixup_alpha=config.mixup,
            cutmix_alpha=config.cutmix,
            label_smoothing=config.smoothing,
            num_classes=data.num_classes,
        )
        if mixing
        else None
    )
    criterion = SoftTargetCrossEntropy() if mixing else LabelSmoothingCrossEntropy(config.smoothing)
    mean, std = _normalisation(model, channels)

    start_epoch = 0
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        if ema is not None:
            ema.load_state_dict(checkpoint["ema"])
        if scaler is not None and checkpoint.get("scaler"):
            scaler.load_state_dict(checkpoint["scaler"])
        _set_rng_state(checkpoint["rng"])
        start_epoch = checkpoint["epoch"]
    elif world.main:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(config), sort_keys=False))
        (out / "init_report.json").write_text(json.dumps(init_report.to_dict(), indent=2))
        if 0 in config.snapshot_epochs:
            save_snapshot(model, out, 0)

    if in_memory:
        size = data.image_shape[1]
        padding = config.crop_padding if config.crop_padding is not None else size // 8
        flip = config.flip if config.flip is not None else data.name not in ("digits", "svhn")
        augment = BatchAugment(mean, std, padding, flip, mixup, config.randaugment)
        train_images = data.train_images.to(device)
        train_labels = data.train_labels.to(device)
        eraser = RandomErasing(config.reprob, mode="pixel", device=str(device)) if config.reprob > 0 else None
    else:
        loaders = _stream_loaders(data, model, config, batch, world)

    split = config.eval_split

    def eval_batches():
        """The process's share of the evaluation split (validation or test), as the model sees it."""
        if not in_memory:
            yield from ((x.to(device), y.to(device)) for x, y in loaders[1])
            return
        images, labels = (data.val_images, data.val_labels) if split == "val" else (data.test_images, data.test_labels)
        normalise = BatchAugment(mean, std).normalise
        for idx in torch.arange(world.rank, len(labels), world.world).split(config.eval_batch_size):
            yield normalise(images[idx].to(device)), labels[idx].to(device)

    last_epoch = config.epochs if config.stop_after is None else min(config.epochs, config.stop_after)
    epochs = tqdm(
        range(start_epoch, last_epoch), desc="epochs", disable=not show or None, initial=start_epoch, total=last_epoch
    )
    summary_metrics: dict[str, Any] = {}
    for epoch in epochs:
        seed = epoch_seed(config.seed, epoch)
        seed_everything(seed + world.rank)
        np.random.seed(seed)  # mixup's lambda: the same on every process
        generator = torch.Generator().manual_seed(seed)
        model.train()
        started = time.perf_counter()
        total_loss, seen = torch.zeros((), device=device), 0
        if in_memory:
            order = torch.randperm(len(train_labels), generator=generator)[: steps_per_epoch * config.batch_size]
            batches = order.view(steps_per_epoch, config.batch_size)
        else:
            if world.world > 1:
                loaders[0].sampler.set_epoch(epoch)
            batches = loaders[0]
        steps = tqdm(batches, desc=f"epoch {epoch + 1}", leave=False, disable=not show or None, total=steps_per_epoch)
        for step, item in enumerate(steps):
            if in_memory:
                images, labels = augment(train_images[item.to(device)], train_labels[item.to(device)], generator)
                images, labels = (
                    images[world.rank * batch : (world.rank + 1) * batch],
                    labels[world.rank * batch : (world.rank + 1) * batch],
                )
                if eraser is not None:
                    images = eraser(images)
            else:
                images, labels = (t.to(device, non_blocking=True) for t in item)
                if mixup is not None:
                    images, labels = mixup(images, labels)
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
                loss = criterion(forward(images), labels)
            if not torch.isfinite(loss):
                raise TrainingDiverged(
                    f"the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}; "
                    f"the last good checkpoint is kept at {checkpoint_path} (epoch {epoch})"
                )
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if config.clip_grad:
                nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step_update(epoch * steps_per_epoch + step + 1)
            if ema is not None:
                ema.update(model)
            total_loss += loss.detach() * len(images)
            seen += len(images)
        train_loss = _all_reduce_sum(total_loss, world).item() / (seen * world.world)
        seconds = time.perf_counter() - started
        metrics: dict[str, Any] = {"epoch": epoch + 1, "step": (epoch + 1) * steps_per_epoch, "train_loss": train_loss}
        evaluate = (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.epochs
        if evaluate:
            metrics.update(_evaluate(model, eval_batches(), device, world, amp_dtype, split))
        if ema is not None and evaluate:
            ema_metrics = _evaluate(ema.module, eval_batches(), device, world, amp_dtype, split)
            metrics.update({f"ema_{k}": v for k, v in ema_metrics.items()})
        metrics.update(
            lr=optimizer.param_groups[0]["lr"],
            img_per_s=steps_per_epoch * config.batch_size / seconds,
            epoch_seconds=seconds,
            time=time.time(),
        )
        summary_metrics = metrics
        if world.main:
            with open(out / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
            state = {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "ema": ema.state_dict() if ema is not None else None,
                "scaler": scaler.state_dict() if scaler is not None else None,
                "epoch": epoch + 1,
                "rng": _rng_state(),
                "config": dataclasses.asdict(config),
            }
            atomic_save(state, checkpoint_path)
            if epoch + 1 in config.snapshot_epochs:
                save_snapshot(model, out, epoch + 1)
            if evaluate:
                epochs.set_postfix(loss=f"{train_loss:.3f}", top1=f"{metrics[f'{split}_top1']:.1f}")
    summary = {"finished": last_epoch == config.epochs, "epochs_done": last_epoch, **summary_metrics}
    summary["init"] = {k: init_report.to_dict()[k] for k in ("method", "mean_fidelity", "min_fidelity", "seconds")}
    if world.main and summary["finished"]:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
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
    options = {**options, **config.init_kwargs}
    kernel_size = options.pop("kernel_size", config.kernel_size)
    report = initialize(model, method, kernel_size=kernel_size, seed=config.seed, **options)
    return model, report


def prefer_math_attention(model: nn.Module, device: torch.device, amp_dtype: torch.dtype | None) -> None:
    """On CPU under bf16 autocast, timm's attention runs faster unfused: torch's CPU
    scaled_dot_product_attention has no fast bf16 path for short sequences of small heads
    (2.4x faster with 12 heads of dimension 16: benchmarks/bench_train.py). Same maths."""
    if device.type == "cpu" and amp_dtype == torch.bfloat16:
        for module in model.modules():
            if isinstance(getattr(module, "fused_attn", None), bool):
                module.fused_attn = False


def save_snapshot(model: nn.Module, out: Path, epoch: int) -> None:
    """The model's weights after `epoch` (0: at init) in OUT/snapshots, for measuring how what the
    init put in changes along training (benchmarks/bench_mechanism.py --part training)."""
    folder = out / "snapshots"
    folder.mkdir(exist_ok=True)
    atomic_save(model.state_dict(), folder / f"epoch_{epoch:04d}.pt")


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


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file, then rename: a crash never leaves a half-written checkpoint."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


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


__all__ = ["TrainConfig", "TrainingDiverged", "atomic_save", "presets", "train"]
