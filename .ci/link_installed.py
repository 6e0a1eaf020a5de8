"""Hard-link installed distributions, with everything they require, into another environment.

Why: CI checks the lowest promised versions in a second, fresh venv. Installing torch there again takes
~6 GB (its CUDA libraries), which the CI machine does not have to spare beside the first venv; hard links
of the first venv's files cost no space, and pip in the second venv then sees torch as installed.

Usage (run with the interpreter of the environment that has them):
    python link_installed.py DEST_SITE_PACKAGES torch torchvision
"""

import importlib.metadata as metadata
import os
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(names: list[str]) -> list[metadata.Distribution]:
    """The distributions `names` need, extras included, as installed here (markers evaluated here)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [(name, set()) for name in names]
    done: set[tuple[str, frozenset]] = set()
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), frozenset(extras))
        if key in done:
            continue
        done.add(key)
        dist = metadata.distribution(name)
        found[key[0]] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            envs = [{"extra": extra} for extra in extras] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(env) for env in envs):
                todo.append((req.name, set(req.extras)))
    return list(found.values())


def link(dist: metadata.Distribution, dest: Path) -> int:
    """Hard-link (copy where links fail) the files of `dist` that live in site-packages; returns bytes copied."""
    root = Path(dist.locate_file("")).resolve()
    copied = 0
    for entry in dist.files or []:
        source = Path(dist.locate_file(entry)).resolve()
        if not source.is_relative_to(root) or not source.is_file():
            continue  # console scripts (bin/) name the first venv's interpreter; the second does not need them
        target = dest / source.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)
            copied += source.stat().st_size
    return copied


def main() -> None:
    dest, names = Path(sys.argv[1]), sys.argv[2:]
    dists = closure(names)
    copied = sum(link(dist, dest) for dist in dists)
    print(f"linked {len(dists)} distributions ({', '.join(names)} and what they need); {copied / 2**20:.0f} MiB copied")


if __name__ == "__main__":
    main()
