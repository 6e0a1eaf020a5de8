"""Datasets: the embedded digits, ImageFolder trees, and the torchvision sets of the paper.

Small images (the array-backed sets and ImageFolder trees of images up to 64 px) are decoded once
into uint8 tensors held in memory (and cached on disk), so that training augments whole batches on
the training device. Larger images stream through timm's transforms and DataLoader workers.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from ..files import atomic_write, remove_temporaries

# names of the paper's datasets -> torchvision class names (downloaded with --download where online)
TORCHVISION_SETS = {
    "cifar10": "CIFAR10",
    "cifar100": "CIFAR100",
    "svhn": "SVHN",
    "stl10": "STL10",
    "flowers102": "Flowers102",
    "pets": "OxfordIIITPet",
    "food101": "Food101",
}
IN_MEMORY_SETS = {"digits", "cifar10", "cifar100", "svhn", "stl10"}
SMALL_IMAGE_PX = 64
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".gif", ".tif", ".tiff", ".webp"}
DATASETS_HELP = (
    "digits | imagefolder:PATH | cifar10 | cifar100 | svhn | stl10 | flowers102 | pets | food101 | imagenet:PATH, "
    "or NAME:PATH for an ImageFolder copy of a named set (PATH/train and PATH/test or PATH/val)"
)


@dataclass
class TensorData:
    """Images held in memory as uint8 (N, C, H, W) tensors, labels as int64 (N,); the validation
    split (carved from the training images by `load_data(val_per_class=...)`) is empty otherwise."""

    name: str
    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: list[str]
    val_images: torch.Tensor | None = None
    val_labels: torch.Tensor | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])


@dataclass
class StreamData:
    """Datasets of PIL images for the transform/DataLoader path (large images)."""

    name: str
    train: torch.utils.data.Dataset
    test: torch.utils.data.Dataset
    train_labels: torch.Tensor
    classes: list[str]
    channels: int = 3
    val: torch.utils.data.Dataset | None = None

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """'cifar10' -> ('cifar10', None); 'imagefolder:/d' -> ('imagefolder', Path('/d'))."""
    name, _, path = spec.partition(":")
    name = name.strip().lower()
    known = {"digits", "imagefolder", "imagenet", *TORCHVISION_SETS}
    if name not in known:
        raise ValueError(f"unknown dataset {spec!r}; --data takes {DATASETS_HELP}")
    if name in ("imagefolder", "imagenet") and not path:
        raise ValueError(f"--data {name} needs a path: {name}:PATH")
    return name, Path(path).expanduser() if path else None


def load_data(
    spec: str,
    *,
    root: str | Path = "data",
    download: bool = False,
    cache_dir: str | Path | None = None,
    per_class: int | None = None,
    train_fraction: float | None = None,
    subset_seed: int = 0,
    val_per_class: int | None = None,
) -> TensorData | StreamData:
    """Load a dataset by its --data spec, with an optional stratified training subset and an optional
    stratified validation split of `val_per_class` training images per class, disjoint from it."""
    name, path = parse_spec(spec)
    if name == "digits":
        data = _digits()
    elif path is not None:
        data = _imagefolder(name, path, cache_dir)
    elif name in IN_MEMORY_SETS:
        data = _torchvision_arrays(name, Path(root), download)
    else:
        data = _torchvision_stream(name, Path(root), download)
    if len(torch.unique(data.train_labels)) < 2:
        raise ValueError(f"--data {spec}: one class ({', '.join(data.classes)}); a classifier needs two or more")
    keep, val = stratified_split(
        data.train_labels, per_class, train_fraction, val_per_class, subset_seed, list(data.classes)
    )
    if isinstance(data, TensorData):
        if val is not None:
            data.val_images, data.val_labels = data.train_images[val], data.train_labels[val]
        if keep is not None:
            data.train_images, data.train_labels = data.train_images[keep], data.train_labels[keep]
    else:
        if val is not None:
            data.val = torch.utils.data.Subset(data.train, val.tolist())
        if keep is not None:
            data.train = torch.utils.data.Subset(data.train, keep.tolist())
            data.train_labels = data.train_labels[keep]
    return data


def stratified_subset(
    labels: torch.Tensor, per_class: int | None, fraction: float | None, seed: int
) -> torch.Tensor | None:
    """Indices of a deterministic stratified subset: `per_class` images of every class, or `fraction`
    of each class (rounded, at least one). The draw depends on `seed` and the labels only."""
    return stratified_split(labels, per_class, fraction, None, seed)[0]


def stratified_split(
    labels: torch.Tensor,
    per_class: int | None,
    fraction: float | None,
    val_per_class: int | None,
    seed: int,
    classes: list[str] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(training indices, validation indices), both stratified and deterministic (seed and labels).

    Each class's images are shuffled once: the training subset is the head of that order (`per_class`
    images, `fraction` of the class, or all but the validation images), the validation split its last
    `val_per_class` images. So a training subset is the same with or without a validation split, and
    with a subset smaller than the class the validation images are ones it does not use.
    None for a part that is not asked for (training: the whole set). `classes` names them in errors."""
    if per_class is not None and fraction is not None:
        raise ValueError("give --per-class or --train-fraction, not both")
    if per_class is not None and per_class < 1:
        raise ValueError(f"--per-class must be >= 1, got {per_class}")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"--train-fraction must be in (0, 1], got {fraction}")
    if val_per_class is not None and val_per_class < 1:
        raise ValueError(f"--val-per-class must be >= 1, got {val_per_class}")
    if per_class is None and fraction is None and val_per_class is None:
        return None, None
    generator = torch.Generator().manual_seed(seed)
    train, val = [], []
    for cls in torch.unique(labels).tolist():
        name = repr(classes[cls]) if classes is not None and cls < len(classes) else cls
        members = torch.nonzero(labels == cls).flatten()
        n, held = len(members), val_per_class or 0
        if per_class is not None:
            count = per_class
        elif fraction is not None:
            count = max(1, round(fraction * n))
        else:
            count = n - held
        if count > n:
            raise ValueError(f"--per-class {per_class}: class {name} has only {n} training images")
        if count < 1 or count + held > n:
            raise ValueError(
                f"--val-per-class {val_per_class}: class {name} has {n} training images, too few for "
                f"{max(count, 1)} training and {held} validation images"
            )
        order = members[torch.randperm(n, generator=generator)]
        train.append(order[:count])
        if held:
            val.append(order[n - held :])
    return torch.cat(train).sort().values, torch.cat(val).sort().values if val else None


