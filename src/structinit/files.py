"""Files that are never half-written: each is written to a temporary file beside it (.NAME.tmpPID),
fsynced and renamed into place, so a crash leaves the old file whole; a failed or interrupted write
removes its temporary file, and one that kill -9 left is removed by the next writer (`remove_temporaries`).
Nothing is written through a link: a link where the tool would write a file is refused in one line
(`refuse_link`), and every file it opens for writing is opened with `no_follow`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import textwrap
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .errors import RunError, first_line

if TYPE_CHECKING:
    import torch

# .NAME.tmpPID (.NAME.tmpPID.THREAD from a thread other than the main one): a temporary file of `atomic_write`
TEMPORARY = re.compile(r"^\.(?P<name>.+)\.tmp(?P<pid>\d+)(\.(?P<thread>\d+))?$")
MAIN_THREAD = threading.main_thread().ident


def temporary(path: Path) -> Path:
    """This process's and thread's temporary name for `path` (threads of one process write apart)."""
    thread = threading.get_ident()
    return path.with_name(f".{path.name}.tmp{os.getpid()}" + (f".{thread}" if thread != MAIN_THREAD else ""))


@contextlib.contextmanager
def folders_kept_only_if_used(path: Path):
    """Run the block; if it fails, remove the folders it made on the way to `path` that are still empty
    (a refused grid or comparison leaves no directory behind)."""
    made = folders_to_make(path)
    try:
        yield
    except BaseException:
        remove_empty_folders(made)
        raise


def folders_to_make(path: Path) -> list[Path]:
    """The folders on the way to `path` (itself included, deepest first) that do not exist yet."""
    return [p for p in (Path(path), *Path(path).parents) if not p.exists()]


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove `folders` (deepest first) that are empty; one holding anything stays, and those above it."""
    with contextlib.suppress(OSError):
        for folder in folders:
            folder.rmdir()


def refuse_link(path: Path) -> None:
    """One line (RunError) where `path` is a link: the tool never writes, replaces or deletes a file
    through one, and what it points to stays as it is."""
    if Path(path).is_symlink():
        raise RunError(f"{path} is a link, and structinit writes no file through one: move it away (its target stays)")


def no_follow(path: str | Path, flags: int) -> int:
    """open()'s `opener` for the files the tool writes: only a regular file is opened (or made); a link
    there is refused (refuse_link), not followed, and so is anything else (a FIFO would block)."""
    refuse_link(Path(path))
    if Path(path).exists() and not Path(path).is_file():
        raise RunError(f"{path} is not a regular file, where structinit writes one: move it away")
    return os.open(path, flags | getattr(os, "O_NOFOLLOW", 0), 0o666)


def atomic_write(
    path: Path, write: Callable[[BinaryIO], Any], keep_previous: bool = False, then: str = "", new: bool = False
) -> None:
    """`write(file)` to a temporary file, fsync, then rename it over `path` (with `keep_previous`, the
    old file becomes prev.pt). A failure or an interrupt leaves the old file and no temporary file; an
    OSError (a full disk) becomes one line, ending with `then` (what to do after freeing space). A link
    at `path` (or at prev.pt) is refused: the rename would replace a file the tool did not write; so is
    anything but a regular file there (refuse_replacing), checked again just before the rename. `new`: the
    file is linked into place only if none is there yet (FileExistsError where another writer was first)."""
    path = Path(path)
    tmp, link = temporary(path), temporary(path.with_name("prev.pt"))
    refuse_replacing(path)
    if keep_previous:
        refuse_replacing(path.with_name("prev.pt"))
    writes = _Writes()
    try:
        tmp.unlink(missing_ok=True)  # this process's name: a leftover is stale (see _alive)
        with open(tmp, "xb", opener=no_follow) as f:
            writes.file = f
            write(writes)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            link.unlink(missing_ok=True)
            os.link(path, link)  # the old file stays in place until the new one replaces it
            os.replace(link, path.with_name("prev.pt"))
            link.unlink(missing_ok=True)  # still there where prev.pt was already this file (kill -9 earlier)
        refuse_replacing(path)  # what the writing gave time to put there
        if new:
            os.link(tmp, path)  # atomic, and refused where a file appeared meanwhile
            tmp.unlink()
        else:
            os.replace(tmp, path)
        sync_directory(path.parent)
    except BaseException as error:
        tmp.unlink(missing_ok=True)
        link.unlink(missing_ok=True)
        if isinstance(error, FileExistsError) and new:
            raise
        if isinstance(error, Exception) and not isinstance(error, OSError) and writes.error is not None:
            error = writes.error  # the writer (torch.save) failed later, on what the failed write left
        if not isinstance(error, OSError):
            raise
        if error.errno == errno.ENOSPC:
            raise RunError(f"no space left on the device holding {path}: free some{then}") from None
        raise RunError(f"cannot write {path}: {error.strerror or error}") from None


