"""What a grid refuses before it trains: a directory that is not a grid's, a link on the way to a run, and a
run directory made with another recipe or finished on data that has changed since (`rerun`: trained again
instead, its files set aside until the new run has checkpointed); and before it tabulates, a run of other data."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import first_line
from ..files import read_json_object, refuse_link
from ..inits.labels import KERNEL_SIZE
from ..schema import Field, Schema, check, integer, mapping, text
from ..training.config_file import read_config
from ..training.identity import identity
from ..training.lock import RunLock
from ..training.ownership import clear_run, owned_files, replaced_aside, written_by_a_run
from ..training.record import MetricsLog, RunError
from ..training.setting import flag
from ..training.settings import TrainConfig
from .results import REPORT_FIX

RESULT_FILES = ("results.csv", "results.md", "curves.png", "summary.png")


def _option_value(value: Any) -> bool:
    """A value an options class records (inits/options.py): text, a finite number, a flag, None, or names."""
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    return value is None or isinstance(value, (str, int)) or (isinstance(value, float) and math.isfinite(value))


def _options_its_method_takes(report: dict[str, Any]) -> str | None:
    """Each recorded option of a type its method takes, in the options class `registry.options_then_and_now`
    reads it by (the smallest holding every recorded name). A value out of today's range or choices is not
    damage: an older structinit took it, and the grid names it as the init's change."""
    from ..inits.registry import option_classes

    method, recorded = report["method"], report.get("options", {})
    names = set(recorded) - {KERNEL_SIZE}
    holding = [cls for cls in option_classes(method) if names <= {f.name for f in dataclasses.fields(cls)}]
    if not holding:
        return None  # options of no class of the method: the grid finds no change of them
    taken = min(holding, key=lambda cls: len(dataclasses.fields(cls)))
    for name in sorted(names):
        try:
            taken.build(method, {name: recorded[name]})
        except TypeError as error:
            return f"its 'options.{name}' is not of the option's type: {first_line(error)}"
        except ValueError:  # out of today's range or choices (or beside another option's default)
            continue
    return None


# what a grid reads of a run's init report (Report.to_dict): its method and the options it resolved to
RECORDED_OPTIONS = Schema(
    {
        "method": text(what="an init method"),
        "options": mapping(
            Schema(
                {KERNEL_SIZE: integer(1, optional=True)},
                patterns={r".+": Field("text, a finite number, true, false, null or a list of text", _option_value)},
            ),
            optional=True,
            what="a mapping of options",
        ),
    },
    rules=(_options_its_method_takes,),
)


def check_grid_directory(out: Path) -> None:
    """Refuse a run's directory (the grid would write its runs and tables into it), files of the
    results' names in a directory that holds no grid, and a link where the grid writes them (or its
    jobs/): it would write outside the grid."""
    if out.exists() and not out.is_dir():
        raise RunError(f"--out {out} is a file: give a directory for the grid")
    held = [name for name in ("config.yaml", "last.pt", "metrics.jsonl") if (out / name).exists()]
    if held:
        raise RunError(
            f"--out {out} is a run's directory (it holds {', '.join(held)}): give the grid a directory of its own, "
            f"e.g. --out {out.with_name(out.name + '-grid')}"
        )
    for name in (*RESULT_FILES, "jobs"):
        refuse_link(out / name)
    present = [name for name in RESULT_FILES if (out / name).exists()]
    if present and not any(written_by_a_run(p) for p in out.glob("*/*/config.yaml")):
        raise RunError(
            f"{out} holds {', '.join(present)} but no grid's runs: use another --out (the files stay as they are)"
        )


def refuse_links_to(run: Path, root: Path | None) -> None:
    """Refuse a link on the way from the grid's directory to a run of it (its setting's folder, its own):
    the run would be written outside the grid."""
    if root is not None:
        below = len(run.relative_to(root).parts)  # the run's folder and those between it and the grid's
        for folder in [run, *run.parents][:below]:
            refuse_link(folder)


def check_same_recipe(config: TrainConfig, rerun: bool) -> bool:
    """Refuse a run directory whose run computes something else; with `rerun`, True: it is to be trained again."""
    path = Path(config.out) / "config.yaml"
    if not path.exists():
        return False
    if not written_by_a_run(path):  # a moved grid's runs are taken; only their own files may be deleted
        raise RunError(f"{path} was not written by a run: use another --out (it stays as it is)")
    moved = not written_by_a_run(path, Path(config.out))
    if moved and not any((Path(config.out) / name).exists() for name in ("last.pt", "summary.json")):
        raise RunError(
            f"{config.out} holds the start of a run of another directory (moved or copied here) and no checkpoint "
            "to go on from: delete that folder to train the run here (structinit deletes only its own files)"
        )
    saved = identity(dataclasses.asdict(read_config(path)))
    asked = identity(dataclasses.asdict(config))
    listed = ", ".join(f"{flag(k)} {saved.get(k)!r} (now {asked[k]!r})" for k in asked if saved.get(k) != asked[k])
    if not listed:
        listed = _changed_init_options(config)
    resumes = MetricsLog(Path(config.out)).training_changes() if not listed else []
    if resumes:
        listed = "resumes that changed " + ", ".join(resumes)
    if listed and not rerun:
        raise RunError(f"{config.out} was made with {listed}: use another --out, or --rerun to train it again")
    return bool(listed)


