"""Datasets: subsets, ImageFolder trees (in memory and streamed), and every error path."""

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import make_imagefolder
from structinit.data.datasets import StreamData, TensorData, load_data, parse_spec
from structinit.data.subsets import stratified_subset
from structinit.training import TrainConfig, train


def test_digits_is_the_fixed_split_of_sklearn_digits():
    data = load_data("digits")
    assert isinstance(data, TensorData)
    assert data.train_images.shape == (1437, 1, 8, 8) and data.test_images.shape == (360, 1, 8, 8)
    assert data.train_images.dtype == torch.uint8 and data.num_classes == 10
    assert torch.equal(load_data("digits").test_labels, data.test_labels)


def test_per_class_subsets_are_stratified_and_deterministic():
    labels = load_data("digits").train_labels
    a = stratified_subset(labels, 7, None, seed=0)
    assert torch.equal(a, stratified_subset(labels, 7, None, seed=0))
    assert not torch.equal(a, stratified_subset(labels, 7, None, seed=1))
    assert torch.bincount(labels[a]).tolist() == [7] * 10
    b = stratified_subset(labels, None, 0.1, seed=0)
    counts = torch.bincount(labels[b])
    assert torch.equal(counts, (torch.bincount(labels) * 0.1).round().long())
    data = load_data("digits", per_class=5)
    assert len(data.train_labels) == 50 and len(data.test_labels) == 360  # the test set stays whole


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(per_class=0), "--per-class must be >= 1"),
        (dict(per_class=500), "class '0' has only"),
        (dict(train_fraction=1.5), r"--train-fraction must be in \(0, 1\]"),
        (dict(per_class=5, train_fraction=0.5), "not both"),
    ],
)
def test_bad_subsets(kwargs, message):
    with pytest.raises(ValueError, match=message):
        load_data("digits", **kwargs)


def test_unknown_dataset_and_missing_path():
    with pytest.raises(ValueError, match="unknown dataset 'mnist'; --data takes digits"):
        parse_spec("mnist")
    with pytest.raises(ValueError, match="--data imagefolder needs a path: imagefolder:PATH"):
        parse_spec("imagefolder")


def test_torchvision_set_not_on_disk_names_the_flag_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"cifar10 is not under {tmp_path}/cifar10 .*pass --download"):
        load_data("cifar10", root=tmp_path)


def test_imagefolder_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_data(f"imagefolder:{tmp_path / 'nothing'}")
    make_imagefolder(tmp_path / "only_train", 8, splits=("train",))
    with pytest.raises(FileNotFoundError, match=r"must hold a training folder \(train/, training/\) and an evaluation"):
        load_data(f"imagefolder:{tmp_path / 'only_train'}")


@pytest.mark.parametrize("train, evaluation", [("train", "validation"), ("training", "val"), ("train", "eval")])
def test_timms_split_folder_names_are_found(tmp_path, train, evaluation):
    make_imagefolder(tmp_path / "d", 8, splits=(train, evaluation))
    data = load_data(f"imagefolder:{tmp_path / 'd'}")
    assert len(data.train_labels) == 8 and len(data.test_labels) == 8


def test_a_corrupt_image_is_named(tmp_path):
    root = make_imagefolder(tmp_path / "d", 8)
    bad = root / "train" / "dog" / "2.png"
    bad.write_bytes(b"not a png")
    with pytest.raises(ValueError, match=rf"cannot read image {bad}"):
        load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")


def test_small_imagefolder_is_decoded_once_into_memory(tmp_path):
    root = make_imagefolder(tmp_path / "d", 16)
    data = load_data(f"cifar10:{root}", cache_dir=tmp_path / "cache")
    assert isinstance(data, TensorData) and data.classes == ["cat", "dog"]
    assert data.train_images.shape == (8, 3, 16, 16)
    expected = torch.from_numpy(np.array(Image.open(root / "train" / "dog" / "1.png"))).permute(2, 0, 1)
    assert torch.equal(data.train_images[5], expected)
    assert len(list((tmp_path / "cache").glob("images-*.pt"))) == 2
    again = load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")  # from the cache
    assert torch.equal(again.train_images, data.train_images)


