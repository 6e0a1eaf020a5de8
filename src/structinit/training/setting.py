"""One training setting: what the tool knows of it (Setting, declared with `setting(...)` in
TrainConfig), and how a value is checked against its declared type and bounds, named by its flag or,
for a settings file, by its key."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import quoted
from ..inits.labels import parse_assignments, split_top_level
from ..seeds import MAX_SEED

FLOAT32_MAX = 3.4028234663852886e38  # torch.finfo(torch.float32).max
# the sections of `train --help` and their titles, in order: the common flags first, on one screen
GROUPS = {
    "common": "common options",
    "data": "data",
    "model": "model and init",
    "optim": "optimiser and schedule (timm's factories)",
    "augment": "augmentation and regularisation",
    "run": "how the run goes and is recorded",
}


@dataclass(frozen=True)
class Setting:
    """What the tool knows of one setting. `bounds` is an interval such as "[0, 1)" or "(0, inf)".
    `resume`: "fixed" (another value is another run), "free" (how the run is watched or where it runs),
    "recorded" (a resume may change it, and the log says so) or "schedule" (recorded, and it changes
    what the run trains from then on). `identity`: whether it decides what the run computes; `recipe`:
    whether a grid's recipe hash includes it (not the grid's own axes). `flag`: a `train` flag, and
    `grid` a `compare` flag too; `parse` turns the flag's text into the value (`nargs`: argparse's, for a
    flag of several words, e.g. timm's `--mean R G B`: the list of their texts); `group`: its section
    of --help (GROUPS). `since`: the version that added it (runs recorded before did what its default
    does, so its default is no part of their identity or hash)."""

    help: str | None = None
    group: str = "run"
    flag: bool = True
    grid: bool = True
    aliases: tuple[str, ...] = ()
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    parse: Callable[[str, str], Any] | None = None
    nargs: int | str | None = None
    bounds: str | None = None
    resume: str = "fixed"
    identity: bool = True
    recipe: bool = True
    since: str | None = None


def setting(default: Any, **about: Any) -> Any:
    """A TrainConfig field with its Setting (a list or dict default is copied for every config)."""
    meta = {"setting": Setting(**about)}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


WATCHED = {"resume": "free", "identity": False}  # how a run is watched or where it runs
PLACE = {"identity": False}  # where files are, not what is computed
GRID_AXIS = {"recipe": False}  # a grid varies it, so it is no part of the grid's recipe
SEED_BOUNDS = f"[0, {MAX_SEED}]"  # numpy's seeds
NEW = {"since": "0.3.0"}  # added since runs were recorded: they did its default
NEW_060 = {"since": "0.6.0"}  # added in 0.6.0: runs recorded before did its default


# a setting's declared type -> (the Python types it takes, its name in messages)
SETTING_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "bool": ((bool,), "true or false"),
    "str": ((str,), "text"),
    "dict[str, Any]": ((dict,), "a mapping of keywords"),
    "list[int]": ((list, tuple), "a list of integers"),
    "list[float]": ((list, tuple), "a list of numbers"),
    "list[str]": ((list, tuple), "a list of names"),
}
# the type of a list's items, where it is checked
ITEM_TYPES = {"list[int]": (int,), "list[str]": (str,), "list[float]": (int, float)}
BOUNDS = re.compile(r"^([\[(])(-?[\d.e+]+), (-?[\d.e+]+|inf)([\])])$")


def check_value(name: str, declared: str, bounds: str | None, value: Any, shown: str | None = None) -> None:
    """A setting's value is of its declared type (None where the type allows it: a YAML file can hold
    'false' for a flag or 1.5 for a count, which would otherwise act as something else) and within
    its bounds. Messages name the setting as `shown` (default: its flag)."""
    shown = shown or flag(name)
    base, _, optional = declared.partition(" | ")
    if value is None and optional == "None":
        return
    kinds, what = SETTING_TYPES[base]
    items = ITEM_TYPES.get(base)
    if (
        (isinstance(value, bool) and bool not in kinds)
        or not isinstance(value, kinds)
        or (items and any(isinstance(i, bool) or not isinstance(i, items) for i in value))
    ):
        raise ValueError(f"{shown} takes {what}, got {quoted(value)}")
    if bounds is not None:
        check_bounds(shown, bounds, value)


def check_bounds(shown: str, bounds: str, value: float) -> None:
    opening, low_text, high_text, closing = BOUNDS.match(bounds).groups()
    low, high = float(low_text), float(high_text)
    if not math.isfinite(value):
        raise ValueError(f"{shown} takes a finite number, got {value}")
    if abs(value) > FLOAT32_MAX and math.isinf(high):
        raise ValueError(f"{shown} {value} does not fit in float32, which the run computes in")
    below = value <= low if opening == "(" else value < low
    above = value >= high if closing == ")" else value > high
    if below or above:
        low_shown, high_shown = (int(x) if x.is_integer() else x for x in (low, high))
        text = f"{'>' if opening == '(' else '>='} {low_shown}"
        if math.isfinite(high):
            text += f" and {'<' if closing == ')' else '<='} {high_shown}"
        raise ValueError(f"{shown} must be {text}, got {value}")


# --- a flag's text as the value ----------------------------------------------------------------------


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} needs at least one integer, got {text!r}")
    return values


def optional_int_list(text: str, flag: str) -> list[int]:
    return int_list(text, flag) if text else []


def assignments(text: str, flag: str) -> dict[str, Any]:
    return parse_assignments(text, flag)


def names(text: str, flag: str) -> list[str]:
    return split_top_level(text)


def float_list(text: str, flag: str) -> list[float]:
    try:
        return [float(item) for item in text.split(",")]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated numbers, e.g. 0.9,0.999, got {text!r}") from None


def lower(text: str, flag: str) -> str:
    return text.lower()


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")
