"""One run's directory as its trainer keeps it: opened fresh (claimed, its config written) or resumed
(its checkpoint loaded, a record a crash left behind repaired, the changes a resume may make kept to
be written with its first new checkpoint), then a checkpoint and a log line for every epoch, and
summary.json at the end. The record never says what was not trained."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import RunError
from ..files import atomic_save, atomic_write_text
from .checkpoint import load_checkpoint
from .config_file import config_values, read_run_config
from .identity import RESUMABLE, identity, identity_differences, resume_changes
from .ownership import RESULTS, check_fresh, clear_temporaries, refuse_links, snapshot_path
from .provenance import ENVIRONMENT
from .record import MetricsLog, checkpoint_lines, read_summary, summary_of_the_run
from .setting import flag
from .settings import TrainConfig
from .settings_yaml import dump_yaml

SUMMARY_FIX = "move it away: --resume writes the run's own when it finishes"


class RunDir:
    """The files of the run `config.out` (written by the main process only, `main`)."""

    def __init__(self, config: TrainConfig, main: bool = True) -> None:
        self.config, self.main = config, main
        self.out = Path(config.out)
        self.log = MetricsLog(self.out)
        self.checkpoint_path = self.out / "last.pt"
        # what a resume changed (log events), and where it goes on: written with its first checkpoint
        self.pending: list[dict[str, Any]] = []
        self.env: dict[str, Any] | None = None

    @property
    def last_epoch(self) -> int:
        """The epoch this process trains to."""
        config = self.config
        total = config.total_epochs
        return total if config.stop_after is None else min(total, config.stop_after)

    def open(self, env: dict[str, Any]) -> dict[str, Any] | None:
        """A fresh run claims its directory and writes its config (returns None); a resumed one returns
        its checkpoint, having repaired its record and kept the changes it may make (refusing others).
        A link where the run writes is refused first (refuse_links)."""
        config = self.config
        if self.main:
            refuse_links(self.out)
        used = (("snapshots", config.snapshot_epochs), ("tensorboard", "tensorboard" in config.log))
        folders = [name for name, on in used if on and (self.out / name).exists() and not (self.out / name).is_dir()]
        if folders:
            raise RunError(f"{self.out / folders[0]} is a file, where the run keeps its {folders[0]}: move it away")
        if not config.resume:
            if self.main:
                check_fresh(self.out)
                self.out.mkdir(parents=True, exist_ok=True)
                write_config(self.out, dataclasses.asdict(config), env)
            return None
        checkpoint = self.load_last()
        done = checkpoint["epoch"]
        saved = TrainConfig(**{**config_values(checkpoint["config"], "last.pt"), "resume": True})
        changes = self.allowed_changes(saved, done)
        if self.main:
            self.refuse_files_ahead(saved, done, checkpoint["model"])
            log, rewrite = self.log.reconciled(done, checkpoint_lines(checkpoint))
            behind = self.summary_behind(checkpoint, log)
            clear_temporaries(self.out)  # the checks made: the writes
            if rewrite:
                self.log.write(log)
            before = self.repair_record(saved, behind)
            if changes:
                self.pending.append({"event": "resume", "after_epoch": done, "changed": changes})
            if env != before:  # resumed elsewhere: config.yaml says where it goes on, the log where it was
                self.pending.append({"event": "environment", "after_epoch": done, ENVIRONMENT: env})
            self.env = env  # config.yaml is written again with the first checkpoint, where it says otherwise
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
        if config.stop_after is not None and config.stop_after <= done < config.total_epochs:
            raise RunError(
                f"--stop-after {config.stop_after}: {self.out} has already done {done} epochs, so it would train "
                f"nothing: give a later epoch, or leave it out to train to epoch {config.total_epochs}"
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
                differ = identity_differences(before["config"], dataclasses.asdict(saved), leave_out=RESUMABLE)
                ours = before["epoch"] <= done and not differ
            except (RunError, TypeError, KeyError):
                ours = False
            if not ours:
                ahead.append(prev)
        if ahead:
            raise RunError(
                f"{ahead[0]} is not this run's (it is at epoch {done}), and the run would write over it: move it "
                "away (it stays as it is), then --resume"
            )

    def summary_behind(self, checkpoint: dict[str, Any], log: list[dict[str, Any]]) -> bool:
        """Whether summary.json is the run's own of an epoch before its checkpoint's (then deleted: written again
        when it finishes). Before any write, one that is not the run's is refused: of the checkpoint's epoch
        without the metrics the checkpoint recorded of it, or ending no epoch of the log (`log`, as the resume
        makes it); a summary edited by hand is not repaired into the log."""
        path, kept, done = self.out / "summary.json", checkpoint.get("metrics"), checkpoint["epoch"]
        if not path.exists():
            return False
        record = read_summary(path, SUMMARY_FIX)
        if kept and record["epochs_done"] == done and not summary_of_the_run([kept], record):
            raise RunError(
                f"{path} is not this run's (not what last.pt recorded of epoch {done}): move it away (it stays as it "
                "is); --resume writes the run's own when it finishes"
            )
        if not summary_of_the_run([r for r in log if "event" not in r], record):
            raise RunError(
                f"{path} is not this run's (no epoch of its metrics.jsonl ends with it): move it away (it stays as it "
                "is); --resume writes the run's own when it finishes"
            )
        return record["epochs_done"] != done

    def repair_record(self, saved: TrainConfig, summary_behind: bool) -> dict[str, Any] | None:
        """Make config.yaml and summary.json agree with the checkpoint (a crash between a checkpoint and
        its record, or a record an older structinit wrote ahead of it); returns the recorded environment."""
        path = self.out / "config.yaml"
        try:
            recorded, before = read_run_config(path) if path.exists() else (None, None)
        except RunError:
            recorded, before = None, None
        values = {**dataclasses.asdict(saved), "resume": False}
        if recorded is None or identity(dataclasses.asdict(recorded)) != identity(values):
            write_config(self.out, values, before or {})
        if summary_behind:
            (self.out / "summary.json").unlink()  # the run's own, behind its checkpoint: written when it finishes
        return before

    def read_summary(self) -> dict[str, Any]:
        return read_summary(self.out / "summary.json", SUMMARY_FIX)

    def start(self, report: dict[str, Any], model: nn.Module) -> None:
        """A fresh run's init report, and its snapshot at init if asked."""
        atomic_write_text(self.out / "init_report.json", json.dumps(report, indent=2))
        if 0 in self.config.snapshot_epochs:
            save_snapshot(model, self.out, 0)

    def save(self, state: dict[str, Any], model: nn.Module, metrics: dict[str, Any]) -> None:
        """Checkpoint an epoch (durably, keeping the previous one, with its log lines), then write the
        record: what a resume changed (with its first checkpoint), the epoch's line. A snapshot comes first."""
        epoch = metrics["epoch"]
        lines = [*self.pending, metrics]
        if epoch in self.config.snapshot_epochs:  # before the checkpoint: an epoch checkpointed has its snapshot
            save_snapshot(model, self.out, epoch)
        # a run without a checkpoint yet starts again (a fresh one that made its folder removes it)
        then = " and --resume" if self.checkpoint_path.exists() else " and run it again"
        atomic_save({**state, "metrics": metrics, "log": lines}, self.checkpoint_path, keep_previous=True, then=then)
        if self.env is not None:
            (self.out / "summary.json").unlink(missing_ok=True)  # the run goes on past it
            values = {**dataclasses.asdict(self.config), "resume": False}
            write_config(self.out, values, self.env, if_changed=True)
        self.log.append(*lines)
        self.pending, self.env = [], None

    def finish(self, summary: dict[str, Any]) -> None:
        atomic_write_text(self.out / "summary.json", json.dumps(summary, indent=2), then=" and --resume")


