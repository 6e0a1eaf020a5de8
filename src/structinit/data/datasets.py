"""Datasets: the embedded digits, ImageFolder trees, and the torchvision sets of the paper.

Small images (the array-backed sets and ImageFolder trees of images up to 64 px) are decoded once
into uint8 tensors held in memory (and cached on disk), so that training augments whole batches on
the training device. Larger images stream through timm's transforms and DataLoader workers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..memory import check_images_fit
from .digests import file_digests
from .imagefolder import (
    SMALL_IMAGE_PX,
    ImageFiles,
    check_classes,
    check_distinct,
    decode_cached,
    list_images,
    open_image,
    split_dirs,
)
from .subsets import stratified_split
from .torchvision_sets import TORCHVISION_SETS, open_torchvision

IN_MEMORY_SETS = {"digits", "cifar10", "cifar100", "svhn", "stl10"}
DATASETS_HELP = (
    "digits | imagefolder:PATH | cifar10 | cifar100 | svhn | stl10 | flowers102 | pets | food101 | imagenet:PATH, "
    "or NAME:PATH for an ImageFolder copy of a named set (PATH/train and PATH/test, or timm's split names)"
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
    eval_folder: str | None = None  # an image folder's evaluation folder (val, test, ...): its test images

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_images.shape[1:])

    @property
    def channels(self) -> int:
        """As StreamData.channels: what a model built for the data takes as in_chans."""
        return self.train_images.shape[1]


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
    image_size: int | None = None  # the first training image's shorter side, where known
    eval_folder: str | None = None  # as TensorData's

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def evaluated_on(data: TensorData | StreamData, split: str) -> str:
    """The evaluation split as lines and records name it: an image folder's evaluation folder by its name (val/)
    where that is not test/ (its metrics keep the split's name, test_top1), else the split ("test" or "val")."""
    folder = data.eval_folder
    return f"{folder}/" if split == "test" and folder not in (None, "test") else split


def parse_spec(spec: str) -> tuple[str, Path | None]:
    """'cifar10' -> ('cifar10', None); 'imagefolder:/d' -> ('imagefolder', Path('/d'))."""
    name, colon, path = spec.partition(":")
    name = name.strip().lower()
    known = {"digits", "imagefolder", "imagenet", *TORCHVISION_SETS}
    if name not in known:
        raise ValueError(f"unknown dataset {spec!r}; --data takes {DATASETS_HELP}")
    if name == "digits" and colon:
        raise ValueError(f"--data {spec}: digits is embedded and takes no path; give --data digits")
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
    classes: list[str] | None = None,
    img_size: int | None = None,
    num_classes: int | None = None,
    splits: tuple[str | None, str | None] = (None, None),
) -> TensorData | StreamData:
    """Load a dataset by its --data spec, with an optional stratified training subset and an optional
    stratified validation split of `val_per_class` training images per class, disjoint from it;
    `classes`: only those classes (by name, labelled in the data's order); `img_size`: every image
    resized to that size as it is loaded (images streamed from files: by the model's transforms);
    `num_classes`: the classes the data must have; `splits`: an image folder's training and evaluation folders."""
    name, path = parse_spec(spec)
    if path is None and splits != (None, None):
        raise ValueError(f"--train-split and --val-split name folders of an image folder; --data {spec} has its own")
    if name == "digits":
        data = _digits()
    elif path is not None:
        data = _imagefolder(name, path, cache_dir, img_size, splits)
    elif name in IN_MEMORY_SETS:
        data = _torchvision_arrays(name, Path(root), download)
    else:
        data = _torchvision_stream(name, Path(root), download)
    if classes:
        data = only_classes(data, classes, spec)
    if num_classes is not None and num_classes != data.num_classes:
        raise ValueError(
            f"--num-classes {num_classes}: --data {spec} has {data.num_classes} classes; leave --num-classes out "
            "(the data sets the classifier's classes), or choose classes with --classes"
        )
    if img_size is not None and isinstance(data, TensorData):
        data = resized(data, img_size)
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


