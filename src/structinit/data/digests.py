"""Content digests of image files: the key of the decoded-image cache and of a streamed run's data
fingerprint, so that an image replaced with its mtime kept (cp -p, rsync -a, an archive unpacked again)
is noticed. A file's digest (blake2b of its bytes) is computed once and kept in the cache folder under
the file's stat signature: device, inode, size, mtime and ctime, which the kernel sets at every change
and no copy tool can set back."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from pathlib import Path

from ..cachefiles import read_kept
from ..errors import RunError
from ..files import atomic_write_text, regular_file, remove_temporaries

# a file changed within the clock's tick of its digest being taken may keep its ctime: such a digest is
# taken again next time rather than kept
RECENT_NS = 2_000_000_000
KEPT_BYTES, KEPT_BYTES_PER_FILE = 65_536, 1_024  # a file's entry: its name and six numbers, ~150 bytes


def cache_folder(cache_dir: str | Path | None) -> Path:
    """Where decoded images and digests are kept: `cache_dir`, or structinit's cache ($STRUCTINIT_CACHE, else
    ~/.cache/structinit), where the impulse solve's sharpness is kept too."""
    folder = Path(cache_dir or os.environ.get("STRUCTINIT_CACHE") or Path.home() / ".cache" / "structinit").expanduser()
    if folder.exists() and not folder.is_dir():
        raise RunError(f"--cache-dir {folder} is not a directory: give a folder for the decoded images")
    return folder


def file_digests(split: Path, files: list[Path], cache_dir: str | Path | None) -> list[str]:
    """The digest of each of `files`, the images under the folder `split`, refusing anything that is not
    a regular file before opening it; the digests of files unchanged since they were taken are kept."""
    key = hashlib.sha1(os.path.realpath(split).encode()).hexdigest()[:16]
    kept_path = cache_folder(cache_dir) / f"digests-{key}.json"
    kept = _read(kept_path, len(files))
    now, digests, keep, under = time.time_ns(), [], {}, f"{split}{os.sep}"
    for path in files:
        found = regular_file(path)
        signature = [found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns]
        name = str(path).removeprefix(under)
        entry = kept.get(name)
        digests.append(entry[-1] if entry is not None and entry[:-1] == signature else _digest(path))
        if found.st_ctime_ns < now - RECENT_NS:
            keep[name] = [*signature, digests[-1]]
    if keep != kept:
        with contextlib.suppress(OSError, RunError):  # a folder that cannot keep them costs their taking again
            kept_path.parent.mkdir(parents=True, exist_ok=True)
            remove_temporaries(kept_path.parent, lambda name: name.startswith("digests-"))
            atomic_write_text(kept_path, json.dumps(keep))
    return digests


def _read(path: Path, files: int) -> dict[str, list]:
    """The digests kept at `path`, as {file: [*signature, digest]}; a damaged entry (or file: not a regular
    one, larger than the digests of `files` files take, nested too deep) is left out and taken again."""
    kept, _ = read_kept(path, KEPT_BYTES + KEPT_BYTES_PER_FILE * files)
    entries = kept.items() if isinstance(kept, dict) else ()
    return {k: v for k, v in entries if isinstance(v, list) and len(v) == 6 and isinstance(v[-1], str)}


def _digest(path: Path) -> str:
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
