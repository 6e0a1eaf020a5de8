"""What a run trains and how: the model (initialised by structinit), timm's optimiser and lr schedule
(optimizer.py), EMA, mixup/cutmix and loss, under autocast and (with several processes) DDP; one optimiser
step; the state a checkpoint keeps."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.scheduler.scheduler import Scheduler
from timm.utils import ModelEmaV3
from torch import nn

from ..data.batches import Feed
from ..data.datasets import StreamData, TensorData, load_data
from ..data.feed import TIMM_FLAGS
from ..export import load_weights
from ..inits.labels import InitSpec
from ..measure import fidelity
from ..models import PATCH_FOLLOWS_DATA, PRESETS, build_model, patch_for
from ..report import Report
from .device import Dist, all_reduce_sum, prefer_math_attention, resolve_amp, usable_cores
from .optimizer import create_optimizer, create_schedule, optimizer_kernel
from .settings import TrainConfig


class Recipe:
    """The model and everything that trains it, built from a config for the data, on a device."""

    def __init__(
        self,
        config: TrainConfig,
        data: TensorData | StreamData,
        device: torch.device,
        world: Dist,
        checkpointed: bool = False,
    ):
        self.config, self.device, self.world = config, device, world
        self.model, self.report = model_of(config, data, checkpointed)
        self.model.to(device)
        self.amp_dtype = resolve_amp(config.amp, device)
        prefer_math_attention(self.model, device, self.amp_dtype)
        train_model: nn.Module = self.model
        self.ddp: nn.parallel.DistributedDataParallel | None = None
        if world.world > 1:
            ids = [device.index] if device.type == "cuda" else None
            train_model = self.ddp = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        compiled = compiles(config, device)
        self.forward = torch.compile(train_model, mode=config.compile_mode) if compiled else train_model
        self.eval_forward = torch.compile(self.model) if compiled else self.model  # the same weights
        self.optimizer = create_optimizer(self.model, config, device)
        self.ema = ModelEmaV3(self.model, decay=config.ema_decay) if config.ema_decay else None
        self.scaler = torch.amp.GradScaler(device.type) if self.amp_dtype == torch.float16 else None
        mixing = config.mixup > 0 or config.cutmix > 0
        self.mixup = (
            Mixup(config.mixup, config.cutmix, label_smoothing=config.smoothing, num_classes=data.num_classes)
            if mixing
            else None
        )
        self.criterion = SoftTargetCrossEntropy() if mixing else LabelSmoothingCrossEntropy(config.smoothing)
        self.scheduler: Scheduler | None = None

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the recipe."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
        }

    def load(self, checkpoint: dict[str, Any]) -> None:
        """Put back a checkpoint's state (KeyError, RuntimeError, ValueError or TypeError if it does not fit)."""
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        if self.ema is not None:
            self.ema.load_state_dict(checkpoint["ema"])
        if self.scaler is not None and checkpoint.get("scaler"):
            self.scaler.load_state_dict(checkpoint["scaler"])

    def schedule(self, steps_per_epoch: int, start_epoch: int) -> None:
        """The lr schedule, a function of the optimiser step (`steps_per_epoch` of them an epoch): a resumed
        run with more epochs or a new lr follows the new one; the optimiser takes this device's kernel, not
        the checkpoint's."""
        kernel = optimizer_kernel(self.device)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = self.config.peak_lr
            group.update({k: v for k, v in kernel.items() if k in group})
        self.steps_per_epoch = steps_per_epoch
        self.scheduler = create_schedule(self.optimizer, self.config, steps_per_epoch)
        if start_epoch:
            self.scheduler.step_update(start_epoch * steps_per_epoch)

    def step(self, images: torch.Tensor, labels: torch.Tensor, update: int | None, share: float = 1.0) -> torch.Tensor:
        """Add `share` of one batch's loss's gradients to those before; where `update` is given (the run's
        update-th optimiser step, from 0) take that step (--grad-accum-steps: every N batches). Returns the
        batch's loss."""
        with self._accumulating() if update is None else contextlib.nullcontext():
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.amp_dtype is not None):
                loss = self.criterion(self.forward(images), labels)
            part = loss * share if share != 1 else loss
            (self.scaler.scale(part) if self.scaler is not None else part).backward()
        if update is None:
            return loss
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.config.clip_grad:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.clip_grad)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step_update(update + 1)
        if self.ema is not None:
            self.ema.update(self.model)
        return loss

    def _accumulating(self) -> contextlib.AbstractContextManager:
        """Across processes, a batch whose gradients only add up: DDP's no_sync (their sum is reduced once,
        with the update's batch)."""
        return self.ddp.no_sync() if self.ddp is not None else contextlib.nullcontext()

    def lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]