# --- sources ---------------------------------------------------------------------------------


def _digits() -> TensorData:
    """scikit-learn's bundled 8x8 digits (1,797 images, values 0..16) with a fixed stratified split
    of 1,437 training and 360 test images."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = torch.from_numpy((digits.images * (255.0 / 16.0)).round().astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(digits.target.astype(np.int64))
    train_idx, test_idx = train_test_split(np.arange(len(labels)), test_size=360, stratify=labels, random_state=0)
    train_idx, test_idx = torch.from_numpy(np.sort(train_idx)), torch.from_numpy(np.sort(test_idx))
    classes = [str(i) for i in range(10)]
    return TensorData("digits", images[train_idx], labels[train_idx], images[test_idx], labels[test_idx], classes)


def _imagefolder(
    name: str, path: Path, cache_dir: str | Path | None, img_size: int | None, splits: tuple
) -> TensorData | StreamData:
    train_dir, test_dir = split_dirs(path, splits)
    train_files, train_labels, classes = list_images(train_dir)
    test_files, test_labels, _ = list_images(test_dir, classes)
    check_classes(train_dir, test_dir, classes, train_labels, test_labels)
    train_digests = file_digests(train_dir, train_files, cache_dir)
    test_digests = file_digests(test_dir, test_files, cache_dir)
    check_distinct(train_files, train_digests, test_files, test_digests)
    size = (img_size, img_size) if img_size else open_image(train_files[0]).size
    if max(size) > SMALL_IMAGE_PX:
        train = ImageFiles(train_files, train_labels, classes, train_digests)
        test = ImageFiles(test_files, test_labels, classes, test_digests)
        labels = torch.tensor(train_labels)
        return StreamData(name, train, test, labels, list(classes), image_size=min(size), eval_folder=test_dir.name)
    sized_as = None if img_size else train_files[0]
    train_images = decode_cached(train_files, train_digests, size, sized_as, cache_dir)
    test_images = decode_cached(test_files, test_digests, size, sized_as, cache_dir)
    tensors = torch.tensor(train_labels), test_images, torch.tensor(test_labels)
    return TensorData(name, train_images, *tensors, list(classes), eval_folder=test_dir.name)


def resized(data: TensorData, size: int) -> TensorData:
    """The data with every image resized to `size` x `size` (bicubic, antialiased, as PIL resizes)."""
    if data.image_shape[1:] == (size, size):
        return data
    check_images_fit([x for x in (data.train_images, data.test_images, data.val_images) if x is not None], size)

    def resize(images: torch.Tensor | None) -> torch.Tensor | None:
        if images is None:
            return None
        scaled = torch.nn.functional.interpolate(images.float(), (size, size), mode="bicubic", antialias=True)
        return scaled.round().clamp(0, 255).to(torch.uint8)

    return dataclasses.replace(
        data,
        train_images=resize(data.train_images),
        test_images=resize(data.test_images),
        val_images=resize(data.val_images),
    )


def only_classes(data: TensorData | StreamData, names: list[str], spec: str) -> TensorData | StreamData:
    """The data's images of the classes `names`, relabelled 0..K-1 in the data's own class order."""
    unknown = [n for n in names if n not in data.classes]
    if unknown:
        raise ValueError(f"--classes {','.join(unknown)}: --data {spec} has no such class ({', '.join(data.classes)})")
    kept = [i for i, name in enumerate(data.classes) if name in names]
    relabel = torch.full((len(data.classes),), -1, dtype=torch.int64)
    relabel[kept] = torch.arange(len(kept))
    if isinstance(data, TensorData):
        train, test = relabel[data.train_labels] >= 0, relabel[data.test_labels] >= 0
        return TensorData(
            data.name,
            data.train_images[train],
            relabel[data.train_labels[train]],
            data.test_images[test],
            relabel[data.test_labels[test]],
            [data.classes[i] for i in kept],
            eval_folder=data.eval_folder,
        )
    test_labels = torch.as_tensor(_targets(data.test))
    train_keep = torch.nonzero(relabel[data.train_labels] >= 0).flatten().tolist()
    test_keep = torch.nonzero(relabel[test_labels] >= 0).flatten().tolist()
    return StreamData(
        data.name,
        Relabelled(torch.utils.data.Subset(data.train, train_keep), relabel),
        Relabelled(torch.utils.data.Subset(data.test, test_keep), relabel),
        relabel[data.train_labels[train_keep]],
        [data.classes[i] for i in kept],
        data.channels,
        image_size=data.image_size,
        eval_folder=data.eval_folder,
    )


def _targets(dataset: torch.utils.data.Dataset) -> list[int]:
    labels = getattr(dataset, "targets", None)
    return labels if labels is not None else [label for _, label in dataset]


class Relabelled(torch.utils.data.Dataset):
    """(image, new label) of a dataset whose labels `relabel` maps."""

    def __init__(self, dataset: torch.utils.data.Dataset, relabel: torch.Tensor) -> None:
        self.dataset, self.relabel = dataset, relabel

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        image, label = self.dataset[index]
        return image, int(self.relabel[label])


def fingerprint(data: TensorData | StreamData) -> str:
    """A digest of what a run trains and evaluates on: the pixels and labels of data held in memory, the
    files (relative paths and content digests) and labels of an image tree; a resumed run checks it is
    unchanged."""
    digest = hashlib.sha256()
    if isinstance(data, TensorData):
        parts = [data.train_images, data.train_labels, data.test_images, data.test_labels]
        parts += [t for t in (data.val_images, data.val_labels) if t is not None]
        for tensor in parts:
            digest.update(f"{tuple(tensor.shape)};".encode())
            digest.update(tensor.contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()[:16]
    for dataset in (data.train, data.val, data.test):
        digest.update(f"{len(dataset) if dataset is not None else None};".encode())
        base, chosen = _listed(dataset)
        if base is not None:
            root = os.path.commonpath([str(f) for f in base.files])
            for i in chosen:
                digest.update(f"{os.path.relpath(base.files[i], root)}:{base.digests[i]}:{base.targets[i]};".encode())
    digest.update(data.train_labels.numpy().tobytes())
    return digest.hexdigest()[:16]


def _listed(dataset: torch.utils.data.Dataset | None) -> tuple[ImageFiles | None, list[int]]:
    """The ImageFiles under a dataset's subsets and relabellings, and where its items are there (None
    for a dataset of no image tree)."""
    indices = list(range(len(dataset))) if dataset is not None else []
    while dataset is not None and not isinstance(dataset, ImageFiles):
        chosen = getattr(dataset, "indices", None)
        indices = [chosen[i] for i in indices] if chosen is not None else indices
        dataset = getattr(dataset, "dataset", None)
    return dataset, indices


def _torchvision_arrays(name: str, root: Path, download: bool) -> TensorData:
    sets = [open_torchvision(name, root, download, train) for train in (True, False)]
    arrays = []
    for ds in sets:
        data = torch.from_numpy(np.asarray(ds.data))
        if data.shape[-1] == 3:  # (N, H, W, C) -> (N, C, H, W)
            data = data.permute(0, 3, 1, 2)
        labels = ds.targets if getattr(ds, "targets", None) is not None else ds.labels
        arrays += [data.contiguous(), torch.as_tensor(np.asarray(labels), dtype=torch.int64)]
    classes = list(getattr(sets[0], "classes", [str(i) for i in range(int(arrays[1].max()) + 1)]))
    return TensorData(name, *arrays, classes)


def _torchvision_stream(name: str, root: Path, download: bool) -> StreamData:
    train, test = (open_torchvision(name, root, download, t) for t in (True, False))
    labels = getattr(train, "_labels", None) or getattr(train, "targets", None)
    classes = list(getattr(train, "classes", [str(i) for i in range(max(labels) + 1)]))
    return StreamData(name, train, test, torch.as_tensor(labels), classes)