def test_large_images_stream_through_timm_transforms_and_train(tmp_path):
    root = make_imagefolder(tmp_path / "d", 80)
    data = load_data(f"imagefolder:{root}")
    assert isinstance(data, StreamData) and len(data.train) == 8
    config = TrainConfig(
        data=f"imagefolder:{root}",
        model="vit_tiny_patch16_224",
        model_kwargs={"img_size": 64, "depth": 1},
        epochs=1,
        batch_size=4,
        workers=0,
        quiet=True,
        out=str(tmp_path / "run"),
    )
    summary = train(config)
    assert summary["finished"] and 0 <= summary["test_top1"] <= 100


def test_classes_keeps_only_those_classes_relabelled_in_the_datas_order():
    everything = load_data("digits")
    some = load_data("digits", classes=["7", "1", "3"])
    assert some.classes == ["1", "3", "7"]
    for split in ("train", "test"):
        labels, images = getattr(everything, f"{split}_labels"), getattr(everything, f"{split}_images")
        kept = (labels == 1) | (labels == 3) | (labels == 7)
        assert torch.equal(getattr(some, f"{split}_images"), images[kept])
        relabelled = {1: 0, 3: 1, 7: 2}
        assert getattr(some, f"{split}_labels").tolist() == [relabelled[int(x)] for x in labels[kept]]
    with pytest.raises(ValueError, match=r"--classes 11: --data digits has no such class \(0, 1, 2"):
        load_data("digits", classes=["1", "11"])


def test_a_setting_added_later_leaves_the_identity_of_runs_recorded_before_it_unchanged():
    import dataclasses

    from structinit.training import TrainConfig
    from structinit.training.identity import config_hash, identity_differences

    config = dataclasses.asdict(TrainConfig())
    before = {k: v for k, v in config.items() if k not in ("classes", "teacher")}  # as a 0.2 run recorded it
    assert config_hash(before) == config_hash(config)
    assert identity_differences(before, config) == []
    assert config_hash({**config, "classes": ["1", "2"]}) != config_hash(config)
    assert identity_differences(before, {**config, "teacher": "t.pth"}) == ["teacher"]


def test_classes_of_a_streamed_image_tree_are_relabelled_too(tmp_path):
    root = make_imagefolder(tmp_path / "big", 72, per_class=3, classes=("a", "b", "c"))
    data = load_data(f"imagefolder:{root}", classes=["c", "a"])
    assert isinstance(data, StreamData) and data.classes == ["a", "c"]
    assert len(data.train) == len(data.test) == 6 and data.train_labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert [label for _, label in data.test] == [0, 0, 0, 1, 1, 1]
    assert np.array_equal(np.array(data.train[3][0]), np.array(Image.open(root / "train" / "c" / "0.png")))


def test_evaluation_labels_are_read_from_a_listing_of_any_kind_without_decoding():
    """A list (image trees, CIFAR), a tensor (MNIST) or an array under `labels` (SVHN, STL-10); through
    subsets. A tensor of targets used to be tested for truth and fail."""
    import numpy as np

    from structinit.data.batches import dataset_labels

    class Listed(torch.utils.data.Dataset):
        def __init__(self, name, labels):
            setattr(self, name, labels)

        def __len__(self):
            return 4

        def __getitem__(self, index):
            raise AssertionError("decoded an image to read a label")

    for name, labels in (
        ("targets", [0, 1, 1, 0]),
        ("targets", torch.tensor([0, 1, 1, 0])),
        ("labels", np.array([0, 1, 1, 0])),
    ):
        subset = torch.utils.data.Subset(Listed(name, labels), [1, 3])
        assert dataset_labels(subset).tolist() == [1, 0]


def test_decoded_images_are_cached_where_structinit_caches(tmp_path, monkeypatch):
    """$STRUCTINIT_CACHE moves the decoded images and their digests with the impulse solve's sharpness: one cache."""
    from structinit.data.datasets import load_data

    root = make_imagefolder(tmp_path / "images", 8)
    monkeypatch.setenv("STRUCTINIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    load_data(f"imagefolder:{root}")
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()) == ["images", "images"]  # two splits
    assert not (tmp_path / "home").exists()
