"""timm's data flags with timm's meaning (issue 76): --dataset torch/NAME under the positional root and
--dataset-download, --mean/--std, --hflip, --color-jitter (timm's rule under --aa), --crop-pct, --interpolation,
--scale/--ratio, --pin-mem; and an evaluation folder named val/ keeps its name."""

import json
import pickle
import urllib.error
import urllib.request

import numpy as np
import pytest
import torch
import torchvision
import yaml
from torch import nn

from conftest import make_imagefolder
from structinit.cli import main
from structinit.cli.parser import build_parser
from structinit.cli.train_flags import train_values
from structinit.data.batches import Feed, InMemoryBatches, StreamBatches
from structinit.data.datasets import load_data

TINY = ["--model-kwargs", "depth=1", "--epochs", "1", "--warmup-epochs", "0", "--quiet"]


def fake_cifar10(root, per_split=20):
    """torchvision's CIFAR10 files (cifar-10-batches-py/) of random images, directly under `root` (timm's layout)."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        entry = {"data": rng.integers(0, 256, (per_split, 3072), dtype=np.uint8), "labels": [i % 10 for i in range(20)]}
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"c{i}" for i in range(10)]}))
    return root


@pytest.fixture
def cifar_root(tmp_path, monkeypatch):
    """Generated CIFAR-10 files; torchvision's md5 check passes them (the real archive's sums are not theirs)."""
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args, **kwargs: True)
    return fake_cifar10(tmp_path / "data")


def values_of(*argv):
    return train_values(build_parser().parse_args(["train", *argv]))


def tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# --- --dataset and --dataset-download ------------------------------------------------------------


def test_dataset_torch_names_are_structinits_sets_under_the_positional_root(tmp_path):
    values = values_of(str(tmp_path), "--dataset", "torch/CIFAR10", "--dataset-download")
    assert (values["data"], values["data_root"], values["download"]) == ("cifar10", str(tmp_path), True)
    assert values_of(str(tmp_path), "--dataset", "torch/oxfordiiitpet")["data"] == "pets"
    assert values_of("--dataset", "torch/svhn", "--data-dir", str(tmp_path))["data_root"] == str(tmp_path)
    for folder_name in ("", "folder", "imagefolder"):  # timm's folder data sets: DIR itself
        assert values_of(str(tmp_path), "--dataset", folder_name)["data"] == f"imagefolder:{tmp_path}"
    with pytest.raises(ValueError, match=r"--dataset torch/MNIST: structinit has torch/CIFAR10, .*torch/Food101"):
        values_of(str(tmp_path), "--dataset", "torch/MNIST")
    with pytest.raises(ValueError, match="--dataset hfds/beans: structinit has"):
        values_of("--dataset", "hfds/beans")


def test_dataset_and_data_together_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["train", "--dataset", "torch/CIFAR10", "--data", "cifar10", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and len(err.splitlines()) == 1
    assert "error: --dataset torch/CIFAR10 and --data cifar10 set the same setting: give one" in err
    assert not (tmp_path / "run").exists()


def test_a_torchvision_set_in_timms_layout_is_read_from_the_root_itself(cifar_root):
    data = load_data("cifar10", root=cifar_root)  # cifar_root/cifar-10-batches-py, not cifar_root/cifar10/...
    assert data.train_images.shape == (100, 3, 32, 32) and data.test_images.shape == (20, 3, 32, 32)
    assert data.classes == [f"c{i}" for i in range(10)]


def test_offline_download_is_one_line_saying_what_to_put_where_and_changes_no_file(tmp_path, monkeypatch, capsys):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    root = tmp_path / "data"
    root.mkdir()
    argv = ["train", str(root), "--dataset", "torch/CIFAR10", "--dataset-download", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"cifar10 could not be downloaded into {root / 'cifar10'}" in err
    assert "put torchvision's cifar-10-batches-py/ there (https://www.cs.toronto.edu/~kriz/cifar-10-python" in err
    assert tree(tmp_path) == ["data"]  # no folder the download made, no run directory


# --- normalisation ------------------------------------------------------------------------------------


def in_memory(data, **feed):
    return InMemoryBatches(data, nn.Identity(), Feed(batch=8, eval_batch=400, **feed), torch.device("cpu"), None)


def test_mean_and_std_normalise_what_the_model_sees_one_value_for_every_channel():
    data = load_data("digits")
    images, _ = next(in_memory(data, mean=[0.2], std=[0.25]).evaluate())
    assert torch.allclose(images, (data.test_images[:400].float() / 255 - 0.2) / 0.25, atol=1e-6)
    rgb = load_data("digits")
    rgb.test_images, rgb.train_images = rgb.test_images.expand(-1, 3, -1, -1), rgb.train_images.expand(-1, 3, -1, -1)
    mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
    images, _ = next(in_memory(rgb, mean=mean.tolist(), std=std.tolist()).evaluate())
    expected = (rgb.test_images[:400].float() / 255 - mean[:, None, None]) / std[:, None, None]
    assert torch.allclose(images, expected, atol=1e-5)
    with pytest.raises(ValueError, match=r"--mean 0.485 0.456 0.406: the data has 1 channel\(s\); give one value"):
        in_memory(data, mean=[0.485, 0.456, 0.406])


def test_mean_and_std_are_timms_words_recorded_in_the_config(tmp_path, capsys):
    assert values_of("--mean", "0.485", "0.456", "0.406", "--std", "0.5")["mean"] == [0.485, 0.456, 0.406]
    out = tmp_path / "run"
    assert (
        main(["train", "--per-class", "5", "-b", "10", *TINY, "--mean", "0.3", "--std", "0.2", "--out", str(out)]) == 0
    )
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["mean"], config["std"]) == ([0.3], [0.2])
    assert main(["train", "--std", "0", "--out", str(tmp_path / "zero")]) == 2
    assert "--std 0: give finite numbers above 0" in capsys.readouterr().err


# --- training transforms: flip, colour jitter, RandomResizedCrop ------------------------------------


def first_batch(data, **feed):
    return next(in_memory(data, crop_padding=0, **feed).train(0, torch.Generator().manual_seed(0)))[0]


def test_hflip_is_the_flip_probability():
    data = load_data("digits")  # digits are not flipped by default
    plain, flipped = first_batch(data), first_batch(data, hflip=1.0)
    assert torch.equal(flipped, plain.flip(-1)) and not torch.equal(flipped, plain)
    assert torch.equal(first_batch(data, hflip=0.0), plain)


def test_colour_jitter_changes_pixels_only_where_timm_applies_it():
    data = load_data("digits")
    plain = first_batch(data)
    jittered = first_batch(data, color_jitter=0.4)
    assert not torch.equal(jittered, plain) and jittered.shape == plain.shape
    aa = "rand-m9-mstd0.5-inc1"  # timm turns colour jitter off under an auto-augment policy
    assert torch.equal(first_batch(data, randaugment=aa, color_jitter=0.4), first_batch(data, randaugment=aa))
    line = Feed(batch=8, eval_batch=8, randaugment=aa, color_jitter=0.4).lines(streamed=False, data_name="digits")
    assert "--color-jitter 0.4 off under --aa rand-m9-mstd0.5-inc1" in line[0]


def test_scale_and_ratio_are_refused_on_images_held_in_memory():
    with pytest.raises(ValueError, match=r"--scale: images held in memory .* padded random crop, not timm's"):
        in_memory(load_data("digits"), scale=[0.5, 1.0])


def stream(tmp_path, **feed):
    root = make_imagefolder(tmp_path / "big", 72, per_class=2)
    data = load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")
    model = nn.Identity()
    model.pretrained_cfg = {"input_size": (3, 64, 64), "crop_pct": 0.9, "interpolation": "bicubic"}
    return StreamBatches(data, model, Feed(batch=2, eval_batch=4, **feed), torch.device("cpu"), None)


def test_streamed_images_take_timms_transforms_with_the_flags(tmp_path):
    batches = stream(
        tmp_path,
        scale=[0.5, 1.0],
        ratio=[1.0, 1.0],
        color_jitter=0.3,
        crop_pct=0.5,
        pin_memory=True,
        mean=[0.5],
        std=[0.25],
    )
    train = batches.train_loader.dataset.transform.transforms
    crop = next(t for t in train if type(t).__name__ == "RandomResizedCropAndInterpolation")
    assert (crop.scale, crop.ratio) == ((0.5, 1.0), (1.0, 1.0))
    jitter = next(t for t in train if isinstance(t, torchvision.transforms.ColorJitter))
    assert jitter.brightness == (0.7, 1.3)
    resize = batches.eval_loader.dataset.transform.transforms[0]
    assert resize.size == 128  # 64 / 0.5, then the centre 64
    assert batches.train_loader.pin_memory and batches.eval_loader.pin_memory
    normalise = batches.eval_loader.dataset.transform.transforms[-1]
    assert normalise.mean.tolist() == [0.5] * 3 and normalise.std.tolist() == [0.25] * 3  # one value: every channel's


# --- evaluation: --crop-pct, --interpolation, the folder's name ---------------------------------------


def test_crop_pct_evaluates_the_centre_of_the_image_resized():
    data = load_data("digits")
    images, _ = next(in_memory(data, crop_pct=0.5, interpolation="nearest", mean=[0], std=[1]).evaluate())
    centre = data.test_images[:400, :, 2:6, 2:6].float() / 255  # 8 px / 0.5 = 16, its centre 8: the original's 4
    assert images.shape == (360, 1, 8, 8)
    assert torch.allclose(images, centre.repeat_interleave(2, -1).repeat_interleave(2, -2))


def test_an_evaluation_folder_named_val_keeps_its_name_in_lines_and_records(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "d", 8, splits=("train", "val"))
    out = tmp_path / "run"
    argv = ["train", str(root), "-b", "4", *TINY[:-1], "--cache-dir", str(tmp_path / "c"), "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "evaluated on val/ (8 images, logged as test_*)" in printed
    assert "finished: val/ top-1" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["evaluated_on"] == "val/" and "test_top1" in summary  # the metrics keep their keys


def test_the_paper_commands_data_flags_run_as_written(cifar_root, tmp_path, capsys):
    paper = ["--dataset", "torch/CIFAR10", "--dataset-download", "--input-size", "3", "32", "32"]
    paper += ["--mean", "0.485", "0.456", "0.406", "--std", "0.229", "0.224", "0.225", "--aa", "rand-m9-mstd0.5-inc1"]
    paper += ["--color-jitter", "0.4", "--crop-pct", "0.875", "--pin-mem"]
    out = tmp_path / "run"
    assert main(["train", str(cifar_root), *paper, "-b", "20", *TINY[:-1], "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "data: cifar10, 100 training images of 10 classes, 32 px" in printed
    assert "--color-jitter 0.4 off under --aa rand-m9-mstd0.5-inc1" in printed
    assert "evaluation images resized to size / 0.875, then centre-cropped" in printed
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert (config["data"], config["data_root"], config["crop_pct"]) == ("cifar10", str(cifar_root), 0.875)
    assert tree(cifar_root) == [
        "cifar-10-batches-py",
        *(
            f"cifar-10-batches-py/{n}"
            for n in sorted(["batches.meta", "test_batch", *(f"data_batch_{i}" for i in range(1, 6))])
        ),
    ]
