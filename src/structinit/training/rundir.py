"""One run directory: who may write it (a lock), what it is (its resolved config and a hash of it),
what may change when it resumes, and its metrics log, which never holds an epoch twice or loses one.

    RUN/config.yaml     the resolved config (rewritten when a resume changes a setting)
    RUN/metrics.jsonl   one line per finished epoch, appended after its checkpoint is durable;
                        {"event": "resume", ...} lines record what a resume changed
    RUN/last.pt         the last good checkpoint (checkpoint.py); RUN/prev.pt the one before
    RUN/summary.json    written when the run finishes
    RUN/init_report.json what the init did (written when the run starts)
    RUN/snapshots/      weights kept at --snapshot-epochs
    RUN/.lock           held by the process training the run (removed when it is done)

These names are the tool's own: it deletes them (and its temporary files, `.NAME.tmpPID`) only where
it can prove they are its unfinished work, and never anything else in the directory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import RunError
from ..files import atomic_write_text, remove_temporaries
from .provenance import ENVIRONMENT

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


# what a run writes (besides snapshots/ and tensorboard/), and the files that hold its results
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "last.pt", "prev.pt", "init_report.json", "wandb_id")
RESULTS = ("last.pt", "prev.pt", "summary.json", "metrics.jsonl")
SNAPSHOT = re.compile(r"^epoch_\d{4}\.pt$")
TENSORBOARD = re.compile(r"^events\.out\.tfevents\.")


class RunLock:
    """An exclusive lock on a directory (an flock on DIR/.lock, released when the process ends, even
    by kill -9): a second process training the same run, or the same grid, is refused at once. The
    holder removes DIR/.lock when it is done, so that a run leaves no file it does not need."""

    def __init__(self, folder: Path, what: str = "run") -> None:
        self.folder, self.what, self.file = Path(folder), what, None

    def __enter__(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the lock is advisory anyway
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / ".lock"
        while self.file is None:
            file = open(path, "a+")
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                fix = "wait for it to finish or use another --out"
                raise RunError(f"{self.folder} is in use by {holder}: {fix}") from None
            if _same_file(file, path) and os.fstat(file.fileno()).st_nlink == 1:
                self.file = file
            elif _same_file(file, path):  # held, and shared with a hard-linked copy: this directory gets its own
                path.unlink()
                file.close()
            else:  # locked a file its holder removed on leaving: lock the one there now
                file.close()
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} ({self.what})")
        self.file.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            (self.folder / ".lock").unlink(missing_ok=True)  # still held: no one else holds this file
            self.file.close()
            self.file = None


def _same_file(file: Any, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False


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
    return {k: v for k, v in changed.items() if k in ("epochs", "lr", "eval_every", "snapshot_epochs", "log")}


# settings whose change in a resume changes what the run trains (its schedule, its learning rate)
TRAINING = ("epochs", "lr")


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
        try:
            lines = self.path.read_text().splitlines()
        except UnicodeDecodeError:
            raise RunError(f"{self.path} is damaged (not text): {self.FIX}") from None
        records = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    continue
                raise RunError(f"{self.path} line {number} is damaged (not JSON): {self.FIX}") from None
            if not _is_record(record):
                raise RunError(f"{self.path} line {number} is not an epoch or event record: {self.FIX}")
            records.append(record)
        return records

    def epochs(self) -> list[dict[str, Any]]:
        return [r for r in self.records() if "event" not in r]

    def training_changes(self) -> list[str]:
        """What resumes changed of how the run trains (TRAINING), as '--lr 0.001 -> 0.5 after epoch 3':
        a run trained partly otherwise than its config.yaml says now."""
        return [
            f"{flag(k)} {old!r} -> {new!r} after epoch {r.get('after_epoch')}"
            for r in self.records()
            if r.get("event") == "resume"
            for k, (old, new) in r.get("changed", {}).items()
            if k in TRAINING
        ]

    def append(self, *records: dict[str, Any]) -> None:
        text = "".join(json.dumps(r) + "\n" for r in records)
        try:
            with open(self.path, "a") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        except OSError as error:  # a torn line is dropped by records() and put back by reconcile()
            reason = "no space left on the device holding it" if error.errno == errno.ENOSPC else error.strerror
            raise RunError(f"cannot write {self.path} ({reason or error}): free some space and --resume") from None

    def reconcile(self, epoch: int, lines: list[dict[str, Any]]) -> None:
        """Make the log end at `epoch`, the checkpoint's: drop later lines, put back the checkpoint's
        `lines` (its events and its epoch's line) that a crash lost; and make it the run's own file."""
        records = [r for r in self.records() if r.get("epoch", r.get("after_epoch", 0)) <= epoch]
        records += [line for line in lines if line not in records]
        text = "".join(json.dumps(r) + "\n" for r in records)
        if not self.path.exists() or self.shared() or self.path.read_text() != text:
            atomic_write_text(self.path, text, then=" and --resume")

    def shared(self) -> bool:
        """Whether appending would write into another file too: a link, or a hard-linked copy of a
        run (`cp -al`); reconcile then writes the log anew, as this run's own file."""
        return self.path.is_symlink() or self.path.stat().st_nlink > 1


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


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        twice = sorted({str(k) for k in keys if keys.count(k) > 1})
        if twice:
            raise yaml.constructor.ConstructorError(None, None, f"{', '.join(twice)} given twice", node.start_mark)
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Settings from YAML text: safe (no Python objects) and with every key once."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no Python objects


def written_by_a_run(path: Path, out: Path | None = None) -> bool:
    """A config.yaml that a run wrote: a mapping with the run's environment record (which it writes
    last) and, with `out`, the run of that directory (a copied one records another)."""
    try:
        values = load_yaml(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError, OSError):
        return False
    if not isinstance(values, dict) or not isinstance(values.get(ENVIRONMENT), dict):
        return False
    return out is None or _same_place(values.get("out"), out)


def _same_place(recorded: Any, out: Path) -> bool:
    if not isinstance(recorded, str):
        return False
    if Path(recorded).exists() and out.exists():
        return os.path.samefile(recorded, out)
    return os.path.abspath(recorded) == os.path.abspath(out)


def check_fresh(out: Path) -> None:
    """Before a fresh run writes into `out`: refuse a directory holding a run's results, or files a run
    writes that no run of this directory wrote. A run of this directory that stopped before its first
    checkpoint left only its unfinished work (config, init report, snapshot at init), which is cleared."""
    held = [name for name in RESULTS if (out / name).exists() and (out / name).stat().st_size]
    if "last.pt" in held:
        raise RunError(f"{out} already holds a run: use --resume to continue it or another --out")
    if held:
        raise RunError(
            f"{out} holds a run's results ({', '.join(held)}) and no checkpoint to continue from: "
            "use another --out (structinit never overwrites results)"
        )
    config = out / "config.yaml"
    if config.exists() and not written_by_a_run(config, out):
        raise RunError(f"{config} was not written by a run of this directory: use another --out (it stays as it is)")
    clear_run(out)


def clear_run(out: Path) -> list[Path]:
    """Delete what the run of `out` wrote (its files, the snapshots and TensorBoard events its record
    says it kept, temporary files) and nothing else; returns what it deleted. Call it holding the run's
    lock, once its config.yaml proves the run is of this directory (`written_by_a_run`). Deletes
    nothing, and raises RunError, where files a run writes are there that its record does not account
    for: a fresh run there would take them for its own."""
    config = out / "config.yaml"
    if written_by_a_run(config) and not written_by_a_run(config, out):
        raise RunError(
            f"{config} records a run of another directory (moved or copied here): its files are not "
            "deleted; train it again into a new --out"
        )
    owned = run_files(out)
    foreign = [str(p.relative_to(out)) for p in _named_like_run_files(out) if p not in owned]
    if foreign:
        raise RunError(
            f"{out} holds {', '.join(foreign[:3])}, which a run writes and no unfinished run of this directory "
            "did: use another --out (the files stay as they are)"
        )
    for path in owned:
        path.unlink()
    removed = owned + clear_temporaries(out)
    for folder in (out / "snapshots", out / "tensorboard"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed


def run_files(out: Path) -> list[Path]:
    """The files in `out` its run wrote, by its record (config.yaml, and the settings its resumes
    changed): RUN_FILES, snapshots at the epochs it kept, TensorBoard events if it logged there;
    none without a config.yaml of a run of this directory."""
    if not written_by_a_run(out / "config.yaml", out):
        return []  # no record of a run of this directory: nothing here is its
    settings = [load_yaml((out / "config.yaml").read_text())]
    try:
        events = [r for r in MetricsLog(out).records() if r.get("event") == "resume"]
    except RunError:  # a damaged log accounts for nothing more
        events = []
    settings += [{k: v[0] for k, v in e.get("changed", {}).items()} for e in events]
    epochs = {e for s in settings for e in s.get("snapshot_epochs") or [] if isinstance(e, int)}
    loggers = {name for s in settings for name in s.get("log") or []}
    names = [name for name in RUN_FILES if name != "wandb_id" or "wandb" in loggers]
    found = [out / name for name in names] + [snapshot_path(out, epoch) for epoch in sorted(epochs)]
    if "tensorboard" in loggers and (out / "tensorboard").is_dir():
        found += [p for p in sorted((out / "tensorboard").iterdir()) if TENSORBOARD.match(p.name)]
    return [p for p in found if p.is_file()]


def _named_like_run_files(out: Path) -> list[Path]:
    """The files in `out` with the names a run writes (RUN_FILES, snapshots, TensorBoard events)."""
    found = [out / name for name in RUN_FILES if (out / name).is_file()]
    for folder, pattern in ((out / "snapshots", SNAPSHOT), (out / "tensorboard", TENSORBOARD)):
        if folder.is_dir():
            found += [p for p in sorted(folder.iterdir()) if pattern.match(p.name) and p.is_file()]
    return found


def snapshot_path(out: Path, epoch: int) -> Path:
    return out / "snapshots" / f"epoch_{epoch:04d}.pt"


def clear_temporaries(out: Path) -> list[Path]:
    """Delete the temporary files that interrupted writes of the run in `out` left (hold its lock)."""
    return remove_temporaries(out, RUN_FILES) + remove_temporaries(out / "snapshots", lambda n: bool(SNAPSHOT.match(n)))


def summary_of_the_run(out: Path, summary: dict[str, Any]) -> bool:
    """Whether `summary` is what the run of `out` wrote when it finished: its metrics are those its log
    holds for the epoch it says the run ended at."""
    done = summary.get("epochs_done")
    line = {r["epoch"]: r for r in MetricsLog(out).epochs()}.get(done) if isinstance(done, int) else None
    return line is not None and all(summary.get(k) == v for k, v in line.items())


def checkpoint_lines(checkpoint: dict[str, Any]) -> list[dict[str, Any]]:
    """The log lines a checkpoint holds: the events of its epoch and the epoch's line (a checkpoint of
    structinit < 0.3 holds the epoch's line only)."""
    if checkpoint.get("log") is not None:
        return list(checkpoint["log"])
    return [checkpoint["metrics"]] if checkpoint.get("metrics") else []


def read_record(path: Path, fix: str) -> dict[str, Any]:
    """A JSON object the tool wrote (summary.json, init_report.json); one line naming the file and `fix`
    if it is damaged."""
    try:
        value = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RunError(f"{path} is damaged ({error}): {fix}") from None
    if not isinstance(value, dict):
        raise RunError(f"{path} is damaged (not a JSON object): {fix}")
    return value
