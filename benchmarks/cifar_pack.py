"""CIFAR-10's JPEG tree in 18 MB for the device machine, which receives the checkout (64 MiB in all) and not ../shared.

    python benchmarks/cifar_pack.py pack ../shared/datasets/cifar10 .gpu-data    # here (.gpu-data git-ignored)
    python3 benchmarks/cifar_pack.py unpack .gpu-data /tmp/cifar10              # there (carry .gpu-data)

Every one of the 60,000 files begins with the same 623 bytes (the JPEG headers and tables of one encoder
setting), which are 69 % of the 55 MB: the pack keeps them once, then each file's remaining bytes, and the
folders with their counts (files are named 0000.jpg, 0001.jpg, ... in each class folder; other names are
refused). Unpacking writes the same bytes under the same names, so the data's fingerprint is the same. It
also reads the pack of ../shared/tools/gpu_data.py (58 MB: cifar10.bin and its index), itself: the gpu_data.py
that pack carries is never run (no code is run from a data folder).

A pack is data from elsewhere: it is checked whole before anything is written (every path a class folder or
image below the destination, every size and offset within the pack's bytes), refused in one line otherwise.
The tree is written into a new folder beside the destination and renamed into place once whole, so the scripts
that look for train/ never find half a tree; a link at the destination is refused and none is followed on the
way. The standard library and the checkout's structinit.files: the device's python3 runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from array import array
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # the device has the checkout, not the package
from structinit.cachefiles import read_kept
from structinit.errors import RunError, first_line, one_line, quoted, reason
from structinit.files import (
    JSON_MAX_BYTES,
    atomic_write,
    atomic_write_text,
    folders_kept_only_if_used,
    no_follow,
    read_json_object,
    refuse_link,
    regular_file,
    temporary,
)

PACK_MAX_BYTES = 256 << 20  # CIFAR-10 packs to 18 MB here and to 58 MB with the shared tool
SPLITS = ("train", "test")
REPACK = "pack it again (python benchmarks/cifar_pack.py pack ../shared/datasets/cifar10 .gpu-data) and carry it"
Image = tuple[str, "bytes | memoryview"]  # its path below the destination (train/cat/0000.jpg), its bytes


def folders(root: str) -> list[str]:
    """The class folders, split by split, sorted as the loaders sort them."""
    return [f"{split}/{name}" for split in SPLITS for name in sorted(os.listdir(os.path.join(root, split)))]


def common_prefix(paths: list[str]) -> bytes:
    prefix = None
    for path in paths:
        with open(path, "rb") as f:
            data = f.read(len(prefix) if prefix is not None else 4096)
        if prefix is None:
            prefix = data
        else:
            size = next((i for i, (a, b) in enumerate(zip(prefix, data)) if a != b), min(len(prefix), len(data)))
            prefix = prefix[:size]
    return prefix or b""


def pack(root: str, dest: str) -> None:
    """The tree at `root` as three files in `dest`, each written whole; nothing is written through a link."""
    listing, paths = [], []
    for folder in folders(root):
        names = sorted(os.listdir(os.path.join(root, folder)))
        if names != [f"{i:04d}.jpg" for i in range(len(names))]:
            raise RunError(f"{folder} holds files not named 0000.jpg, 0001.jpg, ...: use ../shared/tools/gpu_data.py")
        listing.append([folder, len(names)])
        paths += [os.path.join(root, folder, name) for name in names]
    found = sum(regular_file(path).st_size for path in paths)  # a FIFO would hang the reader
    if found > PACK_MAX_BYTES:
        raise RunError(f"{root} holds {found:,} bytes of images, more than CIFAR-10's: pack no other tree")
    prefix, sizes = common_prefix(paths), array("I")
    refuse_link(Path(dest))
    if os.path.lexists(Path(dest, "cifar10.bin")):
        raise RunError(f"{dest} holds the shared tool's pack, which unpack reads first: pack into another folder")
    Path(dest).mkdir(parents=True, exist_ok=True)
    atomic_write(Path(dest, "cifar10.rest"), lambda out: write_rests(paths, len(prefix), sizes, out))
    atomic_write(Path(dest, "cifar10.sizes"), lambda out: out.write(sizes.tobytes()))
    meta = {"prefix": prefix.hex(), "folders": listing, "size_bytes": sizes.itemsize}
    atomic_write_text(Path(dest, "cifar10.json"), json.dumps(meta))
    total = len(prefix) + sum(sizes)
    print(f"packed {len(paths)} images, {total / 1e6:.1f} MB, {len(prefix)} bytes of them shared, into {dest}")


def write_rests(paths: list[str], shared: int, sizes: array, out: Any) -> None:
    """Each file's bytes after the `shared` ones every file begins with, one after another; their sizes to `sizes`."""
    for path in paths:
        with open(path, "rb") as f:
            rest = f.read()[shared:]
        out.write(rest)
        sizes.append(len(rest))


def unpack(src: str, dest: str) -> None:
    """Either pack at `src` (this script's, or the shared tool's cifar10.bin) as a JPEG tree at `dest`."""
    images = read_tool_pack(Path(src)) if os.path.lexists(Path(src, "cifar10.bin")) else read_own_pack(Path(src))
    write_tree(images, Path(dest))
    print(f"unpacked {len(images)} images into {dest}")


