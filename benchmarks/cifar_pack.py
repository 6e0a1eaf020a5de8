"""CIFAR-10's JPEG tree in 18 MB for the device machine, which receives the checkout (64 MiB in all) and not ../shared.

    python benchmarks/cifar_pack.py pack ../shared/datasets/cifar10 .gpu-data    # here (.gpu-data git-ignored)
    python3 benchmarks/cifar_pack.py unpack .gpu-data /tmp/cifar10              # there (carry .gpu-data)

Every one of the 60,000 files begins with the same 623 bytes (the JPEG headers and tables of one encoder
setting), which are 69 % of the 55 MB: the pack keeps them once, then each file's remaining bytes, and the
folders with their counts (files are named 0000.jpg, 0001.jpg, ... in each class folder; other names are
refused). Unpacking writes the same bytes under the same names, so the data's fingerprint is the same. It
also unpacks the pack of ../shared/tools/gpu_data.py (58 MB), with the unpacker that pack carries.
The standard library only: the device's python3 runs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from array import array


def folders(root: str) -> list[str]:
    """The class folders, split by split, sorted as the loaders sort them."""
    return [f"{split}/{name}" for split in ("train", "test") for name in sorted(os.listdir(os.path.join(root, split)))]


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
    listing, paths = [], []
    for folder in folders(root):
        names = sorted(os.listdir(os.path.join(root, folder)))
        if names != [f"{i:04d}.jpg" for i in range(len(names))]:
            sys.exit(f"cifar_pack: {folder} holds files not named 0000.jpg, 0001.jpg, ...: use gpu_data.py")
        listing.append([folder, len(names)])
        paths += [os.path.join(root, folder, name) for name in names]
    prefix = common_prefix(paths)
    sizes = array("I")
    os.makedirs(dest, exist_ok=True)
    with open(os.path.join(dest, "cifar10.rest"), "wb") as out:
        for path in paths:
            with open(path, "rb") as f:
                rest = f.read()[len(prefix) :]
            out.write(rest)
            sizes.append(len(rest))
    with open(os.path.join(dest, "cifar10.sizes"), "wb") as f:
        sizes.tofile(f)
    with open(os.path.join(dest, "cifar10.json"), "w") as f:
        json.dump({"prefix": prefix.hex(), "folders": listing, "size_bytes": sizes.itemsize}, f)
    total = len(prefix) + sum(sizes)
    print(f"packed {len(paths)} images, {total / 1e6:.1f} MB, {len(prefix)} bytes of them shared, into {dest}")


def unpack(src: str, dest: str) -> None:
    if os.path.isfile(os.path.join(src, "cifar10.bin")):  # ../shared/tools/gpu_data.py's pack: its own unpacker
        subprocess.check_call([sys.executable, os.path.join(src, "gpu_data.py"), "unpack", src, dest])
        return
    if not os.path.isfile(os.path.join(src, "cifar10.json")):
        sys.exit(
            f"cifar_pack: no CIFAR-10 pack in {src}: run `python3 benchmarks/cifar_pack.py pack "
            f"../shared/datasets/cifar10 .gpu-data` here and carry .gpu-data"
        )
    with open(os.path.join(src, "cifar10.json")) as f:
        meta = json.load(f)
    prefix, sizes = bytes.fromhex(meta["prefix"]), array("I")
    if sizes.itemsize != meta["size_bytes"]:
        sys.exit("cifar_pack: this machine's unsigned int is not the packing machine's")
    with open(os.path.join(src, "cifar10.sizes"), "rb") as f:
        sizes.frombytes(f.read())
    with open(os.path.join(src, "cifar10.rest"), "rb") as f:
        rest = f.read()
    offset, index = 0, 0
    for folder, count in meta["folders"]:
        os.makedirs(os.path.join(dest, folder), exist_ok=True)
        for i in range(count):
            with open(os.path.join(dest, folder, f"{i:04d}.jpg"), "wb") as out:
                out.write(prefix + rest[offset : offset + sizes[index]])
            offset, index = offset + sizes[index], index + 1
    print(f"unpacked {index} images into {dest}")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] in ("pack", "unpack"):
        (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