def check_same_data(config: TrainConfig, rerun: bool, fingerprints: dict[str, str]) -> bool:
    """Refuse a finished run whose checkpoint records other data than its config loads now (images added,
    removed or replaced since): its result would be reused as if it were of this data; with `rerun`, True: it
    is to be trained again. `fingerprints`: the data's fingerprint by its settings, loaded once for all runs."""
    if not _other_data(config, fingerprints):
        return False
    if rerun:
        return True
    raise RunError(
        f"{config.out} trained on other data: the images of {config.data} changed since it finished (added, removed "
        "or replaced): use another --out, or --rerun to train it again"
    )


def check_tabulated_data(out: Path) -> None:
    """Refuse to tabulate the grid in `out` where a finished run of it trained on other data than its settings
    load now (images replaced while the grid ran, or since): a table would set runs of two data sets side by side.
    Refused, not trained again here: the runs of the data as it is now are sound, and which images are meant is the
    user's to say (--rerun trains the others again on the images as they are)."""
    fingerprints: dict[str, str] = {}
    stale = []
    for summary in sorted(out.glob("*/*/summary.json")):
        if not written_by_a_run(summary.parent / "config.yaml"):  # collect names it; a moved grid's run is read
            continue
        config = dataclasses.replace(read_config(summary.parent / "config.yaml"), out=str(summary.parent))
        if _other_data(config, fingerprints):
            stale.append(config)
    if stale:
        names = [str(Path(c.out).relative_to(out)) for c in stale]
        raise RunError(
            f"{', '.join(names[:4])}{f' and {len(names) - 4} more' if len(names) > 4 else ''} of {out} trained on "
            f"other data than {stale[0].data} holds now (images added, removed or replaced while the grid ran, or "
            "since): no table sets two data sets side by side; compare --rerun, with their --inits and --seeds, "
            "trains them again on the images as they are"
        )


def _other_data(config: TrainConfig, fingerprints: dict[str, str]) -> bool:
    """Whether the finished run of `config` recorded other data than its config loads now."""
    out = Path(config.out)
    if not (out / "summary.json").exists() or not (out / "last.pt").exists():
        return False  # an unfinished run: its resume checks its data (Run.restore)
    from ..data.datasets import fingerprint
    from ..training.checkpoint import load_checkpoint
    from ..training.data_settings import DataSettings
    from ..training.recipe import data_of

    key = repr([getattr(config, f.name) for f in dataclasses.fields(DataSettings)])
    if key not in fingerprints:
        fingerprints[key] = fingerprint(data_of(config))
    return load_checkpoint(out / "last.pt", mmap=True).get("data") not in (None, fingerprints[key])


def own_files_of(runs: list[Path], root: Path | None = None) -> list[list[Path]]:
    """The own files (ownership.owned_files) of each of `runs` that is a folder, for `replaced_aside`: refused,
    before anything is moved, where a link is on the way from `root` to a run, a run is in use (its lock held),
    records another directory or holds files a run writes that it does not account for."""
    groups = []
    for run in runs:
        refuse_links_to(run, root)
        if run.is_dir():
            with RunLock(run):
                groups.append(owned_files(run))
    return groups


@contextlib.contextmanager
def replacing(runs: list[Path], root: Path | None) -> Iterator[None]:
    """Train the block's new runs in place of `runs`, whose own files (owned_files, each checked first under its
    lock: refused while a process trains it) are set aside in `root` (ownership.replaced_aside): a run is replaced
    once its new run has checkpointed; where the block fails, one whose new run had not is put back as it was
    (what that start wrote cleared first)."""
    if not runs:
        yield
        return
    with replaced_aside(root or Path(os.path.commonpath([run.parent for run in runs])), own_files_of(runs, root)):
        try:
            yield
        except BaseException:
            for run in runs:
                if (run / "config.yaml").exists() and not (run / "last.pt").exists():
                    with contextlib.suppress(RunError), RunLock(run):  # a run still in use keeps its place
                        clear_run(run)
            raise


def _changed_init_options(config: TrainConfig) -> str:
    """The init options a run recorded that its label no longer resolves to (a default changed since),
    as 'init X with name=old (now new), ...'; empty when they agree or the run recorded none."""
    from ..inits.registry import options_then_and_now

    report = Path(config.out) / "init_report.json"
    spec = config.init_spec
    if spec.is_default or not report.exists():
        return ""
    recorded = check(read_json_object(report, REPORT_FIX), RECORDED_OPTIONS, str(report), REPORT_FIX).get("options", {})
    given = {**spec.options, **({"teacher": config.teacher} if spec.method == "select" and config.teacher else {})}
    then, now = options_then_and_now(spec.method, given, recorded) or ({}, {})
    differ = [f"{k}={then[k]!r} (now {v!r})" for k, v in now.items() if then[k] != v]
    return f"init {config.init!r} with {', '.join(differ)}" if differ else ""
