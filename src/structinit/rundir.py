"""One run directory: who may write it (a lock), what it is (its resolved config and a hash of it),
what may change when it resumes, and its metrics log, which never holds an epoch twice or loses one.

    RUN/config.yaml     the resolved config (rewritten when a resume changes a setting)
    RUN/metrics.jsonl   one line per finished epoch, appended after its checkpoint is durable;
                        {"event": "resume", ...} lines record what a resume changed
    RUN/last.pt         the last good checkpoint (checkpoint.py); RUN/prev.pt the one before
    RUN/summary.json    written when the run finishes
    RUN/.lock           held by the process training the run
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# Settings a resumed run may change: they change how long it goes on, its learning rate, or only
# how it is watched and where it runs. Anything else would make it another run.
RESUMABLE = (
    "epochs",
    "lr",
    "stop_after",
    "eval_every",
    "eval_batch_size",
    "snapshot_epochs",
    "device",
    "workers",
    "compile",
    "quiet",
    "log",
)
# Settings that never change what a run computes: left out of its identity.
NOT_IDENTITY = (
    "out",
    "resume",
    "stop_after",
    "quiet",
    "device",
    "workers",
    "compile",
    "eval_batch_size",
    "cache_dir",
    "data_root",
    "download",
    "log",
)


class RunError(RuntimeError):
    """A run cannot go on as asked; the message says why and what to do, in one line."""


class RunLock:
    """An exclusive lock on a directory (an flock on DIR/.lock, released when the process ends, even
    by kill -9): a second process training the same run, or the same grid, is refused at once."""

    def __init__(self, folder: Path, what: str = "run") -> None:
        self.folder, self.what, self.file = Path(folder), what, None

    def __enter__(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the lock is advisory anyway
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        self.file = open(self.folder / ".lock", "a+")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.file.seek(0)
            holder = self.file.read().strip() or "another process"
            self.file.close()
            raise RunError(f"{self.folder} is in use by {holder}: wait for it to finish or use another --out") from None
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} ({self.what})")
        self.file.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide what a run computes."""
    return {k: v for k, v in config.items() if k not in NOT_IDENTITY}


def config_hash(config: dict[str, Any], leave_out: tuple[str, ...] = ()) -> str:
    """A short hash of a run's identity (less `leave_out`): equal hashes, the same computation."""
    fields = {k: v for k, v in identity(config).items() if k not in leave_out}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:10]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resume_changes(saved: dict[str, Any], asked: dict[str, Any], epochs_done: int) -> dict[str, list[Any]]:
    """The settings `asked` changes from the run's `saved` config, as {name: [saved, asked]}.

    Raises RunError, naming every flag, if any of them cannot change in a resumed run, or if the
    run would end before the epochs it has done."""
    changed = {k: [saved.get(k), v] for k, v in asked.items() if k != "resume" and saved.get(k) != v}
    fixed = [k for k in changed if k not in RESUMABLE and k != "out"]
    if fixed:
        listed = ", ".join(f"{flag(k)} {changed[k][1]!r} (the run has {changed[k][0]!r})" for k in fixed)
        raise RunError(f"--resume cannot change {listed}: start a new run with another --out")
    if asked.get("epochs", saved["epochs"]) < epochs_done:
        raise RunError(f"--epochs {asked['epochs']}: the run has already done {epochs_done} epochs")
    return {k: v for k, v in changed.items() if k in ("epochs", "lr", "eval_every", "snapshot_epochs")}


class MetricsLog:
    """RUN/metrics.jsonl. An epoch's line is appended (and fsynced) after its checkpoint is durable;
    the checkpoint also holds that line, so `reconcile` can put back a line a crash lost, and drops
    lines of epochs after the checkpoint, so a resumed run never logs an epoch twice."""

    def __init__(self, run: Path) -> None:
        self.path = Path(run) / "metrics.jsonl"

    def records(self) -> list[dict[str, Any]]:
        """Every parsable line (a torn last line, from a crash mid-write, is dropped)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def epochs(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "event" not in r]

    def append(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def reconcile(self, epoch: int, last: dict[str, Any] | None) -> None:
        """Make the log end at `epoch`, the checkpoint's: drop later lines, restore its line `last`."""
        records = [r for r in self.records() if r.get("epoch", r.get("after_epoch", 0)) <= epoch]
        if last is not None and not any(r.get("epoch") == epoch and "event" not in r for r in records):
            records.append(last)
        text = "".join(json.dumps(r) + "\n" for r in records)
        if not self.path.exists() or self.path.read_text() != text:
            atomic_write_text(self.path, text)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace a small text file whole: a crash leaves the old one."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