# --- sources ---------------------------------------------------------------------------------


def _digits() -> TensorData:
    """scikit-learn's bundled 8x8 digits (1,797 images, values 0..16) with a fixed stratified split
    of 1,437 training and 360 test images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.from_numpy((digits.images * (255.0 / 16.0)).round().astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(digits.target.astype(np.int64))
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=360, stratify=digits.target, random_state=0
    )
    train_idx, test_idx = torch.from_numpy(np.sort(train_idx)), torch.from_numpy(np.sort(test_idx))
    classes = [str(i) for i in range(10)]
    return TensorData("digits", images[train_idx], labels[train_idx], images[test_idx], labels[test_idx], classes)


def _split_dirs(path: Path) -> tuple[Path, Path]:
    if not path.is_dir():
        raise FileNotFoundError(f"dataset directory {path} does not exist")
    train = path / "train"
    test = next((path / d for d in ("test", "val") if (path / d).is_dir()), None)
    if not train.is_dir() or test is None:
        raise FileNotFoundError(f"{path} must hold train/ and test/ (or val/) folders of class subfolders")
    return train, test


def _list_images(split: Path, classes: list[str] | None = None) -> tuple[list[Path], list[int], list[str]]:
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


def _check_classes(train: Path, test: Path, classes: list[str], train_labels: list[int], test_labels: list[int]):
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


def _open_image(path: Path, mode: str = "RGB") -> Image.Image:
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
        return _open_image(self.files[index]), self.targets[index]


def _imagefolder(name: str, path: Path, cache_dir: str | Path | None) -> TensorData | StreamData:
    train_dir, test_dir = _split_dirs(path)
    train_files, train_labels, classes = _list_images(train_dir)
    test_files, test_labels, _ = _list_images(test_dir, classes)
    _check_classes(train_dir, test_dir, classes, train_labels, test_labels)
    probe = _open_image(train_files[0])
    if max(probe.size) > SMALL_IMAGE_PX:
        train, test = ImageFiles(train_files, train_labels, classes), ImageFiles(test_files, test_labels, classes)
        return StreamData(name, train, test, torch.tensor(train_labels), list(classes))
    train_images = _decode_cached(train_files, probe.size, cache_dir)
    test_images = _decode_cached(test_files, probe.size, cache_dir)
    return TensorData(
        name, train_images, torch.tensor(train_labels), test_images, torch.tensor(test_labels), list(classes)
    )


def _decode_cached(files: list[Path], size: tuple[int, int], cache_dir: str | Path | None) -> torch.Tensor:
    """Decode images into a uint8 (N, 3, H, W) tensor, cached under `cache_dir` by file list and size. A
    cache file that is damaged, or of another shape, is decoded again and replaced."""
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
        image = _open_image(f)
        if image.size != size:
            raise ValueError(
                f"image {f} is {image.size[0]}x{image.size[1]} but {files[0]} is {size[0]}x{size[1]}: images up to "
                f"{SMALL_IMAGE_PX} px are held in memory and must share one size; resize them"
            )
        out[i] = torch.from_numpy(np.array(image)).permute(2, 0, 1)
    cache.parent.mkdir(parents=True, exist_ok=True)
    remove_temporaries(cache.parent, lambda name: name.startswith("images-"))
    atomic_write(cache, lambda f: torch.save(out, f))
    return out


def fingerprint(data: TensorData | StreamData) -> str:
    """A digest of what a run trains and evaluates on: the pixels and labels of data held in memory, the
    files (relative paths and sizes) and labels of an image tree; a resumed run checks it is unchanged."""
    digest = hashlib.sha256()
    if isinstance(data, TensorData):
        parts = [data.train_images, data.train_labels, data.test_images, data.test_labels]
        parts += [t for t in (data.val_images, data.val_labels) if t is not None]
        for tensor in parts:
            digest.update(f"{tuple(tensor.shape)};".encode())
            digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()[:16]
    for dataset in (data.train, data.val, data.test):
        indices = getattr(dataset, "indices", None)
        base = getattr(dataset, "dataset", dataset)
        files = getattr(base, "files", None)
        digest.update(f"{len(dataset) if dataset is not None else None};".encode())
        if files is not None:
            chosen = indices if indices is not None else range(len(files))
            root = os.path.commonpath([str(f) for f in files]) if files else ""
            for i in chosen:
                f = files[i]
                digest.update(f"{os.path.relpath(f, root)}:{f.stat().st_size}:{base.targets[i]};".encode())
    digest.update(data.train_labels.numpy().tobytes())
    return digest.hexdigest()[:16]


def _torchvision(name: str, root: Path, download: bool, train: bool):
    import torchvision.datasets as tvd

    cls = getattr(tvd, TORCHVISION_SETS[name])
    if name in ("svhn", "stl10", "flowers102", "food101"):
        split = {"flowers102": "train" if train else "test"}.get(name, "train" if train else "test")
        kwargs = {"split": split}
    elif name == "pets":
        kwargs = {"split": "trainval" if train else "test"}
    else:
        kwargs = {"train": train}
    try:
        return cls(str(root / name), download=download, **kwargs)
    except RuntimeError as error:
        if download:
            raise
        raise FileNotFoundError(
            f"{name} is not under {root / name} ({error}); pass --download to fetch it (needs internet), "
            f"or use --data {name}:PATH for an ImageFolder copy"
        ) from None


def _torchvision_arrays(name: str, root: Path, download: bool) -> TensorData:
    sets = [_torchvision(name, root, download, train) for train in (True, False)]
    arrays = []
    for ds in sets:
        data = torch.from_numpy(np.asarray(ds.data))
        if data.shape[-1] == 3:  # (N, H, W, C) -> (N, C, H, W)
            data = data.permute(0, 3, 1, 2)
        labels = getattr(ds, "targets", None)
        labels = labels if labels is not None else ds.labels
        arrays += [data.contiguous(), torch.as_tensor(np.asarray(labels), dtype=torch.int64)]
    classes = list(getattr(sets[0], "classes", [str(i) for i in range(int(arrays[1].max()) + 1)]))
    return TensorData(name, *arrays, classes)


def _torchvision_stream(name: str, root: Path, download: bool) -> StreamData:
    train, test = (_torchvision(name, root, download, t) for t in (True, False))
    labels = getattr(train, "_labels", None) or getattr(train, "targets", None)
    classes = list(getattr(train, "classes", [str(i) for i in range(max(labels) + 1)]))
    return StreamData(name, train, test, torch.as_tensor(labels), classes)
