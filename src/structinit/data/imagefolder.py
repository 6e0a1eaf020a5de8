"""ImageFolder trees read as timm's folder reader reads them: the split folders its train.py finds, the
class folders in its order, the images it takes (links followed, loops refused); both splits checked to hold
the same classes and not the same images, bad images named in one line, small images decoded once into a
tensor cached under their content digests."""

from __future__ import annotations

import hashlib
import math
import os
import unicodedata
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from timm.data import get_img_extensions
from timm.utils import natural_key

from ..errors import Notice, RunError, first_line
from ..files import atomic_write, remove_temporaries
from .digests import cache_folder

SMALL_IMAGE_PX = 64
# the test images that may also be training images, byte for byte (CIFAR-10's JPEGs share none)
SHARED_TEST_IMAGES = 0.01
# images Pillow reads that timm's folder reader leaves out (it takes get_img_extensions(): .png, .jpg, .jpeg)
SKIPPED_IMAGE_SUFFIXES = {".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp"}

# the split folders in the order timm's train.py finds them: its default --train-split train and --val-split
# validation first, then _search_split's synonyms; test/, structinit's own evaluation folder, last (timm never
# looks for it)
TRAIN_SPLITS = ("train", "training")
EVAL_SPLITS = ("validation", "val", "valid", "eval", "evaluation", "test")


def split_dirs(path: Path, named: tuple[str | None, str | None] = (None, None)) -> tuple[Path, Path]:
    """The training and the evaluation folder of an image folder tree: the folders `named` (timm's
    --train-split and --val-split), else the first of each list's names there."""
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"dataset directory {path} is a file, not a directory of train/ and test/")
    if not path.is_dir():
        raise FileNotFoundError(f"dataset directory {path} does not exist")
    found = []
    for name, names, flag, example in zip(
        named, (TRAIN_SPLITS, EVAL_SPLITS), ("--train-split", "--val-split"), ("train", "test")
    ):
        if name is not None and (name in ("", ".", "..") or "/" in name or "\\" in name):
            raise ValueError(f"{flag} {name!r}: give the name of a folder in {path}, e.g. {example}")
        if name is not None and not (path / name).is_dir():
            held = sorted(d.name + "/" for d in path.iterdir() if d.is_dir())
            raise FileNotFoundError(f"{flag} {name}: {path / name} is not a folder ({path} holds {held})")
        found.append(path / name if name else _first_split(path, names, flag))
    if None in found:
        raise FileNotFoundError(
            f"{path} must hold a training folder ({'/, '.join(TRAIN_SPLITS)}/) and an evaluation folder "
            f"({'/, '.join(EVAL_SPLITS)}/), each of class subfolders (or give --train-split/--val-split)"
        )
    return found[0], found[1]


def _first_split(path: Path, names: tuple[str, ...], flag: str) -> Path | None:
    """The first of `names` in `path`, as timm's _search_split takes it (a file of that name too: timm would
    read it, so it is refused); a Notice names the other split folders there and the flag that takes one."""
    present = [name for name in names if (path / name).exists()]
    if not present:
        return None
    taken = path / present[0]
    if not taken.is_dir():
        raise NotADirectoryError(
            f"{taken} is a file where timm's train.py looks for a split folder: rename it, or name the folder "
            f"with {flag}"
        )
    others = [name for name in present[1:] if (path / name).is_dir()]
    if others:
        uses = "trains on" if flag == "--train-split" else "evaluates on"
        warnings.warn(
            f"{path} holds {', '.join(n + '/' for n in present[:1] + others)}: structinit {uses} {present[0]}/, "
            f"the folder timm's train.py takes; {flag} {others[0]} takes {others[0]}/ instead",
            Notice,
            3,
        )
    return taken


