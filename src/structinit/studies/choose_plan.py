"""A `choose` comparison's plan, kept as OUT/choose.json before anything trains: the inits, seeds, data sizes
and batch, the epochs its budget was sized to once, and the recipe's hash. Asked again with the same flags,
the comparison resumes as planned (the epochs are not re-timed); asked with others, it is refused up front,
so that a verdict never pools two comparisons."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import atomic_write_text, read_json_object, refuse_link
from ..training.identity import NOT_RECIPE, config_hash
from ..training.settings import TrainConfig

PLAN_FILE = "choose.json"
FIX = "delete it, or give another --out"
# what the plan records on its own (with its flag), and so leaves out of the recipe's hash
OWN = ("init", "seed", "epochs", "warmup_epochs", "per_class", "val_per_class", "batch_size")


@dataclasses.dataclass(frozen=True)
class Plan:
    inits: list[str]
    seeds: list[int]
    epochs: int
    minutes: float | None  # the budget the epochs were sized to (None: --epochs given)
    structured: str
    control: str
    per_class: int | None
    val_per_class: int
    batch_size: int
    recipe: str

    def asked(self) -> dict[str, Any]:
        """What the user's flags decide, by flag: equal on a resume."""
        return {
            "--structured": self.structured,
            "--seeds": ",".join(map(str, self.seeds)),
            "--per-class": self.per_class or "all",
            "--val-per-class": self.val_per_class,
            "--batch-size": self.batch_size,
            "the recipe (model, data, other flags)": self.recipe,
        }


def recipe_of(base: TrainConfig) -> str:
    return config_hash(dataclasses.asdict(base), leave_out=(*NOT_RECIPE, *OWN))


def plan_of(
    base: TrainConfig,
    inits: list[str],
    seeds: list[int],
    epochs: int,
    minutes: float | None,
    structured: str,
    control: str,
) -> Plan:
    return Plan(
        list(inits),
        list(seeds),
        epochs,
        minutes,
        structured,
        control,
        base.per_class,
        base.val_per_class,
        base.batch_size,
        recipe_of(base),
    )


def write_plan(out: Path, plan: Plan) -> None:
    out.mkdir(parents=True, exist_ok=True)
    refuse_link(out / PLAN_FILE)
    atomic_write_text(out / PLAN_FILE, json.dumps(dataclasses.asdict(plan), indent=1) + "\n")


def read_plan(out: Path, base: TrainConfig, structured: str, seeds: list[int], epochs: int | None) -> Plan | None:
    """The plan of the comparison in `out` if it is the one asked (None if `out` holds none); RunError if
    `out` holds another comparison, or runs that no comparison planned."""
    path = out / PLAN_FILE
    if not path.exists():
        runs = sorted(out.glob("*/*/config.yaml")) if out.is_dir() else []
        if runs:
            raise RunError(
                f"--out {out} holds runs of another grid ({runs[0].parent}) and no {PLAN_FILE}: give another --out"
            )
        return None
    record = read_json_object(path, FIX)
    try:
        plan = Plan(**record)
        if not (isinstance(plan.inits, list) and isinstance(plan.seeds, list) and isinstance(plan.epochs, int)):
            raise TypeError("inits, seeds or epochs of the wrong type")
    except TypeError as error:
        raise RunError(f"{path} is damaged ({error}): {FIX}") from None
    asked = plan_of(base, plan.inits, seeds, epochs or plan.epochs, plan.minutes, structured, plan.control)
    differ = [f"{k} {v} (now {asked.asked()[k]})" for k, v in plan.asked().items() if asked.asked()[k] != v]
    if epochs is not None and epochs != plan.epochs:
        differ.append(f"--epochs {plan.epochs} (now {epochs})")
    if differ:
        raise RunError(
            f"--out {out} holds another comparison, made with {', '.join(differ)}: give another --out, or the same "
            "flags to resume it"
        )
    return plan
