"""ImageFolder trees: every image listed once (links followed, loops refused), both splits checked to
hold the same classes, bad images named in one line, small images decoded once into a cached tensor."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..files import atomic_write, remove_temporaries

SMALL_IMAGE_PX = 64
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp"}


def split_dirs(path: Path) -> tuple[Path, Path]:
    if not path.is_dir():
        raise FileNotFoundError(f"dataset directory {path} does not exist")
    train = path / "train"
    test = next((path / d for d in ("test", "val") if (path / d).is_dir()), None)
    if not train.is_dir() or test is None:
        raise FileNotFoundError(f"{path} must hold train/ and test/ (or val/) folders of class subfolders")
    return train, test


def list_images(split: Path, classes: list[str] | None = None) -> tuple[list[Path], list[int], list[str]]:
    """Every image of a split and its class index: the one listing both the in-memory and the streamed
    path read. Links to folders are followed; a loop, or a second way into a folder, is an error."""
    classes = classes or sorted(d.name for d in split.iterdir() if d.is_dir())
    if not classes:
        raise FileNotFoundError(f"{split} has no class subfolders")
    files, labels = [], []
    walked = {os.path.realpath(split): split}
    for index, cls in enumerate(classes):
        folder = split / cls
        found = _images_in(folder, walked) if folder.is_dir() else []
        files += found
        labels += [index] * len(found)
    return files, labels, classes


def _images_in(folder: Path, walked: dict[str, Path] | None = None) -> list[Path]:
    """The images under `folder`, sorted. `walked` (real path of every folder and image -> the path it
    was reached by) is shared by the folders of a split, so that a link back up, to another class, or
    to an image listed already, is found."""
    walked = {} if walked is None else walked
    images, stack = [], [folder]
    while stack:
        current = stack.pop()
        real = os.path.realpath(current)
        _once(walked, real, current)
        with os.scandir(current) as entries:
            for entry in entries:
                if entry.is_dir():
                    stack.append(Path(entry.path))
                elif Path(entry.name).suffix.lower() in IMAGE_SUFFIXES:
                    target = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(real, entry.name)
                    _once(walked, target, Path(entry.path))
                    images.append(Path(entry.path))
    return sorted(images)


def _once(walked: dict[str, Path], real: str, path: Path) -> None:
    if real in walked:
        raise ValueError(
            f"{path} leads to {walked[real]} again (a link loop, or a second path to the same folder or image): "
            "remove the link, so that every image belongs to one class once"
        )
    walked[real] = path


def check_classes(train: Path, test: Path, classes: list[str], train_labels: list[int], test_labels: list[int]):
    """Both splits must hold the same classes, each with images: a class folder that is empty, or
    that only one split has, would silently shrink the classifier head or drop test images. Reads
    the listings already made (and walks only folders the test split alone has)."""
    in_test = {d.name: d for d in test.iterdir() if d.is_dir()}
    test_only = sorted(set(in_test) - set(classes))
    for split, labels, extra in ((train, train_labels, []), (test, test_labels, test_only)):
        counts = Counter(labels)
        empty = [c for i, c in enumerate(classes) if counts[i] == 0 and (split == train or c in in_test)]
        empty = sorted(empty + [c for c in extra if not _images_in(in_test[c])])
        if empty:
            raise ValueError(
                f"class folder(s) without images in {split}: {', '.join(empty)}; add images or remove them"
            )
    for split, other, missing in ((train, test, sorted(set(classes) - set(in_test))), (test, train, test_only)):
        if missing:
            raise ValueError(
                f"class(es) {', '.join(missing)} in {split} but not in {other}: both splits need the same classes"
            )


class ImageError(ValueError):
    """An image that cannot be decoded, named in one line."""

    @classmethod
    def from_worker(cls, error: ImageError) -> ImageError:
        """The one line of an ImageError that a DataLoader worker raised (the loader wraps it in the
        worker's traceback)."""
        lines = [line for line in str(error).splitlines() if "ImageError: " in line]
        return cls(lines[-1].split("ImageError: ", 1)[1]) if lines else error


def open_image(path: Path, mode: str = "RGB") -> Image.Image:
    try:
        with Image.open(path) as image:
            return image.convert(mode)
    except (OSError, ValueError) as error:
        raise ImageError(f"cannot read image {path}: {error}; remove or replace it") from None


class ImageFiles(torch.utils.data.Dataset):
    """(PIL image, label) of listed image files: the streamed path's dataset."""

    def __init__(self, files: list[Path], labels: list[int], classes: list[str]) -> None:
        self.files, self.targets, self.classes = files, labels, classes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return open_image(self.files[index]), self.targets[index]


def decode_cached(
    files: list[Path], size: tuple[int, int], sized_as: Path, cache_dir: str | Path | None
) -> torch.Tensor:
    """Decode images of `size` (the size of `sized_as`, named if one differs) into a uint8 (N, 3, H, W)
    tensor, cached under `cache_dir` by file list and size. A cache file that is damaged, or of another
    shape, is decoded again and replaced."""
    key = hashlib.sha1("\n".join(f"{f}:{f.stat().st_mtime_ns}" for f in files).encode()).hexdigest()[:16]
    cache = Path(cache_dir or Path.home() / ".cache" / "structinit") / f"images-{key}.pt"
    shape = (len(files), 3, size[1], size[0])
    if cache.exists():
        try:
            cached = torch.load(cache, map_location="cpu", weights_only=True)
        except Exception:  # damaged (a disk error, a foreign file): decoded again below
            cached = None
        if isinstance(cached, torch.Tensor) and cached.dtype == torch.uint8 and tuple(cached.shape) == shape:
            return cached
    from tqdm.auto import tqdm

    out = torch.empty(shape, dtype=torch.uint8)
    # disable=None: a bar on a terminal, nothing in a log file
    bar = tqdm(files, desc=f"decoding {files[0].parents[1].name}", unit="img", leave=False, disable=None)
    for i, f in enumerate(bar):
        image = open_image(f)
        if image.size != size:
            raise ValueError(
                f"image {f} is {image.size[0]}x{image.size[1]} but {sized_as} is {size[0]}x{size[1]}: images up to "
                f"{SMALL_IMAGE_PX} px are held in memory and must share one size; resize them"
            )
        out[i] = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    cache.parent.mkdir(parents=True, exist_ok=True)
    remove_temporaries(cache.parent, lambda name: name.startswith("images-"))
    atomic_write(cache, lambda f: torch.save(out, f))
    return out
