"""Loggers beside metrics.jsonl, which stays the record a run resumes and is tabulated from:
TensorBoard (torch's SummaryWriter, in RUN/tensorboard) and Weights & Biases (where installed).

Each gets the numbers of every finished epoch at step = epoch. A resumed run drops what they hold
past its checkpoint (TensorBoard's purge_step) and continues the same W&B run (its id is kept in
RUN/wandb_id), so neither shows an epoch twice after a crash.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
from pathlib import Path
from typing import Any

from ..files import atomic_write_text
from ..version import DISTRIBUTION

LOGGERS = ("tensorboard", "wandb")


def check_loggers(names: list[str]) -> None:
    unknown = sorted(set(names) - set(LOGGERS))
    if unknown:
        raise ValueError(f"--log: unknown logger(s) {', '.join(unknown)}; choose from {', '.join(LOGGERS)}")


class Loggers:
    """The loggers `names` (checked by TrainConfig) of the run in `out`, which starts after epoch `start`
    (0: a fresh run). They open at the first epoch logged, after its checkpoint and record: a run
    stopped before then leaves no logger file its record does not name."""

    def __init__(self, names: list[str], out: Path, settings: dict[str, Any], start: int) -> None:
        self.names, self.out, self.settings, self.start = names, out, settings, start
        for name, install in (("tensorboard", f"'{DISTRIBUTION}[log]'"), ("wandb", "wandb")):
            if name in names and importlib.util.find_spec(name) is None:
                raise ImportError(f"--log {name} needs {name}: pip install {install}")
        self.writer = self.wandb_run = None
        self.opened = False

    def _open(self) -> None:
        self.opened = True
        out = self.out
        if "tensorboard" in self.names:
            from torch.utils.tensorboard import SummaryWriter  # needs tensorboard: the [log] extra

            self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=self.start + 1 if self.start else None)
        if "wandb" in self.names:
            import wandb  # pip install wandb

            id_file = out / "wandb_id"
            if not id_file.exists():
                atomic_write_text(id_file, uuid.uuid4().hex[:16])
            self.wandb_run = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "structinit"),
                name=out.name,
                id=id_file.read_text().strip(),
                resume="allow",
                dir=str(out),
                config=self.settings,
            )

    def log(self, metrics: dict[str, Any]) -> None:
        if not self.opened:
            self._open()
        epoch = metrics["epoch"]
        scalars = {
            k: v
            for k, v in metrics.items()
            if k not in ("epoch", "time") and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
        if self.writer is not None:
            for name, value in scalars.items():
                self.writer.add_scalar(name, value, epoch)
            self.writer.flush()
        if self.wandb_run is not None:
            self.wandb_run.log({**scalars, "epoch": epoch}, step=epoch)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
