"""What a run records of its training: metrics.jsonl (one line per epoch, and the events of its
resumes), the log lines a checkpoint holds, and summary.json: each read back within its bounds and
checked against its schema (schema.py) before any of it is used."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from ..errors import RunError, first_line
from ..files import atomic_write_text, no_follow, read_json_object
from ..schema import Bounds, Field, Schema, check, integer, json_lines, mapping, number, problem, shown, text
from .config_file import ENVIRONMENT_RECORD, FIELD_TYPES
from .identity import SCHEDULE
from .provenance import ENVIRONMENT
from .setting import check_value, flag
from .settings import SETTINGS

# an epoch's line is ~500 bytes, an event's (where a resume ran) a few KB, and no schedule is 100,000 epochs: a
# log beyond these is damage, refused as it is read, before it is kept in memory
LOG_BOUNDS = Bounds(line=1 << 20, lines=100_000, total=128 << 20)
SUMMARY_MAX_BYTES = 1 << 20  # a summary is about 1 KB


def _steps_of_epochs(record: dict[str, Any]) -> str | None:
    step, epoch = record.get("step"), record["epoch"]
    if step is not None and step % epoch:
        return f"its 'step' {step} is not {epoch} epochs of equal steps (a step count is epochs x steps an epoch)"
    return None


def _top5_holds_top1(record: dict[str, Any]) -> str | None:
    for top1 in [key for key in record if key.endswith("_top1")]:
        top5 = top1.removesuffix("1") + "5"
        if top5 in record and record[top5] < record[top1]:
            return f"its {top5!r} {record[top5]:g} is below its {top1!r} {record[top1]:g}, which a top-5 holds"
    return None


# an epoch's line: what the epoch trained, then its evaluations (of the model, of its EMA: `ema_`) on the
# test or validation split, where it had one; `step` (the optimiser steps so far) since 0.2
EPOCH = Schema(
    {
        "epoch": integer(1),
        "step": integer(1, optional=True),
        "train_loss": number(0),
        "lr": number(0),
        "img_per_s": number(0),
        "epoch_seconds": number(0),
        "eval_seconds": number(0, optional=True),
        "time": number(0),
    },
    patterns={
        r"(ema_)?(test|val)_top[15]": number(0, 100),
        r"(ema_)?(test|val)_loss": number(0),
        r"(ema_)?(test|val)_images": integer(1),
    },
    rules=(_steps_of_epochs, _top5_holds_top1),
)


def _changes_are_settings(record: dict[str, Any]) -> str | None:
    """A resume's changes: {setting: [before, after]}, each a value the setting takes."""
    for name, change in record["changed"].items():
        if name not in SETTINGS:
            return f"its 'changed' names {name!r}, which is no setting"
        if not isinstance(change, list) or len(change) != 2:
            return f"its 'changed.{name}' is {shown(change)}, not [before, after]"
        for value in change:
            try:
                check_value(name, FIELD_TYPES[name], SETTINGS[name].bounds, value, shown=f"'changed.{name}'")
            except ValueError as error:
                return f"its {first_line(error)}"
    return None


# the events a resume logs: what it changed, where the run went on; another's event is named, and kept
EVENTS = {
    "resume": Schema(
        {"event": text(), "after_epoch": integer(1), "changed": mapping()}, rules=(_changes_are_settings,)
    ),
    "environment": Schema({"event": text(), "after_epoch": integer(1), ENVIRONMENT: mapping(ENVIRONMENT_RECORD)}),
}
EVENT = Schema({"event": text()})


def _summary_of_its_epoch(record: dict[str, Any]) -> str | None:
    if record["epoch"] != record["epochs_done"]:
        return f"its 'epoch' {record['epoch']} is not its 'epochs_done' {record['epochs_done']}"
    return None


# summary.json: the last epoch's line, whether the run finished (a run writes it only then) and its init
SUMMARY = Schema(
    {
        "finished": Field("true (a run writes it when it finishes)", lambda value: value is True),
        "epochs_done": integer(1),
        **EPOCH.fields,
        "init": mapping(
            Schema(
                {
                    "method": text(),
                    **dict.fromkeys(("mean_fidelity", "min_fidelity"), number(0, null=True)),
                    "seconds": number(0),
                }
            )
        ),
    },
    patterns=EPOCH.patterns,
    rules=(*EPOCH.rules, _summary_of_its_epoch),
)


def line_problem(record: Any) -> str | None:
    """Why `record` is not a log line (an epoch's or an event), or None."""
    if not isinstance(record, dict):
        return f"{shown(record)}, not a mapping"
    if "event" not in record:
        return problem(record, EPOCH)
    event = record["event"]
    return problem(record, EVENTS.get(event, EVENT) if isinstance(event, str) else EVENT)


def read_summary(path: Path, fix: str) -> dict[str, Any]:
    """A run's summary.json, read within its bound and checked against its schema; one line naming it and `fix`."""
    return check(read_json_object(path, fix, SUMMARY_MAX_BYTES), SUMMARY, str(path), fix)


