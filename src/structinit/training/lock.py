"""An exclusive lock on a run's (or a grid's) directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import no_follow

# what a holder writes into DIR/.lock (empty for a moment after it is made)
HOLDER = re.compile(r"^pid \d+ \(\w+\)$")


class RunLock:
    """An exclusive lock on a directory (an flock on DIR/.lock, released when the process ends, even
    by kill -9): a second process training the same run, or the same grid, is refused at once. The
    holder removes DIR/.lock when it is done, so that a run leaves no file it does not need. A .lock that
    is a link, or holds what no holder writes, is not the tool's: refused, and left as it is."""

    def __init__(self, folder: Path, what: str = "run") -> None:
        self.folder, self.what, self.file = Path(folder), what, None

    def __enter__(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # Windows: no flock; the lock is advisory anyway
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / ".lock"
        while self.file is None:
            file = open(path, "a+", opener=no_follow)
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                fix = "wait for it to finish or use another --out"
                raise RunError(f"{self.folder} is in use by {holder}: {fix}") from None
            if not _a_lock(file):
                file.close()
                raise RunError(f"{path} is not a lock of structinit's (it holds other data): move it away")
            if _same_file(file, path) and os.fstat(file.fileno()).st_nlink == 1:
                self.file = file
            elif _same_file(file, path):  # held, and shared with a hard-linked copy: this directory gets its own
                path.unlink()
                file.close()
            else:  # locked a file its holder removed on leaving: lock the one there now
                file.close()
        self.file.seek(0)
        self.file.truncate()
        self.file.write(f"pid {os.getpid()} ({self.what})")
        self.file.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            (self.folder / ".lock").unlink(missing_ok=True)  # still held: no one else holds this file
            self.file.close()
            self.file = None


def _a_lock(file: Any) -> bool:
    """Whether the open `file` is a lock file of the tool's: empty, or naming its holder."""
    file.seek(0)
    held = file.read(100)
    return not held or bool(HOLDER.match(held))


def _same_file(file: Any, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(file.fileno()), os.stat(path))
    except FileNotFoundError:
        return False
