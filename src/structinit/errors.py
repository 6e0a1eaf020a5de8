"""The error of a run that cannot go on as asked, the notice of what it chose, and quoting another
error or a value in one line."""

import re


class RunError(RuntimeError):
    """A run cannot go on as asked; the message says why and what to do, in one line."""


class Notice(UserWarning):
    """What the tool chose for the user, or will do that they may not expect (a warning: the command
    shows it as one line, `structinit: note: ...`)."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 200 characters), to quote it in one line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))  # no terminal colour codes
    return (text.strip().splitlines() or [type(error).__name__])[0][:200]


def quoted(value: object, limit: int = 80) -> str:
    """A value's repr as a one-line message quotes it: cut to `limit` characters (a file can hold a long list)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
