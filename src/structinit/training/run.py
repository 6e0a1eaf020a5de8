"""The trainer: timm's recipe (AdamW, cosine schedule with warmup, label smoothing, mixup/cutmix,
drop-path, gradient clipping, EMA) around a model initialised by structinit, on CPU, CUDA or MPS,
in one process or many (torchrun, DDP).

A run lives in one directory (rundir.py): config.yaml (resolved), metrics.jsonl (one line per
epoch), last.pt (written atomically after every epoch) and summary.json at the end. Every epoch
reseeds its random streams from (seed, epoch), so a run stopped after epoch k and resumed ends with
the same weights as one that never stopped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..adapters import unwrap
from ..data.batches import batches_for
from ..data.datasets import evaluated_on, fingerprint
from ..errors import Notice, RunError, first_line
from ..files import folders_to_make, remove_empty_folders
from ..memory import check_fits
from ..weights_in import check_weights
from .checkpoint import load_checkpoint, rng_state, set_rng_state
from .config_file import config_values, read_config
from .device import Dist, all_reduce_sum, distributed_processes, resolve_amp, resolve_device, setup_distributed
from .lock import RunLock
from .loggers import Loggers
from .ownership import clear_run
from .progress import Progress
from .provenance import environment
from .recipe import Recipe, data_of, data_size, evaluate, feed_of, notices
from .rundir import RunDir
from .settings import TrainConfig
from .startup import measure_init, process_batch, startup_lines, updates_per_epoch

# steps between checks that the losses are finite (each check waits for the device)
FINITE_CHECK_STEPS = 50


class TrainingDiverged(RunError):
    """The loss became NaN or infinite."""


def accumulation(step: int, steps: int, accum: int, updates_before: int) -> tuple[int | None, float]:
    """Batch `step` of an epoch of `steps` in groups of `accum` (--grad-accum-steps): the run's optimiser step
    it ends (counted from `updates_before`, the epoch's first), None if it ends none, and its loss's share."""
    first = step - step % accum
    end = min(first + accum, steps)
    return (updates_before + step // accum if step + 1 == end else None), 1 / (end - first)


def epoch_seed(seed: int, epoch: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + 17) % (2**31)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(config: TrainConfig) -> dict[str, Any]:
    """Run (or resume) one training run; returns the summary written to summary.json."""
    processes = distributed_processes()
    device = resolve_device(config.device, processes.local_rank)
    world = setup_distributed(device, processes)
    try:
        if Path(config.out).exists() and not Path(config.out).is_dir():
            raise ValueError(f"--out {config.out} is a file: give a directory for the run")
        if config.resume and not any((Path(config.out) / f).exists() for f in ("config.yaml", "last.pt")):
            raise FileNotFoundError(f"--resume: there is no run in {config.out}")
        out = Path(config.out)
        made = folders_to_make(out)  # the folders this run makes, deepest first
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
    remove_empty_folders(made)  # not one where anything else is


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
    """One training run, step by step: open its directory (fresh, or resumed with the changes allowed),
    build what it trains, restore a checkpoint, then for every epoch train, evaluate, check that the
    weights are good and checkpoint them before the epoch is logged; finish with summary.json."""

    def __init__(self, config: TrainConfig, device: torch.device, world: Dist) -> None:
        self.config, self.device, self.world = config, device, world
        self.dir = RunDir(config, main=world.main)
        self.checkpointed: int | None = None  # the epoch of the last good checkpoint on disk

    def run(self) -> dict[str, Any]:
        config, world = self.config, self.world
        checkpoint = self.dir.open(environment(self.device, resolve_amp(config.amp, self.device), world.world))
        summary = self.dir.out / "summary.json"
        if checkpoint is not None and summary.exists() and checkpoint["epoch"] >= config.total_epochs:
            return self.dir.read_summary()  # finished, nothing asked: no-op
        self.build(checkpointed=checkpoint is not None)
        start, last = self.restore(checkpoint), self.dir.last_epoch
        named = evaluated_on(self.data, config.eval_split)
        progress = Progress(start, last, world.main and not config.quiet, config.eval_split, self.evaluated, named)
        metrics: dict[str, Any] = {}
        self.loggers = Loggers(config.log if world.main else [], self.dir.out, dataclasses.asdict(config), start)
        try:
            for epoch in progress:
                metrics = self.train_epoch(epoch)
                progress.epoch(metrics)
        finally:
            self.loggers.close()
        return self.finish(last, metrics)

    def build(self, checkpointed: bool) -> None:
        """The data, the recipe (the model, initialised, and what trains it; its weights from the checkpoint
        next where `checkpointed`) and the batches."""
        config, world = self.config, self.world
        self.data = data_of(config)
        self.data_fingerprint = fingerprint(self.data)
        self.recipe = Recipe(config, self.data, self.device, world, checkpointed)
        for line in notices(config, self.data) if world.main else []:
            warnings.warn(line, Notice, stacklevel=1)
        batch = process_batch(config, world.world, len(self.data.train_labels))
        channels, size = self.data.channels, data_size(config, self.data) or 0  # 0: the model's own size
        check_fits(  # a batch, its augmented copy and the model's input, in float32
            3 * 4 * batch * channels * size * size,
            f"a batch of {batch} images of {channels}x{size}x{size}",
            "give a smaller --batch-size or --img-size",
        )
        feed = feed_of(config, world, show=world.main and not config.quiet)
        self.batches = batches_for(self.data, self.recipe.model, feed, self.device, self.recipe.mixup)
        self.updates = updates_per_epoch(self.batches.steps, config.grad_accum_steps)
        self.startup: list[str] = []
        if world.main:
            measure_init(self.recipe.report, self.recipe.model, self.data, config.init_spec.kernel_size or 3)
            self.startup = startup_lines(config, self.data, self.recipe.model, self.recipe.report, self.batches.steps)
            self.startup += self.batches.lines()
            if not config.quiet:
                print("\n".join(self.startup), flush=True)

    def restore(self, checkpoint: dict[str, Any] | None) -> int:
        """Load the checkpoint's state (or record the init) and set the lr schedule; returns the epoch
        to start from."""
        start = 0
        if checkpoint is not None:
            if checkpoint.get("data", self.data_fingerprint) != self.data_fingerprint:
                raise RunError(
                    f"the data of {self.dir.out} ({self.config.data}) changed since its checkpoint (images added, "
                    "removed or replaced): resume it on the data it trained on, or start a new run"
                )
            try:
                self.recipe.load(checkpoint)
                set_rng_state(checkpoint["rng"])
            except (KeyError, RuntimeError, ValueError, TypeError) as error:
                raise RunError(
                    f"{self.dir.checkpoint_path} does not fit its run ({first_line(error)}): it was changed, or is "
                    "another run's; prev.pt, if present, holds the epoch before"
                ) from None
            check_weights(str(self.dir.checkpoint_path), checkpoint["model"], unwrap(self.recipe.model))
            start = self.checkpointed = checkpoint["epoch"]
        elif self.world.main:
            self.dir.start({**self.recipe.report.to_dict(), "startup": self.startup}, self.recipe.model)
        self.recipe.schedule(self.updates, start)
        return start

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Train one epoch, evaluate when due, and checkpoint it if its weights are good."""
        config, world, steps, updates = self.config, self.world, self.batches.steps, self.updates
        seed = epoch_seed(config.seed, epoch)
        seed_everything(seed + world.rank)
        np.random.seed(seed)  # mixup's lambda: the same on every process
        generator = torch.Generator().manual_seed(seed)
        self.recipe.model.train()
        started = time.perf_counter()
        total_loss, seen = torch.zeros((), device=self.device), 0
        losses, checked, done = torch.empty(steps, device=self.device), 0, 0
        for step, (images, labels) in enumerate(self.batches.train(epoch, generator)):
            update, share = accumulation(step, steps, config.grad_accum_steps, epoch * updates)
            losses[step] = loss = self.recipe.step(images, labels, update, share).detach()
            total_loss += loss * len(images)
            seen, done = seen + len(images), step + 1
            if done % FINITE_CHECK_STEPS == 0:
                self.check_losses(losses[checked:done], epoch, checked)
                checked = done
        self.check_losses(losses[checked:done], epoch, checked)
        seconds = time.perf_counter() - started
        metrics: dict[str, Any] = {
            "epoch": epoch + 1,
            "step": (epoch + 1) * updates,
            "train_loss": all_reduce_sum(total_loss, world).item() / (seen * world.world),
        }
        if (epoch + 1) % config.eval_every == 0 or epoch + 1 == config.total_epochs:
            subset = epoch + 1 < config.total_epochs or config.eval_final == "subset"
            evaluating = time.perf_counter()
            metrics.update(self.evaluate(self.recipe.eval_forward, subset))
            if self.recipe.ema is not None:
                metrics.update({f"ema_{k}": v for k, v in self.evaluate(self.recipe.ema.module, subset).items()})
            metrics["eval_seconds"] = time.perf_counter() - evaluating
        metrics.update(
            lr=self.recipe.lr(),
            img_per_s=steps * config.batch_size / seconds,
            epoch_seconds=seconds,
            time=time.time(),
        )
        self.check_good(metrics)
        self.save(metrics)
        return metrics

    def evaluated(self, epoch: int) -> int:
        """The images the evaluation after `epoch` (from 1) goes through (0: none)."""
        config, (whole, subset) = self.config, self.batches.eval_counts
        if epoch % config.eval_every and epoch != config.total_epochs:
            return 0
        final = epoch == config.total_epochs and config.eval_final == "full"
        return whole if final or subset is None else subset

    def evaluate(self, model: nn.Module, subset: bool = False) -> dict[str, float]:
        """Top-1, top-5 and loss of `model` on the evaluation split (validation or test; `subset`: its
        --eval-per-class subset, where asked)."""
        batches = self.batches.evaluate(subset)
        return evaluate(model, batches, self.device, self.world, self.recipe.amp_dtype, self.config.eval_split)

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
        if not torch.stack([torch.isfinite(p).all() for p in self.recipe.model.parameters()]).all():  # one sync
            raise TrainingDiverged(self.diverged(f"the weights stopped being finite at epoch {metrics['epoch']}"))

    def diverged(self, what: str) -> str:
        if self.checkpointed is None:
            return f"{what}; no checkpoint was kept (it diverged in its first epoch): start again with a lower --lr"
        return (
            f"{what}; the last good checkpoint is {self.dir.checkpoint_path} (epoch {self.checkpointed}): "
            "continue from it with --resume --lr <lower>"
        )

    def save(self, metrics: dict[str, Any]) -> None:
        """Checkpoint the epoch and log it (the main process), then its loggers."""
        if self.world.main:
            state = {
                **self.recipe.state(),
                "epoch": metrics["epoch"],
                "rng": rng_state(),
                "config": dataclasses.asdict(self.config),
                "data": self.data_fingerprint,
            }
            self.dir.save(state, self.recipe.model, metrics)
            self.loggers.log(metrics)
        self.checkpointed = metrics["epoch"]

    def finish(self, last: int, metrics: dict[str, Any]) -> dict[str, Any]:
        """summary.json once the run has done all its epochs (a resume that had none left to do
        takes the last logged epoch's metrics)."""
        if not metrics and self.world.main:
            metrics = (self.dir.log.epochs() or [{}])[-1]
        summary = {"finished": last == self.config.total_epochs, "epochs_done": last, **metrics}
        named = evaluated_on(self.data, self.config.eval_split)
        if named != self.config.eval_split:
            summary["evaluated_on"] = named  # an evaluation folder by its name: its metrics keep the split's
        report = self.recipe.report.to_dict()
        summary["init"] = {k: report[k] for k in ("method", "mean_fidelity", "min_fidelity", "seconds")}
        if self.world.main and summary["finished"]:
            self.dir.finish(summary)
        return summary


def print_summary(summary: dict[str, Any], out: str | Path) -> None:
    split = next((s for s in ("test", "val") if f"{s}_top1" in summary), None)
    if split is None:
        return
    status = "finished" if summary["finished"] else f"stopped after epoch {summary['epochs_done']}"
    print(
        f"{status}: {summary.get('evaluated_on', split)} top-1 {summary[f'{split}_top1']:.2f}%, "
        f"top-5 {summary[f'{split}_top5']:.2f}%, "
        f"train loss {summary['train_loss']:.4f} -> {out}"
    )


__all__ = ["Run", "TrainConfig", "TrainingDiverged", "read_config", "resume_config", "train"]
