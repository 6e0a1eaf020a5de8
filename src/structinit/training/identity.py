"""What makes a run the run it is: the settings that decide what it computes (its identity and its
hash), and what a resume may change of them. All derived from the settings' declarations."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..errors import RunError
from .setting import flag
from .settings import SETTING_DEFAULTS, SETTINGS

# settings a resumed run may change, those its log records, and those that change what it trains
RESUMABLE = tuple(name for name, s in SETTINGS.items() if s.resume != "fixed")
RECORDED = tuple(name for name, s in SETTINGS.items() if s.resume in ("recorded", "schedule"))
SCHEDULE = tuple(name for name, s in SETTINGS.items() if s.resume == "schedule")
NOT_IDENTITY = tuple(name for name, s in SETTINGS.items() if not s.identity)
NOT_RECIPE = tuple(name for name, s in SETTINGS.items() if s.identity and not s.recipe)
# settings added since runs were first recorded, and the default that such runs did
LATER = {name: SETTING_DEFAULTS[name] for name, s in SETTINGS.items() if s.since}


def identity(config: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide what a run computes (a later setting at its default: none)."""
    return {k: v for k, v in config.items() if k not in NOT_IDENTITY and not (k in LATER and v == LATER[k])}


def config_hash(config: dict[str, Any], leave_out: tuple[str, ...] = ()) -> str:
    """A short hash of a run's identity (less `leave_out`): equal hashes, the same computation."""
    fields = {k: v for k, v in identity(config).items() if k not in leave_out}
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:10]


def identity_differences(one: dict[str, Any], other: dict[str, Any], leave_out: tuple[str, ...] = ()) -> list[str]:
    """The settings in which two configs' identities differ (less `leave_out`), compared as their
    JSON records (a tuple and a list are the same value there)."""
    fixed = [json.loads(json.dumps({k: v for k, v in identity(c).items() if k not in leave_out})) for c in (one, other)]
    return sorted(k for k in fixed[0].keys() | fixed[1].keys() if fixed[0].get(k) != fixed[1].get(k))


def resume_changes(saved: dict[str, Any], asked: dict[str, Any], epochs_done: int) -> dict[str, list[Any]]:
    """The settings `asked` changes from the run's `saved` config that its log records, as
    {name: [saved, asked]}.

    Raises RunError, naming every flag, if any of them cannot change in a resumed run, or if the
    run would end before the epochs it has done."""
    changed = {k: [saved.get(k), v] for k, v in asked.items() if k != "resume" and saved.get(k) != v}
    fixed = [k for k in changed if k not in RESUMABLE and k != "out"]
    if fixed:
        listed = ", ".join(f"{flag(k)} {changed[k][1]!r} (the run has {changed[k][0]!r})" for k in fixed)
        raise RunError(f"--resume cannot change {listed}: start a new run with another --out")
    total = asked.get("epochs", saved["epochs"]) + asked.get("cooldown_epochs", saved.get("cooldown_epochs", 0))
    if total < epochs_done:
        raise RunError(f"--epochs {asked['epochs']}: the run has already done {epochs_done} epochs")
    return {k: v for k, v in changed.items() if k in RECORDED}