def write_config(out: Path, values: dict[str, Any], env: dict[str, Any], if_changed: bool = False) -> None:
    """The settings as asked (read back with read_config), then where they ran (`if_changed`: only if
    the file says otherwise)."""
    text = dump_yaml({**values, ENVIRONMENT: env})
    path = out / "config.yaml"
    if not (if_changed and _holds(path, text)):
        atomic_write_text(path, text)


def _holds(path: Path, text: str) -> bool:
    """Whether `path` is a regular file holding `text`, read no further than `text` is long."""
    data = text.encode()
    if not path.is_file():
        return False
    with open(path, "rb") as file:
        return file.read(len(data) + 1) == data


def save_snapshot(model: nn.Module, out: Path, epoch: int) -> None:
    """The model's weights after `epoch` (0: at init) in OUT/snapshots, for measuring how what the
    init put in changes along training (benchmarks/bench_mechanism.py --part training)."""
    path = snapshot_path(out, epoch)
    path.parent.mkdir(exist_ok=True)
    atomic_save(model.state_dict(), path)


def _snapshot_of(path: Path, model: dict[str, torch.Tensor]) -> bool:
    """Whether `path` holds weights of the model `model` is the state of (the same names and shapes)."""
    if not path.is_file():  # a FIFO or a device is no snapshot (and reading it would hang)
        return False
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:
        return False
    return (
        isinstance(state, dict)
        and state.keys() == model.keys()
        and all(isinstance(v, torch.Tensor) and v.shape == model[k].shape for k, v in state.items())
    )