def read_own_pack(src: Path) -> list[Image]:
    """This script's pack: the shared prefix, each folder's count and each file's remaining bytes, checked."""
    if not os.path.lexists(src / "cifar10.json"):
        raise RunError(
            f"no CIFAR-10 pack in {src}: run `python3 benchmarks/cifar_pack.py pack "
            f"../shared/datasets/cifar10 .gpu-data` here and carry .gpu-data"
        )
    meta, sizes = read_json_object(src / "cifar10.json", REPACK), array("I")
    if meta.get("size_bytes") != sizes.itemsize:
        given = quoted(meta.get("size_bytes"))
        raise RunError(
            f"{src}/cifar10.json packs sizes of {given} bytes, not this machine's {sizes.itemsize}: {REPACK}"
        )
    try:
        prefix = bytes.fromhex(meta["prefix"])
        listing = [(class_folder(folder, 2, src / "cifar10.json"), count) for folder, count in meta["folders"]]
        sizes.frombytes(read_bounded(src / "cifar10.sizes"))
    except (KeyError, TypeError, ValueError) as error:  # a key missing, a value of another type, bytes cut short
        raise RunError(f"{src} holds a damaged pack ({first_line(error)}): {REPACK}") from None
    rest = read_bounded(src / "cifar10.rest")
    if any(type(count) is not int or count < 0 for _, count in listing) or sum(c for _, c in listing) != len(sizes):
        raise RunError(
            f"{src}/cifar10.json counts {quoted(meta['folders'])}, not the pack's {len(sizes)} files: {REPACK}"
        )
    if sum(sizes) != len(rest):
        raise RunError(
            f"{src}/cifar10.rest holds {len(rest):,} bytes, not the {sum(sizes):,} its sizes add to: {REPACK}"
        )
    images, offset = [], 0
    for folder, count in listing:
        for i in range(count):
            size = sizes[len(images)]
            images.append((f"{folder}/{i:04d}.jpg", prefix + rest[offset : offset + size]))
            offset += size
    return unique(images, src)


def read_tool_pack(src: Path) -> list[Image]:
    """../shared/tools/gpu_data.py's pack: cifar10.bin and cifar10.idx.json, [path, offset, size] a file."""
    index, why = read_kept(src / "cifar10.idx.json", JSON_MAX_BYTES)
    if why or not isinstance(index, list):
        raise RunError(f"{src} holds a damaged pack ({why or 'its cifar10.idx.json is no list of files'}): {REPACK}")
    data = memoryview(read_bounded(src / "cifar10.bin"))
    images = []
    for entry in index:
        path, offset, size = entry if isinstance(entry, list) and len(entry) == 3 else (entry, None, None)
        if type(offset) is not int or type(size) is not int or not 0 <= offset <= offset + size <= len(data):
            raise RunError(f"{src}/cifar10.idx.json names {quoted(entry)}, not bytes of cifar10.bin: {REPACK}")
        images.append((class_folder(path, 3, src / "cifar10.idx.json"), data[offset : offset + size]))
    return unique(images, src)


def class_folder(path: Any, depth: int, where: Path) -> str:
    """`path` when it is `depth` plain names below the destination, a split (train, test) first; one line else
    (an absolute path, `..`, an empty name: a pack that would write outside its destination)."""
    names = path.split("/") if isinstance(path, str) else []
    plain = all(name not in ("", ".", "..") and "\\" not in name and "\0" not in name for name in names)
    if len(names) != depth or names[0] not in SPLITS or not plain:
        raise RunError(f"{where} names {quoted(path)}, not a path below the destination: {REPACK}")
    return path


def unique(images: list[Image], src: Path) -> list[Image]:
    """`images`, refused in one line where two have one path (the second would overwrite the first)."""
    seen = set()
    for path, _ in images:
        if path in seen:
            raise RunError(f"{src} holds {path} twice: {REPACK}")
        seen.add(path)
    return images


def read_bounded(path: Path) -> bytes:
    """A pack's file, refused in one line where it is not a regular file or larger than any CIFAR-10 pack."""
    found = regular_file(path)
    with open(path, "rb") as f:
        data = f.read(PACK_MAX_BYTES + 1)
    if found.st_size > PACK_MAX_BYTES or len(data) > PACK_MAX_BYTES:
        raise RunError(f"{path} is larger than {PACK_MAX_BYTES:,} bytes, which no CIFAR-10 pack is: {REPACK}")
    return data


def write_tree(images: list[Image], dest: Path) -> None:
    """The images in a new folder beside `dest` (made here: no link in it), renamed into place once whole."""
    refuse_link(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RunError(f"{dest} holds something already: unpack into a new or empty folder (what is there stays)")
    with folders_kept_only_if_used(dest.parent):
        dest.parent.mkdir(parents=True, exist_ok=True)
        scratch = temporary(dest)
        os.mkdir(scratch)
        try:
            for folder in sorted({path.rsplit("/", 1)[0] for path, _ in images}):
                os.makedirs(scratch / folder)  # each new: a link put there meanwhile is refused, not followed
                if os.path.realpath(scratch / folder) != os.path.join(os.path.realpath(scratch), folder):
                    raise RunError(
                        f"{scratch / folder} leads outside {scratch}: unpack again, with nothing else at work"
                    )
            for path, data in images:
                with open(scratch / path, "xb", opener=no_follow) as out:
                    out.write(data)
            os.rename(scratch, dest)  # replaces an empty folder at most; fails on a link put there meanwhile
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in ("pack", "unpack"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        (pack if argv[0] == "pack" else unpack)(argv[1], argv[2])
    except (RunError, OSError) as error:
        print(f"cifar_pack.py: error: {one_line(reason(error))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