class MetricsLog:
    """RUN/metrics.jsonl. An epoch's line is appended (and fsynced) after its checkpoint is durable;
    the checkpoint also holds that line (and the events before it), so `reconciled` puts back lines
    a crash lost, and drops lines of epochs after the checkpoint, so a resumed run never logs an
    epoch twice."""

    FIX = "remove the damaged line(s); --resume puts back the lines its checkpoint holds"

    def __init__(self, run: Path) -> None:
        self.path = Path(run) / "metrics.jsonl"

    def records(self) -> list[dict[str, Any]]:
        """Every line, as a dict with an "epoch" or an "event", each checked against its schema. A torn last
        line (a crash mid-write) is dropped; any other line that is not such a record is damage, named in
        one line, and so is a log beyond LOG_BOUNDS, found as it is read (never read whole)."""
        return self._read()[0]

    def _read(self) -> tuple[list[dict[str, Any]], bool]:
        """The records, and whether the file is exactly them as `append` writes them (False where there is none)."""
        if not self.path.exists():
            return [], False
        records, exact, torn, steps = [], True, None, None
        for at, line in json_lines(self.path, LOG_BOUNDS, self.FIX):
            if torn is not None:  # a line that is not JSON, and not the last
                raise RunError(f"{self.path} line {torn} is damaged (not JSON): {self.FIX}")
            try:
                written = line.decode()
                record = json.loads(written) if written.strip() else None
            except UnicodeDecodeError:
                raise RunError(f"{self.path} is damaged (not text): {self.FIX}") from None
            except (json.JSONDecodeError, RecursionError):  # not JSON, or nested too deep to read
                torn, exact = at, False
                continue
            if record is None:  # a blank line
                exact = False
                continue
            steps = self._check(record, at, steps)
            records.append(record)
            exact = exact and written == json.dumps(record) + "\n"
        return records, exact

    def _check(self, record: Any, at: int, steps: tuple[int, int] | None) -> tuple[int, int] | None:
        """Check line `at` against its schema, and its step count against the steps an epoch of the first line
        that had one (`steps`: that line and its steps an epoch, returned for the lines after it: a run's
        batch is fixed, so are its steps an epoch)."""
        why = line_problem(record)
        if why is None and "step" in record and "event" not in record:
            first, each = steps or (at, record["step"] // record["epoch"])
            if record["step"] != record["epoch"] * each:
                why = f"its 'step' {record['step']} is not {record['epoch']} epochs of line {first}'s {each} steps"
            steps = first, each
        if why is not None:
            raise RunError(f"{self.path} line {at} is not an epoch or event record ({why}): {self.FIX}")
        return steps

    def epochs(self) -> list[dict[str, Any]]:
        """The epochs' lines in order, each epoch once from the first: a line lost or logged twice is damage."""
        return self._in_order([r for r in self.records() if "event" not in r])

    def _in_order(self, epochs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for expected, line in enumerate(epochs, 1):
            if line["epoch"] != expected:
                raise RunError(
                    f"{self.path} is damaged (epoch {line['epoch']} is logged where epoch {expected} belongs): remove "
                    "a line logged twice; a run whose epoch's line is lost must train again"
                )
        return epochs

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
        except OSError as error:  # a torn line is dropped by records() and put back by reconciled()
            reason = "no space left on the device holding it" if error.errno == errno.ENOSPC else error.strerror
            raise RunError(f"cannot write {self.path} ({reason or error}): free some space and --resume") from None

    def reconciled(self, epoch: int, lines: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
        """The log as it must end at `epoch`, the checkpoint's: later lines and any other line of that epoch
        dropped (the checkpoint's is what was computed), the checkpoint's `lines` (its events and its epoch's
        line) that a crash lost put back; and whether the file must be written so (`write`: also to make it
        the run's own file). Nothing is written: damage is refused first, the file read once."""
        own = [line for line in lines if "event" not in line]  # the checkpoint's own line of its epoch
        found, exact = self._read()
        records = [
            r
            for r in found
            if r.get("epoch", r.get("after_epoch", 0)) <= epoch
            and not (own and "event" not in r and r.get("epoch") == epoch and r not in own)
        ]
        records += [line for line in lines if line not in records]
        self._in_order([r for r in records if "event" not in r])
        return records, not exact or records != found or self.shared()

    def write(self, records: list[dict[str, Any]]) -> None:
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in records), then=" and --resume")

    def shared(self) -> bool:
        """Whether appending would write into another file too: a hard-linked copy of a run (`cp -al`);
        a resume then writes the log anew, as this run's own file (a link is refused: files.refuse_link)."""
        return self.path.stat().st_nlink > 1


def summary_of_the_run(epochs: list[dict[str, Any]], summary: dict[str, Any]) -> bool:
    """Whether `summary` (read_summary's) is what the run whose log holds `epochs` wrote when it finished: its
    metrics are those of the log's line for the epoch it says the run ended at."""
    line = {r["epoch"]: r for r in epochs}.get(summary["epochs_done"])
    return line is not None and all(summary.get(k) == v for k, v in line.items())


def checkpoint_lines(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The log lines a checkpoint holds: the events of its epoch and the epoch's line (a checkpoint of
    structinit < 0.3 holds the epoch's line only)."""
    if checkpoint.get("log") is not None:
        return list(checkpoint["log"])
    return [checkpoint["metrics"]] if checkpoint.get("metrics") else []
