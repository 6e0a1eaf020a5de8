"""Every default the README and docs/ state for an init option or a training flag is the code's."""

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from structinit.cli.parser import build_parser
from structinit.inits import options
from structinit.training.settings import SETTING_DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("*/*.md"))]
# `name` ... default V, name (default V, `--flag ...` ... default V: a stated default, at most 30 characters on
STATED = (
    re.compile(r"`(\w+)`[^`.;]{0,30}?\(?default:? `?([\w.\-/]+)"),
    re.compile(r"\b(\w+) \(default:? `?([\w.\-/]+)"),
    re.compile(r"`--([\w-]+)[^`]*`[^`.;]{0,30}?\(?default:? `?([\w.\-/]+)"),
)


def option_defaults() -> dict[str, set[str]]:
    """Every init option's defaults (one per options class that has it), as text."""
    found: dict[str, set[str]] = {}
    for name in dir(options):
        kind = getattr(options, name)
        if name.endswith("Options") and dataclasses.is_dataclass(kind):
            for field in dataclasses.fields(kind):
                if field.default is not dataclasses.MISSING:
                    found.setdefault(field.name, set()).add(shown(field.default))
    return found


def flag_defaults() -> dict[str, set[str]]:
    """Every command's flag defaults (a flag such as --out has one per command), by setting name."""
    found: dict[str, set[str]] = {}
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in commands.choices.values():
        for action in command._actions:
            if action.option_strings and action.default not in (None, argparse.SUPPRESS):
                found.setdefault(action.dest, set()).add(shown(action.default))
    return found


def shown(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def stated_defaults() -> list[tuple[str, str, str]]:
    """(page, name, value) of every default the pages state for a known option or setting."""
    known = defaults()
    stated = []
    for page in PAGES:
        text = page.read_text()
        for pattern in STATED:
            for match in pattern.finditer(text):
                name, value = match.group(1).replace("-", "_"), match.group(2).rstrip(".-")
                if name in known:
                    stated.append((page.relative_to(ROOT).as_posix(), name, value))
    return stated


def test_the_pages_state_defaults_this_test_reads():
    names = {name for _, name, _ in stated_defaults()}
    assert {"pos_scale", "norm", "target_fidelity"} <= names


def defaults() -> dict[str, set[str]]:
    """Each name's defaults: an init option's, a training setting's, a flag's in any command."""
    found = {name: set(values) for name, values in option_defaults().items()}
    for name, values in [*((k, {shown(v)}) for k, v in SETTING_DEFAULTS.items()), *flag_defaults().items()]:
        found.setdefault(name, set()).update(values)
    return found


@pytest.mark.parametrize(("page", "name", "value"), stated_defaults())
def test_a_stated_default_is_the_codes(page, name, value):
    defaults_ = defaults()[name]
    normal = {"none": "None", "true": "True", "false": "False"}.get(value.lower(), value)
    assert normal in defaults_, f"{page}: {name} default {value}, the code's {defaults_}"
