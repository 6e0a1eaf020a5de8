"""The error of a run that cannot go on as asked, and quoting another error in one line."""


class RunError(RuntimeError):
    """A run cannot go on as asked; the message says why and what to do, in one line."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message (at most 200 characters), to quote it in one line."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