def list_images(split: Path, classes: list[str] | None = None) -> tuple[list[Path], list[int], list[str]]:
    """Every image of a split and its class index, as timm's folder reader lists them: the split's folders
    are its classes, in timm's order (its natural sort: class2 before class10), and their images the files
    of timm's extensions (any case; other images are left out, with a Notice). Links to folders are
    followed; a loop, or a second way into a folder, is an error. The one listing both the in-memory and
    the streamed path read."""
    extensions = get_img_extensions(as_set=True)
    with os.scandir(split) as entries:
        entries = sorted(entries, key=lambda entry: entry.name)
    loose = [e.name for e in entries if not e.is_dir() and os.path.splitext(e.name)[1].lower() in extensions]
    if loose:
        raise ValueError(
            f"{split} holds images outside its class folders ({', '.join(loose[:3])}): timm's folder reader would "
            "read them as a class named ''; move them into their class folders"
        )
    classes = classes or sorted((e.name for e in entries if e.is_dir()), key=natural_key)
    if not classes:
        raise FileNotFoundError(f"{split} has no class subfolders")
    files, labels, skipped = [], [], []
    walked = {os.path.realpath(split): split}
    for index, cls in enumerate(classes):
        folder = split / cls
        found = _images_in(folder, walked, skipped) if folder.is_dir() else []
        files += found
        labels += [index] * len(found)
    if skipped:
        warnings.warn(
            f"{len(skipped)} image(s) in {split} left out, as timm's folder reader leaves them (e.g. {skipped[0]}): "
            f"it takes {', '.join(sorted(extensions))} only; convert them to train on them",
            Notice,
            2,
        )
    return files, labels, classes


def _images_in(folder: Path, walked: dict[str, Path] | None = None, skipped: list[Path] | None = None) -> list[Path]:
    """The images in class folder `folder`, sorted (files of other image formats appended to `skipped`).
    An image in a folder below it is refused: timm's reader would take that folder's name as its class.
    `walked` (real path of every folder and image -> the path it was reached by) is shared by the folders
    of a split, so that a link back up, to another class, or to an image listed already, is found."""
    walked, skipped = ({} if walked is None else walked), ([] if skipped is None else skipped)
    extensions = get_img_extensions(as_set=True)
    images, stack = [], [folder]
    while stack:
        current = stack.pop()
        real = os.path.realpath(current)
        _once(walked, real, current)
        with os.scandir(current) as entries:
            for entry in entries:
                suffix = os.path.splitext(entry.name)[1].lower()
                if entry.is_dir():
                    stack.append(Path(entry.path))
                elif suffix in extensions and current != folder:
                    raise ValueError(_nested(folder, Path(entry.path)))
                elif suffix in extensions:
                    target = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(real, entry.name)
                    _once(walked, target, Path(entry.path))
                    images.append(Path(entry.path))
                elif suffix in SKIPPED_IMAGE_SUFFIXES and current == folder:
                    skipped.append(Path(entry.path))
    return sorted(images)


def _nested(folder: Path, image: Path) -> str:
    return (
        f"{image} is in a folder below class folder {folder}: timm's folder reader would take "
        f"{image.parent.name!r} as its class, structinit {folder.name!r}; move the images of {image.parent} "
        f"into {folder}, or make it a class folder of its own"
    )


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
    _check_names(sorted(set(classes) | set(test_only)), f"{train} and {test}")
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


def _check_names(names: list[str], where: str) -> None:
    """Refuse two class folders that are one name to a reader, naming both with their escapes: one name in
    two Unicode forms (café composed and decomposed print the same, yet are two classes to timm, so they are
    not merged), or names that differ only in case or leading zeros (timm's natural sort ties them and
    numbers them in the order of a set of strings, which changes from process to process)."""
    seen: dict[tuple, str] = {}
    for name in names:
        key = tuple(natural_key(unicodedata.normalize("NFC", name)))
        if key not in seen:
            seen[key] = name
            continue
        first = seen[key]
        if unicodedata.normalize("NFC", first) == unicodedata.normalize("NFC", name):
            why = "are one name in two Unicode forms: they print the same, yet timm reads two classes"
        else:
            why = "differ only in case or leading zeros: timm numbers such classes by chance, anew in each process"
        raise ValueError(f"class folders {first!r} ({first!a}) and {name!r} ({name!a}) in {where} {why}; rename one")


