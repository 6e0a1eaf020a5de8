"""The torchvision data sets of the paper: their names (structinit's, and timm's `--dataset torch/NAME`), where
their files lie under the data root, and each opened, or refused in one line saying what to put where."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import reason
from ..files import folders_to_make, remove_empty_folders

# structinit's name -> torchvision's class (downloaded with --download where online)
TORCHVISION_SETS = dict(
    zip(
        ["cifar10", "cifar100", "svhn", "stl10", "flowers102", "pets", "food101"],
        ["CIFAR10", "CIFAR100", "SVHN", "STL10", "Flowers102", "OxfordIIITPet", "Food101"],
    )
)
# what torchvision reads under its root (a folder or file), and where a user gets it by hand
FILES = {
    "cifar10": ("cifar-10-batches-py/", "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz, unpacked"),
    "cifar100": ("cifar-100-python/", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz, unpacked"),
    "svhn": ("train_32x32.mat", "and test_32x32.mat, from http://ufldl.stanford.edu/housenumbers/"),
    "stl10": ("stl10_binary/", "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz, unpacked"),
    "flowers102": ("flowers-102/", "102flowers.tgz unpacked, imagelabels.mat and setid.mat, from "
                   "https://www.robots.ox.ac.uk/~vgg/data/flowers/102/"),
    "pets": ("oxford-iiit-pet/", "images.tar.gz and annotations.tar.gz from "
             "https://www.robots.ox.ac.uk/~vgg/data/pets/data/, unpacked"),
    "food101": ("food-101/", "http://data.vision.ee.ethz.ch/cvl/food-101.tar.gz, unpacked"),
}  # fmt: skip
# timm's names of a folder of class folders (`--dataset ''`, its default), read from the data's root
FOLDER_DATASETS = ("", "folder", "imagefolder", "image_folder")
# timm's `torch/NAME` (torchvision's class name, any case) -> structinit's name
TIMM_NAMES = {**{c.lower(): name for name, c in TORCHVISION_SETS.items()}, **{n: n for n in TORCHVISION_SETS}}


def is_timm_dataset(spec: str) -> bool:
    """Whether a --data/--dataset value is one of timm's names (torch/NAME, a folder data set), not a --data spec."""
    name = spec.strip().lower()
    return ":" not in name and (name in FOLDER_DATASETS or "/" in name)


def timm_data(dataset: str, folder: str | None, data_dir: str | None) -> dict[str, str]:
    """timm's `--dataset NAME` with its root (the positional DIR, or --data-dir) as structinit's settings: a folder
    data set is `--data imagefolder:ROOT`; torch/NAME is a torchvision set read from (or downloaded into) ROOT."""
    if folder and data_dir and Path(folder) != Path(data_dir):
        raise ValueError(f"DIR {folder} and --data-dir {data_dir} both name the data's root: give one")
    root, name = folder or data_dir, dataset.strip().lower()
    if name.removeprefix("torch/") in FOLDER_DATASETS:
        if root is None:
            raise ValueError(f"--dataset {dataset!r} reads an image folder: give it as DIR (structinit train DIR)")
        return {"data": f"imagefolder:{root}"}
    source, _, wanted = name.partition("/")
    if source != "torch" or wanted not in TIMM_NAMES:
        known = ", ".join(f"torch/{c}" for c in TORCHVISION_SETS.values())
        raise ValueError(
            f"--dataset {dataset}: structinit has {known} (under DIR), and '' or folder (DIR itself, an image folder)"
        )
    return {"data": TIMM_NAMES[wanted], **({"data_root": root} if root else {})}


def place(name: str, root: Path) -> Path:
    """The folder torchvision opens set `name` in: ROOT/NAME (structinit's layout, where --download puts it), or
    ROOT itself where its files lie there and not in ROOT/NAME (timm's and torchvision's layout)."""
    entry = FILES[name][0]
    return root if (root / entry).exists() and not (root / name / entry).exists() else root / name


def open_torchvision(name: str, root: Path, download: bool, train: bool) -> Any:
    """torchvision's set `name` (its training or test split) from under `root`; where it is not there (and cannot
    be downloaded), one line saying what to put where. A failed download leaves no folder it made."""
    import torchvision.datasets as tvd

    folder = place(name, root)
    if name in ("svhn", "stl10", "flowers102", "food101"):
        kwargs: dict[str, Any] = {"split": "train" if train else "test"}
    elif name == "pets":
        kwargs = {"split": "trainval" if train else "test"}
    else:
        kwargs = {"train": train}
    made = folders_to_make(folder) if download else []
    try:
        return getattr(tvd, TORCHVISION_SETS[name])(str(folder), download=download, **kwargs)
    except (RuntimeError, OSError) as error:
        remove_empty_folders(made)
        entry, source = FILES[name]
        by_hand = f"put torchvision's {entry} there ({source})"
        if download:
            raise FileNotFoundError(
                f"{name} could not be downloaded into {folder} ({reason(error)}; no internet?): {by_hand}, or use "
                f"--data {name}:PATH for an ImageFolder copy"
            ) from None
        raise FileNotFoundError(
            f"{name} is not under {folder} (torchvision found no {entry} there, or a damaged one): {by_hand}, or "
            f"pass --download to fetch it (timm's --dataset-download; needs internet), or use --data {name}:PATH "
            "for an ImageFolder copy"
        ) from None
