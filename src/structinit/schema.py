"""Records read back, checked before any of their values is used: each record's fields (summary.json, a
metrics.jsonl line, a checkpoint's plain values, choose.json, config.yaml's environment, a ledger row, an init
report's layers) are declared once beside their reader as a `Schema`, and checked here: each value's type and
range (numbers finite), what may be missing or null, and what the fields derive of each other (a run's steps
from its epochs). A record that breaks its schema is one line (RunError) naming the file, the field and what
to do, so that no edited value is printed as fact nor fails later outside structinit's messages. JSON-lines
files are read one line at a time, within a bound on each line, on their lines and on their bytes."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from .errors import RunError, quoted
from .files import regular_file


@dataclasses.dataclass(frozen=True)
class Field:
    """One field: what it must be (in a message's words) and the test of a value; where it may be missing
    (records of an older structinit lack it); a list's items and a mapping's fields, checked in turn."""

    what: str
    test: Callable[[Any], bool]
    optional: bool = False
    items: Field | None = None
    schema: Schema | None = None


@dataclasses.dataclass(frozen=True)
class Schema:
    """A record's fields by name, and by pattern (a regular expression each other key is matched against);
    `rules`: what the fields derive of each other, each returning why the record breaks it, or None; `closed`:
    a key with no field is damage (`kind` names the record in that message)."""

    fields: Mapping[str, Field]
    patterns: Mapping[str, Field] = dataclasses.field(default_factory=dict)
    rules: tuple[Callable[[dict[str, Any]], str | None], ...] = ()
    closed: bool = False
    kind: str = "record"

    def field_of(self, key: str) -> Field | None:
        if key in self.fields:
            return self.fields[key]
        return next((field for pattern, field in self.patterns.items() if re.fullmatch(pattern, key)), None)


def _field(what: str, test: Callable[[Any], bool], optional: bool, null: bool, **parts: Any) -> Field:
    if null:
        return Field(f"{what} or null", lambda v: v is None or test(v), optional, **parts)
    return Field(what, test, optional, **parts)


def _bounds(low: float, high: float) -> str:
    low_text, high_text = (str(x) if isinstance(x, int) else f"{x:g}" for x in (low, high))
    if low == -math.inf:
        return "" if high == math.inf else f" <= {high_text}"
    return f" >= {low_text}" if high == math.inf else f" in [{low_text}, {high_text}]"


def integer(low: int = 0, high: float = math.inf, optional: bool = False, null: bool = False) -> Field:
    """An integer (not a boolean) in [low, high]."""

    def test(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high

    return _field(f"an integer{_bounds(low, high)}", test, optional, null)


def number(low: float, high: float = math.inf, optional: bool = False, null: bool = False) -> Field:
    """A finite number (an integer too, not a boolean) in [low, high]."""

    def test(value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        return (isinstance(value, int) or math.isfinite(value)) and low <= value <= high  # an int of any size

    return _field(f"a number{_bounds(low, high)}", test, optional, null)


def text(optional: bool = False, null: bool = False, what: str = "text") -> Field:
    return _field(what, lambda value: isinstance(value, str), optional, null)


def mapping(schema: Schema | None = None, optional: bool = False, null: bool = False, what: str = "") -> Field:
    """A mapping (a JSON object), its fields checked against `schema` where given."""
    return _field(what or "a mapping", lambda value: isinstance(value, dict), optional, null, schema=schema)


def listing(
    items: Field | None = None, at_least: int = 0, optional: bool = False, null: bool = False, what: str = ""
) -> Field:
    """A list of at least `at_least` values, each checked as `items` where given."""

    def test(value: Any) -> bool:
        return isinstance(value, list) and len(value) >= at_least

    return _field(what or ("a non-empty list" if at_least else "a list"), test, optional, null, items=items)


def problem(record: Any, schema: Schema, prefix: str = "") -> str | None:
    """Why `record` does not hold `schema`, in a message's words (its first broken field named, after
    `prefix`), or None where it holds it."""
    if not isinstance(record, dict):
        return "not a mapping"
    for name, field in schema.fields.items():
        if name not in record and not field.optional:
            return f"its {prefix + name!r} is missing"
    for key, value in record.items():
        field = schema.field_of(key)
        if field is None and schema.closed:
            return f"it holds {prefix + key!r}, which no {schema.kind} has"
        why = _value_problem(value, field, prefix + key) if field is not None else None
        if why:
            return why
    return next((why for rule in schema.rules if (why := rule(record))), None)


def _value_problem(value: Any, field: Field, name: str) -> str | None:
    if not field.test(value):
        return f"its {name!r} is {shown(value)}, not {field.what}"
    if field.schema is not None and isinstance(value, dict):
        return problem(value, field.schema, f"{name}.")
    if field.items is not None and isinstance(value, list):
        for index, item in enumerate(value):
            why = _value_problem(item, field.items, f"{name}[{index}]")
            if why:
                return why
    return None


def check(record: Any, schema: Schema, where: str, fix: str) -> dict[str, Any]:
    """`record` where it holds `schema`; otherwise one line (RunError) naming `where` (the file, its line),
    the first broken field and `fix`."""
    why = problem(record, schema)
    if why:
        raise RunError(f"{where} is damaged ({why}): {fix}")
    return record


def shown(value: Any, limit: int = 40) -> str:
    """A value as JSON writes it (repr where JSON has no form for it), cut to `limit` characters."""
    try:
        written = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        return quoted(value, limit)
    return written if len(written) <= limit else written[: limit - 3] + "..."


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a JSON-lines file of a kind never exceeds: bytes a line, lines, bytes in all."""

    line: int
    lines: int
    total: int


def json_lines(path: Path, bounds: Bounds, fix: str) -> Iterator[tuple[int, bytes]]:
    """The lines of `path` (numbered from 1, each with its end), read one at a time within `bounds`: a line,
    or the file, beyond them is damage named in one line (RunError) as soon as it is met, never read whole."""
    regular_file(path)
    read = 0
    with open(path, "rb") as file:
        for number in range(1, bounds.lines + 2):
            line = file.readline(bounds.line + 1)
            if not line:
                return
            read += len(line)
            if len(line) > bounds.line:
                why = f" line {number} is damaged (longer than {bounds.line:,} bytes, which no record is)"
            elif read > bounds.total:
                why = f" is damaged (larger than {bounds.total:,} bytes, which no record of its kind is)"
            elif number > bounds.lines:
                why = f" is damaged (more than {bounds.lines:,} lines, which no record of its kind has)"
            else:
                yield number, line
                continue
            raise RunError(f"{path}{why}: {fix}")