def regular_file(path: Path) -> os.stat_result:
    """The stat of `path` (links followed), refusing in one line anything but a regular file, before it
    is opened: a FIFO or a device would hang its reader or feed it without end (a link to /dev/zero)."""
    try:
        found = os.stat(path)
    except FileNotFoundError:
        if not os.path.islink(path):
            raise
        raise RunError(f"{path} is a link to {os.readlink(path)}, which does not exist") from None
    if stat.S_ISREG(found.st_mode):
        return found
    link = f" (a link to {os.path.realpath(path)})" if os.path.islink(path) else ""
    raise RunError(f"{path}{link} is {_kind(found)}, not a regular file: structinit reads only regular files")


def _kind(found: os.stat_result) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    kinds += ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
    return next((name for test, name in kinds if test(found.st_mode)), "a special file")


def refuse_replacing(path: Path) -> None:
    """One line (RunError) where something other than a regular file stands at `path` (a device, a FIFO, a
    socket, a directory): a write replaces a regular file or nothing (`init --json /dev/null --overwrite` as
    root would have replaced the system's /dev/null). Links: refuse_link."""
    refuse_link(path)
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(found.st_mode):
        raise RunError(
            f"{path} is {_kind(found)}, and structinit replaces only a regular file: write to another path "
            "(what is there stays as it is)"
        )


class _Writes:
    """A file as `atomic_write` hands it to a writer, keeping the first OSError of its writes: torch.save
    reports a write that failed (a full disk, `ulimit -f`) as a RuntimeError about its zip's positions."""

    def __init__(self) -> None:
        self.file: BinaryIO | None = None
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.file.flush()


def atomic_write_text(path: Path, text: str, then: str = "") -> None:
    """Replace a small text file whole: a crash leaves the old one."""
    atomic_write(path, lambda f: f.write(text.encode()), then=then)


def fitted_title(text: str, width_inches: float, fontsize: float) -> str:
    """`text` with its lines broken to fit `width_inches` at `fontsize` points (a long path too, where it
    must), so that a figure's title wraps instead of running off its edge."""
    width = max(20, int(width_inches * 72 / (0.65 * fontsize)))  # characters: ~0.65 em each
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False) or line for line in text.split("\n"))


def save_figure(figure: Any, path: Path, dpi: int) -> None:
    """A matplotlib figure written whole (atomic_write), in the format its file's suffix names."""
    path = Path(path)
    atomic_write(path, lambda f: figure.savefig(f, format=path.suffix[1:].lower() or None, dpi=dpi))


def remove_temporaries(folder: Path, names: Iterable[str] | Callable[[str], bool]) -> list[Path]:
    """Delete the temporary files of `names` (or of the names the callable accepts) in `folder` whose
    writer is gone (its pid is not alive): what an interrupted write of ours left. Returns them."""
    accept = names if callable(names) else set(names).__contains__
    removed = []
    for item in folder.iterdir() if folder.is_dir() else ():
        match = TEMPORARY.match(item.name)
        if not match or not accept(match["name"]) or item.is_symlink():  # atomic_write never makes a link
            continue
        if item.is_file() and not _alive(int(match["pid"]), match["thread"]):
            item.unlink(missing_ok=True)
            removed.append(item)
    return removed


def _alive(pid: int, thread: str | None = None) -> bool:
    if pid == os.getpid():  # each thread writes one file at a time: a leftover of a finished one is stale
        return thread is not None and int(thread) in {t.ident for t in threading.enumerate()}
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def sync_directory(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where directories cannot be opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_save(
    obj: Any,
    path: Path,
    keep_previous: bool = False,
    write: Callable[[Any, BinaryIO], Any] | None = None,
    then: str = "",
    new: bool = False,
) -> None:
    """`write` (default torch.save) `obj` to `path` through files.atomic_write (the old file becomes
    prev.pt with `keep_previous`; `then`: what to do after freeing space; `new`: only where no file is):
    a crash leaves the old file, a failure one line and no temporary file."""
    import torch  # here: the command's --help reads this module's neighbours without loading torch

    atomic_write(Path(path), lambda f: (write or torch.save)(obj, f), keep_previous, then, new)


JSON_MAX_BYTES = 16 << 20  # a record the tool writes is a few KB (a ViT-H's init report: ~200 KB)


def read_json_object(path: Path, fix: str, max_bytes: int = JSON_MAX_BYTES) -> dict[str, Any]:
    """A JSON object the tool wrote (summary.json, init_report.json); one line naming the file and `fix`
    if it is damaged: larger than `max_bytes` (read no further), not text, not JSON, nested too deep to
    read, or not an object."""
    regular_file(path)
    with open(path, "rb") as file:
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise RunError(f"{path} is damaged (larger than {max_bytes:,} bytes, which no record of its kind is): {fix}")
    try:
        value = json.loads(data.decode())
    except RecursionError:
        raise RunError(f"{path} is damaged (nested too deep to read): {fix}") from None
    except ValueError as error:  # not JSON, or not text (UnicodeDecodeError)
        raise RunError(f"{path} is damaged ({first_line(error)}): {fix}") from None
    if not isinstance(value, dict):
        raise RunError(f"{path} is damaged (not a JSON object): {fix}")
    return value


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """A digest of a state dict's names, dtypes, shapes and bytes: two inits are the same weights
    exactly when their digests are equal, without keeping both models."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # its buffer, not a copy of the tensor
    return digest.hexdigest()
