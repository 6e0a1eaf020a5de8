"""A `choose` comparison's plan, kept as OUT/choose.json before anything trains: what it compares (the inits,
the seeds, the data and its fingerprint, the batch, the recipe's settings), the epochs its budget was sized to
and the pace it was sized from. Asked again with the same flags on the same data, the comparison goes on as
planned; asked otherwise, or on changed images, what differs is named and `--rerun` compares again from
scratch, so that a verdict never pools two comparisons nor reprints one made on other data."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import atomic_write_text, read_json_object, refuse_link
from ..training.identity import NOT_RECIPE, identity
from ..training.setting import flag
from ..training.settings import TrainConfig

PLAN_FILE = "choose.json"
PLAN_VERSION = 2  # 0.4.0's plans (no version) recorded neither the data nor the pace
MAX_BYTES = 1 << 20  # a plan is about 2 KB
RERUN = "give --rerun to compare again from scratch (its runs are deleted), or another --out"
# what the plan records on its own (with its flag), and so leaves out of the recipe
OWN = ("init", "seed", "epochs", "warmup_epochs", "per_class", "val_per_class", "batch_size")


@dataclasses.dataclass(frozen=True)
class Plan:
    inits: list[str]
    seeds: list[int]  # sorted: the seeds are a set
    epochs: int
    minutes: float | None  # the budget the epochs were sized to (None: --epochs given)
    structured: str
    control: str
    per_class: int | None
    val_per_class: int
    batch_size: int
    recipe: dict[str, Any]  # the other settings that decide what a run computes (model, data, optimiser, ...)
    data: str  # the data's fingerprint (datasets.fingerprint): its images and labels
    steps: int  # steps an epoch
    pace: list[float]  # what it was sized from: seconds a run takes besides its epochs, an epoch, a checkpoint
    model: str  # what the comparison trains, in words: name, input, tokens, parameters
    threads: int  # torch threads a run (choose_pace.fastest_threads)
    version: int = PLAN_VERSION

    def asked(self) -> dict[str, Any]:
        """What the user's flags decide, by flag: equal on a resume."""
        return {
            "--structured": self.structured,
            "--seeds": ",".join(map(str, self.seeds)),
            "--per-class": self.per_class or "all",
            "--val-per-class": self.val_per_class,
            "--batch-size": self.batch_size,
        }

    def sized(self) -> str:
        return f"--minutes {self.minutes:g}" if self.minutes is not None else f"--epochs {self.epochs}"


def recipe_of(base: TrainConfig) -> dict[str, Any]:
    """The settings of `base` that decide what its runs compute, less those the plan records on its own,
    as JSON gives them back."""
    settings = {k: v for k, v in identity(dataclasses.asdict(base)).items() if k not in (*NOT_RECIPE, *OWN)}
    return json.loads(json.dumps(settings, default=str))


def write_plan(out: Path, plan: Plan) -> None:
    out.mkdir(parents=True, exist_ok=True)
    refuse_link(out / PLAN_FILE)
    atomic_write_text(out / PLAN_FILE, json.dumps(dataclasses.asdict(plan), indent=1) + "\n")


def _numbers(value: Any, kind: type, count: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and (count is None or len(value) == count)
        and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)
        and all(math.isfinite(v) and v >= 0 for v in value)
    )


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# each field of a plan: what it must be, in the words a message uses
FIELDS = {
    "inits": (lambda v: isinstance(v, list) and len(v) >= 2 and all(isinstance(i, str) for i in v), "2+ labels"),
    "seeds": (lambda v: _numbers(v, int) and len(v) >= 2 and v == sorted(set(v)), "2+ distinct seeds, sorted"),
    "epochs": (_positive, "an integer >= 1"),
    "minutes": (lambda v: v is None or (isinstance(v, (int, float)) and 0 < v < math.inf), "minutes > 0 or null"),
    "structured": (lambda v: isinstance(v, str), "an init label"),
    "control": (lambda v: isinstance(v, str), "an init label"),
    "per_class": (lambda v: v is None or _positive(v), "an integer >= 1 or null"),
    "val_per_class": (_positive, "an integer >= 1"),
    "batch_size": (_positive, "an integer >= 1"),
    "recipe": (lambda v: isinstance(v, dict), "a mapping of settings"),
    "data": (lambda v: isinstance(v, str) and len(v) == 16, "a fingerprint of 16 hex digits"),
    "steps": (_positive, "an integer >= 1"),
    "pace": (lambda v: _numbers(v, (int, float), 3), "three seconds >= 0"),
    "model": (lambda v: isinstance(v, str), "text"),
    "threads": (_positive, "an integer >= 1"),
    "version": (lambda v: v == PLAN_VERSION, f"{PLAN_VERSION}"),
}


def read_plan(out: Path) -> Plan | None:
    """The plan in `out` (None if it holds none), checked field by field: RunError naming the file and the
    first bad field; RunError too where `out` holds runs and no plan (another grid's)."""
    path = out / PLAN_FILE
    if not path.exists() and not path.is_symlink():
        runs = sorted(out.glob("*/*/config.yaml")) if out.is_dir() else []
        if runs:
            raise RunError(
                f"--out {out} holds runs of another grid ({runs[0].parent}) and no {PLAN_FILE}: give another --out"
            )
        return None
    record = read_json_object(path, RERUN, MAX_BYTES)
    if "version" not in record:
        raise RunError(f"{path} was planned by structinit 0.4.0, which did not record the data it compared on: {RERUN}")
    unknown = sorted(set(record) - set(FIELDS))
    if unknown:
        raise RunError(f"{path} is damaged (it holds {unknown[0]!r}, which no plan has): {RERUN}")
    for name, (good, what) in FIELDS.items():
        if name not in record:
            raise RunError(f"{path} is damaged (its {name!r} is missing): {RERUN}")
        if not good(record[name]):
            shown = json.dumps(record[name])
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise RunError(f"{path} is damaged (its {name!r} is {shown}, not {what}): {RERUN}")
    return Plan(**record)


def check_same(plan: Plan, asked: Plan, path: Path) -> None:
    """Refuse a plan that is not the comparison asked, naming every difference: the flags, the recipe's
    settings, the data's images, and the budget (--minutes or --epochs)."""
    differ = [f"{k} {v} (now {asked.asked()[k]})" for k, v in plan.asked().items() if asked.asked()[k] != v]
    names = sorted(plan.recipe.keys() | asked.recipe.keys())
    differ += [
        f"{flag(k)} {plan.recipe.get(k)!r} (now {asked.recipe.get(k)!r})"
        for k in names
        if plan.recipe.get(k) != asked.recipe.get(k)
    ]
    if plan.sized() != asked.sized():
        differ.append(f"{plan.sized()}, {plan.epochs} epochs a run (now {asked.sized()})")
    if differ:
        raise RunError(f"--out {path.parent} holds another comparison, made with {', '.join(differ)}: {RERUN}")
    if plan.data != asked.data:
        raise RunError(
            f"the data changed since the comparison in {path.parent} was planned (images added, removed or "
            f"replaced): its runs trained on other images; {RERUN}"
        )
