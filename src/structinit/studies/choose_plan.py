"""A `choose` comparison's plan, kept as OUT/choose.json before anything trains: what it compares (the inits,
the seeds, the data and its fingerprint, the batch, the recipe's settings), the epochs its budget was sized to
and the pace it was sized from. Asked again with the same flags on the same data, the comparison goes on as
planned; asked otherwise, or on changed images, what differs is named and `--rerun` compares again from
scratch, so that a verdict never pools two comparisons nor reprints one made on other data."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import atomic_write_text, read_json_object, refuse_link
from ..schema import Field, Schema, check, integer, listing, mapping, number, shown, text
from ..training.device import usable_cores
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


def _seeds(value: Any) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) for v in value) and value == sorted(set(value))


def _fingerprint(value: Any) -> bool:
    return isinstance(value, str) and re.fullmatch(r"[0-9a-f]{16}", value) is not None


def _runs_named(plan: dict[str, Any]) -> str | None:
    """The inits are the structured init, the baselines and the control, each once (choose._plan's order)."""
    inits = plan["inits"]
    if len(set(inits)) != len(inits) or inits[0] != plan["structured"] or inits[-1] != plan["control"]:
        return f"its 'inits' {shown(inits)} are not its 'structured', the baselines and its 'control', each once"
    return None


def _threads_here(plan: dict[str, Any]) -> str | None:
    if plan["threads"] > usable_cores():
        return f"its 'threads' {plan['threads']} are more than the {usable_cores()} cores this process may use"
    return None


# each field of a plan, and what the fields derive of each other (the steps an epoch: check_same, from the data)
PLAN = Schema(
    {
        "inits": listing(text(what="an init label"), at_least=2, what="2+ labels"),
        "seeds": Field("2+ distinct seeds, sorted", lambda v: isinstance(v, list) and len(v) >= 2 and _seeds(v)),
        "epochs": integer(1),
        "minutes": Field("minutes > 0 or null", lambda v: v is None or (number(0).test(v) and v > 0)),
        "structured": text(what="an init label"),
        "control": text(what="an init label"),
        "per_class": integer(1, null=True),
        "val_per_class": integer(1),
        "batch_size": integer(1),
        "recipe": mapping(what="a mapping of settings"),
        "data": Field("a fingerprint of 16 hex digits", _fingerprint),
        "steps": integer(1),
        "pace": Field("three seconds", lambda v: isinstance(v, list) and len(v) == 3, items=number(0)),
        "model": text(),
        "threads": integer(1),
        "version": Field(f"{PLAN_VERSION}", lambda v: v == PLAN_VERSION),
    },
    rules=(_runs_named, _threads_here),
    closed=True,
    kind="plan",
)


def read_plan(out: Path) -> Plan | None:
    """The plan in `out` (None if it holds none), checked against its schema: RunError naming the file and the
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
    return Plan(**check(record, PLAN, str(path), RERUN))


def check_same(plan: Plan, asked: Plan, path: Path) -> None:
    """Refuse a plan that is not the comparison asked, naming every difference: the flags, the recipe's
    settings, the data's images, and the budget (--minutes or --epochs); and one whose steps an epoch are
    not those its data gives at its batch (`asked.steps`: training images // batch), which the verdict's
    evidence counts."""
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
    if plan.steps != asked.steps:
        raise RunError(
            f"{path} is damaged (its 'steps' {plan.steps} are not the {asked.steps} steps an epoch its data gives at "
            f"batch {plan.batch_size}): {RERUN}"
        )
