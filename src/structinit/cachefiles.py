"""The small JSON files a cache keeps (a solved value, the digests of a folder's images): what is read
from one is never a reason to hang, to run out of memory or to fail, and a cache that cannot be written
only costs the work again. Read: a regular file only (not a FIFO, a device or a link to one), at most
`limit` bytes, nested no deeper than the JSON reader takes; anything else is no value, with the reason. Written: whole,
through files.atomic_write; a failure is returned as a reason, not raised.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import RunError, first_line
from .files import atomic_write_text, regular_file


def read_kept(path: Path, limit: int) -> tuple[Any, str | None]:
    """(the JSON value at `path`, None); (None, None) where there is no file; (None, why) where the file
    is not one the cache could have written."""
    try:
        found = regular_file(path)
    except FileNotFoundError:
        return None, None
    except (RunError, OSError) as error:
        return None, first_line(error)
    if found.st_size > limit:
        return None, f"{path} is larger than {limit} bytes"
    try:
        with open(path, "rb", opener=_no_block) as f:
            data = f.read(limit + 1)
    except OSError as error:
        return None, f"cannot read {path}: {error.strerror or error}"
    if len(data) > limit:  # grew since its stat
        return None, f"{path} is larger than {limit} bytes"
    try:
        return json.loads(data), None
    except RecursionError:
        return None, f"{path} is nested too deep to read"
    except ValueError as error:  # not JSON, or not UTF-8 text
        return None, f"{path} is not JSON ({first_line(error)})"


def keep(path: Path, value: Any) -> str | None:
    """Write `value` as JSON to `path` whole (its folder made); None, or why it could not be kept."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(value, indent=1, sort_keys=True) + "\n")
    except (OSError, RunError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else first_line(error)
        return f"cannot write {path}: {reason}"
    return None


def _no_block(path: str, flags: int) -> int:
    """open()'s opener: a FIFO put in place after the stat does not block the reader."""
    return os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