def notices(config: TrainConfig, data: TensorData | StreamData) -> list[str]:
    """What a run chose for the user, or will do that they may not expect, one line each: the patch
    of a preset that follows the data, a warm-up as long as the run."""
    lines = []
    size = data_size(config, data)
    patch = patch_for(config.model, size, config.model_kwargs)
    if patch is not None and patch != PRESETS[config.model][1]["patch_size"]:
        grid = size // patch
        lines.append(
            f"--model {config.model} on {size} px images: patch {patch}, {grid}x{grid} tokens (choose with "
            "--model-kwargs patch_size=P, or another --model: structinit init --list-models)"
        )
    peak = f"--lr {config.lr:g}" if config.lr_base is None else f"its peak {config.peak_lr:g} (--lr-base)"
    if config.warmup_epochs >= config.epochs:
        lines.append(
            f"--warmup-epochs {config.warmup_epochs:g} >= --epochs {config.epochs}: the whole run is warm-up and "
            f"the lr never reaches {peak}; give fewer --warmup-epochs"
        )
    return lines


STREAMED_SIZE = 224  # the largest input a preset that follows the data takes from streamed images' own size


def data_size(config: TrainConfig, data: TensorData | StreamData) -> int | None:
    """The side of the images the model is built for: the in-memory images', or --img-size; for streamed
    images and a preset whose patch follows the data, their own size up to STREAMED_SIZE (a timm model
    keeps its own input size, as timm's train.py does)."""
    if isinstance(data, TensorData):
        return data.image_shape[1]
    if config.img_size is None and config.model in PATCH_FOLLOWS_DATA and data.image_size:
        return min(data.image_size, STREAMED_SIZE)
    return config.img_size


def feed_of(config: TrainConfig, world: Dist, show: bool = False) -> Feed:
    """How a run with `config` feeds its model on this process (`show`: a bar over each epoch's steps)."""
    return Feed(
        batch=config.batch_size // world.world,
        eval_batch=config.eval_batch_size,
        eval_split=config.eval_split,
        rank=world.rank,
        world=world.world,
        crop_padding=config.crop_padding,
        flip=config.flip,
        randaugment=config.randaugment,
        reprob=config.reprob,
        workers=min(config.workers, usable_cores()),  # torch warns of more than the cores, and they wait
        seed=config.seed,
        show=show,
        eval_per_class=config.eval_per_class,
        aug_repeats=config.aug_repeats,
        **{name: getattr(config, name) for name in TIMM_FLAGS},
        pin_memory=config.pin_mem,
    )


def data_of(config: TrainConfig) -> TensorData | StreamData:
    """The data a run with `config` trains and is evaluated on (its subset and validation split included)."""
    return load_data(
        config.data,
        root=config.data_root,
        download=config.download,
        cache_dir=config.cache_dir,
        per_class=config.per_class,
        train_fraction=config.train_fraction,
        subset_seed=config.subset_seed,
        val_per_class=config.val_per_class,
        classes=config.classes,
        img_size=config.img_size,
        num_classes=config.num_classes,
        splits=(config.train_split, config.val_split),
    )


INITIAL_CHECKPOINT = "initial-checkpoint"  # the init report's method of a run started from a file


def model_of(
    config: TrainConfig, data: TensorData | StreamData, checkpointed: bool = False
) -> tuple[nn.Module, Report]:
    """The run's model, created for the data's classes, channels and image size and initialised (or loaded
    from --initial-checkpoint, unless the weights come from a checkpoint next: `checkpointed`, which holds
    them when that file is gone); returns (model, init report). Seeded: the same model every time."""
    spec = InitSpec.parse("default") if config.initial_checkpoint else config.init_spec
    model, report = build_model(
        config.model,
        spec,
        config.seed,
        num_classes=data.num_classes,
        in_chans=data.channels,
        data_size=data_size(config, data),
        drop_path=config.drop_path,
        teacher=config.teacher,
        **({"drop_rate": config.drop_rate} if config.drop_rate else {}),
        **config.model_kwargs,
    )
    if config.initial_checkpoint and not checkpointed:
        digest = load_weights(model, config.initial_checkpoint)
        with contextlib.suppress(ValueError, TypeError, NotImplementedError):  # a family it cannot measure
            report = dataclasses.replace(fidelity(model), seed=config.seed, constructor=report.constructor)
        source = {"initial_checkpoint": config.initial_checkpoint, "weights_sha256": digest}
        report = dataclasses.replace(report, method=INITIAL_CHECKPOINT, source=source)
    return model, report


def compiles(config: TrainConfig, device: torch.device) -> bool:
    """Whether the run's model is compiled: as --compile/--no-compile say, or when a --compile-mode is given,
    else on CUDA only (an H200 trains the Table 5 ViT 1.46x faster compiled: docs/bench_train.md; on a CPU it
    gains nothing and costs a minute of compilation: docs/training.md)."""
    if config.compile is not None:
        return config.compile
    return config.compile_mode is not None or device.type == "cuda"


@torch.no_grad()
def evaluate(model: nn.Module, batches, device: torch.device, world: Dist, amp_dtype, split: str = "test") -> dict:
    """Top-1/top-5 (percent), loss and the number of images over the evaluation batches of every process,
    named by `split`."""
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
    c1, c5, loss, n = all_reduce_sum(totals, world).tolist()
    return {
        f"{split}_top1": 100 * c1 / n,
        f"{split}_top5": 100 * c5 / n,
        f"{split}_loss": loss / n,
        f"{split}_images": int(n),
    }
