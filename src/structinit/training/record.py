"""What a run records of its training: metrics.jsonl (one line per epoch, and the events of its
resumes), the log lines a checkpoint holds, and summary.json."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import atomic_write_text, no_follow, regular_file
from .identity import SCHEDULE
from .setting import flag

MAX_LINE = 1 << 20  # an epoch's line is ~500 bytes, an event's (where a resume ran) a few KB


class MetricsLog:
    """RUN/metrics.jsonl. An epoch's line is appended (and fsynced) after its checkpoint is durable;
    the checkpoint also holds that line (and the events before it), so `reconcile` can put back lines
    a crash lost, and drops lines of epochs after the checkpoint, so a resumed run never logs an
    epoch twice."""

    FIX = "remove the damaged line(s); --resume puts back the lines its checkpoint holds"

    def __init__(self, run: Path) -> None:
        self.path = Path(run) / "metrics.jsonl"

    def records(self) -> list[dict[str, Any]]:
        """Every line, as a dict with an "epoch" or an "event". A torn last line (a crash mid-write)
        is dropped; any other line that is not such a record is damage, named in one line."""
        if not self.path.exists():
            return []
        regular_file(self.path)
        try:
            lines = [line.decode() for line in self._lines()]
        except UnicodeDecodeError:
            raise RunError(f"{self.path} is damaged (not text): {self.FIX}") from None
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):  # not JSON, or nested too deep to read
                if number == len(lines):
                    continue
                raise RunError(f"{self.path} line {number} is damaged (not JSON): {self.FIX}") from None
            if not _is_record(record):
                raise RunError(f"{self.path} line {number} is not an epoch or event record: {self.FIX}")
            records.append(record)
        return records

    def _lines(self) -> list[bytes]:
        """The file's lines, each read within MAX_LINE bytes: a line longer than any record (NUL bytes
        appended, another file's contents) is damage, found without reading it whole."""
        lines = []
        with open(self.path, "rb") as file:
            while line := file.readline(MAX_LINE + 1):
                if len(line) > MAX_LINE:
                    raise RunError(
                        f"{self.path} line {len(lines) + 1} is damaged (longer than {MAX_LINE:,} bytes, which no "
                        f"record is): {self.FIX}"
                    )
                lines.append(line.rstrip(b"\r\n"))
        return lines

    def epochs(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "event" not in r]

    def training_changes(self) -> list[str]:
        """What resumes changed of how the run trains (SCHEDULE), as '--lr 0.001 -> 0.5 after epoch 3':
        a run trained partly otherwise than its config.yaml says now."""
        return [
            f"{flag(k)} {old!r} -> {new!r} after epoch {r.get('after_epoch')}"
            for r in self.records()
            if r.get("event") == "resume"
            for k, (old, new) in r.get("changed", {}).items()
            if k in SCHEDULE
        ]

    def append(self, *records: dict[str, Any]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in records)
        try:
            with open(self.path, "a", opener=no_follow) as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:  # a torn line is dropped by records() and put back by reconcile()
            reason = "no space left on the device holding it" if error.errno == errno.ENOSPC else error.strerror
            raise RunError(f"cannot write {self.path} ({reason or error}): free some space and --resume") from None

    def reconcile(self, epoch: int, lines: list[dict[str, Any]]) -> None:
        """Make the log end at `epoch`, the checkpoint's: drop later lines and any other line of that epoch
        (the checkpoint's is what was computed), put back the checkpoint's `lines` (its events and its
        epoch's line) that a crash lost; and make it the run's own file."""
        own = [line for line in lines if "event" not in line]  # the checkpoint's own line of its epoch
        records = [
            r
            for r in self.records()
            if r.get("epoch", r.get("after_epoch", 0)) <= epoch
            and not (own and "event" not in r and r.get("epoch") == epoch and r not in own)
        ]
        records += [line for line in lines if line not in records]
        text = "".join(json.dumps(r) + "\n" for r in records)
        if not self.path.exists() or self.shared() or self.path.read_text() != text:
            atomic_write_text(self.path, text, then=" and --resume")

    def shared(self) -> bool:
        """Whether appending would write into another file too: a hard-linked copy of a run (`cp -al`);
        reconcile then writes the log anew, as this run's own file (a link is refused: files.refuse_link)."""
        return self.path.stat().st_nlink > 1


def _is_record(record: Any) -> bool:
    """An epoch's line ({"epoch": int, numbers...}) or an event; a resume event names what it changed
    as {setting: [before, after]} after an epoch."""
    if not isinstance(record, dict):
        return False
    if "event" not in record:
        return isinstance(record.get("epoch"), int) and not isinstance(record["epoch"], bool)
    if record["event"] != "resume":
        return isinstance(record["event"], str)
    changed = record.get("changed")
    return (
        isinstance(record.get("after_epoch"), int)
        and isinstance(changed, dict)
        and all(isinstance(v, list) and len(v) == 2 for v in changed.values())
    )


def summary_of_the_run(epochs: list[dict[str, Any]], summary: dict[str, Any]) -> bool:
    """Whether `summary` is what the run whose log holds `epochs` wrote when it finished: its metrics are
    those of the log's line for the epoch it says the run ended at."""
    done = summary.get("epochs_done")
    line = {r["epoch"]: r for r in epochs}.get(done) if isinstance(done, int) else None
    return line is not None and all(summary.get(k) == v for k, v in line.items())


def checkpoint_lines(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The log lines a checkpoint holds: the events of its epoch and the epoch's line (a checkpoint of
    structinit < 0.3 holds the epoch's line only)."""
    if checkpoint.get("log") is not None:
        return list(checkpoint["log"])
    return [checkpoint["metrics"]] if checkpoint.get("metrics") else []
