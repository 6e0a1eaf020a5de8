"""The error of a run that cannot go on as asked, the notice of what it chose (shown as one line, once,
silenced by `quiet`), and quoting another error or a value in one line."""

import contextlib
import contextvars
import os
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_format_warning = warnings.formatwarning
_QUIET: contextvars.ContextVar[bool] = contextvars.ContextVar("structinit_quiet", default=False)
_SHOWN: set[str] = set()  # the notices this process has shown: each cause once (a grid's runs share theirs)


class RunError(RuntimeError):
    """A run cannot go on as asked; the message says why and what to do, in one line."""


class Notice(UserWarning):
    """What the tool chose for the user, or will do that they may not expect (a warning: the command
    shows it as one line, `structinit: note: ...`)."""


@contextlib.contextmanager
def quiet_notices(quiet: bool = True) -> Iterator[None]:
    """Where `quiet` (the caller passed quiet=True), notices raised in this context are not shown (still
    warnings: a filter that makes them errors, or pytest.warns, sees them), nor is long work's bar."""
    token = _QUIET.set(quiet or _QUIET.get())
    try:
        yield
    finally:
        _QUIET.reset(token)


def notices_quiet() -> bool:
    return _QUIET.get()


def _show_warning(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
    """warnings.showwarning, installed on import: a Notice is one line (`structinit: note: ...`, no file
    path or source line), once per process, none where quiet or in a process torchrun started other than rank 0
    (its notices are rank 0's); every other warning goes to the showwarning that was there before (other
    libraries' warnings shown as they were)."""
    if not issubclass(category, Notice):
        return _show_other(message, category, filename, lineno, file, line)
    text = _own_line("note", message)
    if _QUIET.get() or text in _SHOWN or os.environ.get("RANK", "0").strip() not in ("0", ""):
        return None
    _SHOWN.add(text)
    with contextlib.suppress(OSError, AttributeError):  # no stderr (pythonw) or a closed one, as Python's own
        (file or sys.stderr).write(text)
    return None


_show_other = warnings.showwarning
warnings.showwarning = _show_warning


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 200 characters), to quote it in one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # no terminal colour codes
    return (text.strip().splitlines() or [type(error).__name__])[0][:200]


def reason(error: BaseException) -> str:
    """What a refusal quotes of an error: a failed file operation's file and reason (`x: No such file or
    directory`), any other error's message."""
    if isinstance(error, OSError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{where}{error.strerror or error}"
    return str(error)


def one_line(message: str) -> str:
    """`message` on one line, a word of over 200 characters (a path, a label the user gave) shown by its ends."""
    short = re.sub(
        r"\S{200,}", lambda m: f"{m.group()[:60]}...({len(m.group()):,} characters)...{m.group()[-20:]}", message
    )
    return " ".join(short.split())


def quoted(value: object, limit: int = 80) -> str:
    """A value's repr as a one-line message quotes it: cut to `limit` characters (a file can hold a long list)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def one_line_warning(message, category, filename, lineno, line=None) -> str:  # type: ignore[no-untyped-def]
    """warnings.formatwarning for the command and its workers: structinit's own warnings in full on
    one line (`structinit: note: ...` for a Notice; the terminal wraps it), those of other libraries as
    Python shows them, less the library's source line."""
    if not Path(filename).resolve().is_relative_to(PACKAGE):
        return _format_warning(message, category, filename, lineno, line="")
    return _own_line("note" if issubclass(category, Notice) else "warning", message)


def _own_line(kind: str, message: object) -> str:
    """structinit's warning or note as one line: `structinit: KIND: ...` (the terminal wraps it)."""
    return f"structinit: {kind}: {' '.join(str(message).split())}\n"
