"""Which files in a directory are its run's own: what a run writes, and what may be deleted of it.

    RUN/config.yaml     the resolved config (rewritten when a resume changes a setting)
    RUN/metrics.jsonl   one line per finished epoch, appended after its checkpoint is durable;
                        {"event": "resume", ...} lines record what a resume changed
    RUN/last.pt         the last good checkpoint (checkpoint.py); RUN/prev.pt the one before
    RUN/summary.json    written when the run finishes
    RUN/init_report.json what the init did (written when the run starts)
    RUN/snapshots/      weights kept at --snapshot-epochs
    RUN/.lock           held by the process training the run (removed when it is done)

These names are the tool's own: it deletes them (and its temporary files, `.NAME.tmpPID`) only where
it can prove they are its unfinished work, and never anything else in the directory. A link at any of
them is refused (`refuse_links`): the run would write through it, outside its directory.

What a command replaces (`--rerun`) is deleted only once its replacement is accepted: set aside in the
command's directory first (`replaced_aside`: DIR/.replaced-XXXX/), put back on a refusal.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import refuse_link, remove_empty_folders, remove_temporaries
from ..schema import Schema, check, integer, listing, text
from .provenance import ENVIRONMENT
from .record import MetricsLog
from .settings_yaml import SettingsError, load_yaml, read_settings_text

# what a run writes (besides snapshots/ and tensorboard/), and the files that hold its results
RUN_FILES = ("config.yaml", "metrics.jsonl", "summary.json", "last.pt", "prev.pt", "init_report.json", "wandb_id")
RESULTS = ("last.pt", "prev.pt", "summary.json", "metrics.jsonl")
SNAPSHOT = re.compile(r"^epoch_\d{4}\.pt$")
TENSORBOARD = re.compile(r"^events\.out\.tfevents\.")
# what run_files reads of config.yaml: the epochs the run kept weights after (0: at init), the loggers it wrote through
FILES_RECORD = Schema(
    {
        "snapshot_epochs": listing(integer(0), optional=True, what="a list of epochs"),
        "log": listing(text(what="a logger's name"), optional=True, what="a list of loggers"),
    }
)
CONFIG_FIX = "restore it, or give another --out (the files stay as they are)"


def written_by_a_run(path: Path, out: Path | None = None) -> bool:
    """A config.yaml that a run wrote: a mapping with the run's environment record (which it writes
    last) and, with `out`, the run of that directory (a copied one records another)."""
    if not path.is_file():  # a FIFO or a device is none (and reading it would hang)
        return False
    try:
        values = load_yaml(read_settings_text(path))
    except (SettingsError, OSError):
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
        raise RunError(f"{out} already holds a run: {resume_hint(out)}; or give another --out")
    if held:
        raise RunError(
            f"{out} holds a run's results ({', '.join(held)}) and no checkpoint to continue from: "
            "use another --out (structinit never overwrites results)"
        )
    config = out / "config.yaml"
    if config.exists() and not written_by_a_run(config, out):
        raise RunError(f"{config} was not written by a run of this directory: use another --out (it stays as it is)")
    clear_run(out)


def resume_hint(out: Path) -> str:
    """What --resume does with the run in `out` (which has a checkpoint)."""
    try:
        count = len(MetricsLog(out).epochs())
        done = f"{count} epoch{'s' if count != 1 else ''}"
    except RunError:  # a damaged log: the resume names it
        done = "its epochs"
    if (out / "summary.json").exists():
        return (
            f"it is finished ({done}): --resume --epochs N, with N above its epochs, trains it further "
            "(--resume alone prints its summary)"
        )
    return f"--resume continues it from its last checkpoint ({done} logged)"


def clear_run(out: Path) -> list[Path]:
    """Delete what the run of `out` wrote (owned_files, temporary files) and nothing else; returns what it
    deleted, or raises owned_files' RunError having deleted nothing. Call it holding the run's lock, once its
    config.yaml proves the run is of this directory (`written_by_a_run`)."""
    owned = owned_files(out)
    for path in owned:
        path.unlink()
    removed = owned + clear_temporaries(out)
    for folder in (out / "snapshots", out / "tensorboard"):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return removed


def owned_files(out: Path) -> list[Path]:
    """The files of `out` its run wrote (run_files), checked before anything is deleted or set aside: RunError
    where the record names another directory (a moved or copied run), or where files a run writes are there that
    the record does not account for (a fresh run there would take them for its own)."""
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
    return owned


def run_files(out: Path) -> list[Path]:
    """The files in `out` its run wrote, by its record (config.yaml, and the settings its resumes
    changed): RUN_FILES, snapshots at the epochs it kept, TensorBoard events if it logged there;
    none without a config.yaml of a run of this directory. RunError where what it reads of config.yaml
    is not what a run writes (FILES_RECORD), before anything is deleted."""
    config = out / "config.yaml"
    if not written_by_a_run(config, out):
        return []  # no record of a run of this directory: nothing here is its
    settings = [check(load_yaml(read_settings_text(config)), FILES_RECORD, str(config), CONFIG_FIX)]
    try:
        events = [r for r in MetricsLog(out).records() if r.get("event") == "resume"]
    except RunError:  # a damaged log accounts for nothing more
        events = []
    settings += [{k: v[0] for k, v in e.get("changed", {}).items()} for e in events]
    epochs = {e for s in settings for e in s.get("snapshot_epochs", [])}  # a resume's checked as a setting's
    loggers = {name for s in settings for name in s.get("log", [])}
    names = [name for name in RUN_FILES if name != "wandb_id" or "wandb" in loggers]
    found = [out / name for name in names] + [snapshot_path(out, epoch) for epoch in sorted(epochs)]
    if "tensorboard" in loggers and (out / "tensorboard").is_dir():
        found += [p for p in sorted((out / "tensorboard").iterdir()) if TENSORBOARD.match(p.name)]
    return [p for p in found if p.is_file()]


def _named_like_run_files(out: Path) -> list[Path]:
    """The files in `out` with the names a run writes (RUN_FILES, snapshots, TensorBoard events)."""
    return [p for p in _run_names(out) if p.is_file()]


def _run_names(out: Path) -> list[Path]:
    """What is in `out`, links included, with the names of the files a run writes: RUN_FILES, and the
    snapshots and TensorBoard events in its folders."""
    found = [out / name for name in RUN_FILES if os.path.lexists(out / name)]
    for folder, pattern in ((out / "snapshots", SNAPSHOT), (out / "tensorboard", TENSORBOARD)):
        if folder.is_dir() and not folder.is_symlink():
            found += [p for p in sorted(folder.iterdir()) if pattern.match(p.name)]
    return found


def refuse_links(out: Path) -> None:
    """Refuse, in one line naming it, a link in `out` where a run writes (a file of its, its snapshots/,
    tensorboard/ or wandb/ folder): the run would write, replace or delete through it, outside its directory."""
    for path in [*_run_names(out), out / "snapshots", out / "tensorboard", out / "wandb"]:
        refuse_link(path)


def snapshot_path(out: Path, epoch: int) -> Path:
    return out / "snapshots" / f"epoch_{epoch:04d}.pt"


def clear_temporaries(out: Path) -> list[Path]:
    """Delete the temporary files that interrupted writes of the run in `out` left (hold its lock)."""
    return remove_temporaries(out, RUN_FILES) + remove_temporaries(out / "snapshots", lambda n: bool(SNAPSHOT.match(n)))


# DIR/.replaced-XXXX/N/...: group N of the files a command replaces, kept until the replacement is accepted
ASIDE = re.compile(r"^\.replaced-\w+?(?P<dropped>\.dropped)?$")


@contextlib.contextmanager
def replaced_aside(folder: Path, groups: Iterable[Iterable[Path]]):
    """Move each group of files under `folder` (a run's own files, say) into a new FOLDER/.replaced-XXXX/N/, run
    the block, then delete them and the folders they emptied: nothing is deleted before its replacement is accepted.
    Where the block raises (a refusal, Ctrl-C), each group goes back whole unless its replacement took a place of
    it (that group was replaced: it is dropped), so a refusal leaves every file as it was. Hold the folder's lock;
    what a killed holder left is put back by the next holder (`recover_aside`)."""
    folder, moved = Path(folder), []
    aside = Path(tempfile.mkdtemp(prefix=".replaced-", dir=folder))
    try:
        for index, group in enumerate(groups):
            for path in map(Path, group):
                target = aside / str(index) / path.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(path, target)  # the file itself, a link as a link
                moved.append(path)
        yield
    except BaseException:
        _put_back(folder, aside)
        raise
    dropped = aside.with_name(aside.name + ".dropped")
    os.rename(aside, dropped)  # accepted: a deletion cut short here is finished, never undone
    shutil.rmtree(dropped)
    for path in moved:
        remove_empty_folders([p for p in path.parents if folder in p.parents])


def recover_aside(folder: Path) -> list[Path]:
    """What a killed holder of `folder`'s lock left of `replaced_aside` (call it holding the lock, outside that
    block): a deletion begun is finished, and files set aside go back as after a refusal. Returns those put back."""
    restored: list[Path] = []
    for item in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        match = ASIDE.match(item.name)
        if not match or item.is_symlink() or not item.is_dir():
            continue
        if match["dropped"]:
            shutil.rmtree(item)
        else:
            restored += _put_back(Path(folder), item)
    return restored


def _put_back(folder: Path, aside: Path) -> list[Path]:
    """Each group set aside in `aside` back in `folder` where none of its places is taken; the rest dropped."""
    restored = []
    for group in sorted(aside.iterdir()) if aside.is_dir() else []:
        entries = [Path(base, name) for base, dirs, files in os.walk(group) for name in files + dirs]
        files = [p for p in entries if p.is_symlink() or not p.is_dir()]  # os.walk follows no link
        places = [folder / p.relative_to(group) for p in files]
        if all(_free(place, folder) for place in places):
            for path, place in zip(files, places):
                place.parent.mkdir(parents=True, exist_ok=True)
                os.rename(path, place)
            restored += places
    shutil.rmtree(aside, ignore_errors=True)
    return restored


def _free(place: Path, folder: Path) -> bool:
    """Nothing at `place`, and no link or file on its way from `folder`: a file put back there writes through none."""
    on_the_way = [p for p in place.parents if folder in p.parents]
    return not os.path.lexists(place) and not any(p.is_symlink() or p.is_file() for p in on_the_way)