def check_distinct(train: list[Path], train_digests: list[str], test: list[Path], test_digests: list[str]) -> None:
    """The test images must not be the training images: a test folder that is a link to the training
    folder, or a copy of it, would report training accuracy as test accuracy. More than SHARED_TEST_IMAGES
    of the test images among the training images (by content) is refused."""
    seen = dict(zip(train_digests, train))
    shared = [(path, seen[digest]) for path, digest in zip(test, test_digests) if digest in seen]
    if len(shared) > SHARED_TEST_IMAGES * len(test):
        raise ValueError(
            f"{len(shared)} of the {len(test)} test images are training images ({shared[0][0]} holds the bytes of "
            f"{shared[0][1]}): the test set must not be the training set; remove them from one of the splits"
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
    """The image at `path` in `mode`; one line naming the file if it cannot be read."""
    try:
        with Image.open(path) as image:
            return _eight_bit(image).convert(mode)
    except Image.DecompressionBombError as error:
        raise ImageError(
            f"cannot read image {path}: {error}; resize it, or if it is meant, raise PIL.Image.MAX_IMAGE_PIXELS "
            "in Python before structinit reads it"
        ) from None
    except (OSError, ValueError) as error:
        raise ImageError(f"cannot read image {path}: {error}; remove or replace it") from None


def _eight_bit(image: Image.Image) -> Image.Image:
    """16-bit grayscale scaled to 8 bits (PIL's convert clips it: white); 32-bit samples refused, having
    no one scale."""
    if image.mode.startswith("I;16"):
        return Image.fromarray((np.asarray(image) / 257).round().astype(np.uint8), "L")
    if image.mode in ("I", "F"):
        raise ValueError(f"its samples are 32-bit (mode {image.mode}), with no one scale to 8 bits")
    return image


class ImageFiles(torch.utils.data.Dataset):
    """(PIL image, label) of listed image files: the streamed path's dataset."""

    def __init__(self, files: list[Path], labels: list[int], classes: list[str], digests: list[str]) -> None:
        self.files, self.targets, self.classes, self.digests = files, labels, classes, digests

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return open_image(self.files[index]), self.targets[index]


def decode_cached(
    files: list[Path],
    digests: list[str],
    size: tuple[int, int],
    sized_as: Path | None,
    cache_dir: str | Path | None,
) -> torch.Tensor:
    """Decode images of `size` (the size of `sized_as`, named if one differs; None: each image resized
    to `size`, --img-size) into a uint8 (N, 3, H, W) tensor, cached under `cache_dir` by the files'
    content digests. A cache file that is damaged, or of another shape, is decoded again and replaced."""
    resized = "" if sized_as else f"\nresized to {size}"
    key = hashlib.sha1(("\n".join(digests) + resized).encode()).hexdigest()[:16]
    cache = cache_folder(cache_dir) / f"images-{key}.pt"
    shape = (len(files), 3, size[1], size[0])
    if cache.is_file() and cache.stat().st_size <= math.prod(shape) + 65_536:  # a regular file of about its size
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
        if image.size != size and sized_as is None:
            image = image.resize(size, Image.BICUBIC)
        elif image.size != size:
            raise ValueError(
                f"image {f} is {image.size[0]}x{image.size[1]} but {sized_as} is {size[0]}x{size[1]}: images up to "
                f"{SMALL_IMAGE_PX} px are held in memory and must share one size; pass --img-size {size[0]} to "
                "resize them as they are loaded"
            )
        out[i] = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        remove_temporaries(cache.parent, [cache.name])  # only this file's: the folder may be anyone's
        atomic_write(cache, lambda f: torch.save(out, f))
    except (OSError, RunError) as error:  # a cache that cannot be written costs the decoding again next time
        warnings.warn(f"the decoded images are not kept ({first_line(error)}): decoded again next time", Notice, 2)
    return out
