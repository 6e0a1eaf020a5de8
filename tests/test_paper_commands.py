"""The paper's two commands (osiriszjq/structured_initialization's README) run with `structinit train` in place
of `torchrun ... train.py`, their flags verbatim, on small generated data; a small model and one epoch appended
(issue 76). Their start-up lines say what each of timm's flags became."""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torchvision.datasets.cifar

import structinit
from conftest import make_imagefolder
from structinit.cli import main

# the README's small-data command after `train.py [/path/to/your/data/folder]`, torch/CIFAR10 and impulse chosen
SMALL_DATA = """--dataset torch/CIFAR10 --dataset-download --input-size 3 224 224
 --mean 0.485 0.456 0.406 --std 0.229 0.224 0.225 --seed 0 --num-classes 10 --model vit_tiny_patch16_224
 --model-kwargs img_size=224 weight_init=skip post_weight_init=impulse --model-ema-decay 0.9999 -j 10 -b 64
 --lr 2e-3 --layer-decay 1.0 --warmup-lr 1e-6 --min-lr 1e-6 --weight-decay 0.05 --opt adamw --opt-eps 1e-8
 --epochs 300 --sched cosine --warmup-epochs 50 --amp --aa rand-m9-mstd0.5-inc1 --cutmix 1.0 --mixup 0.8
 --reprob 0.25 --smoothing 0.1 --drop 0.0 --color-jitter 0.4 --drop-path 0.1 --crop-pct 0.875 --pin-mem""".split()  # noqa: SIM905
# the README's ImageNet-1k command, mimetic chosen
IMAGENET = """--train-split train --val-split val --input-size 3 224 224
 --mean 0.485 0.456 0.406 --std 0.229 0.224 0.225 --num-classes 1000 --seed 42 --model vit_base_patch16_224
 --model-kwargs img_size=224 weight_init=skip post_weight_init=mimetic -j 10 -b 64 --lr-base-size 512
 --lr-base 5e-4 --lr-base-scale linear --warmup-lr 1e-6 --min-lr 1e-5 --weight-decay 0.05 --opt adamw
 --opt-eps 1e-8 --epochs 300 --sched cosine --warmup-epochs 5 --cooldown-epochs 10 --amp
 --aa rand-m9-mstd0.5-inc1 --cutmix 1.0 --mixup 0.8 --reprob 0.25 --smoothing 0.1 --drop 0.0
 --color-jitter 0.3 --drop-path 0.1 --crop-pct 0.875 --aug-repeats 3.0 --pin-mem""".split()  # noqa: SIM905
# appended: one block of patch 32 (49 tokens), one epoch; the classes the small data has
SMALL = ["--model-kwargs", "depth=1", "patch_size=32", "--stop-after", "1"]


def fake_cifar10(root, train=70, test=20):
    """CIFAR-10 as torchvision reads it: cifar-10-batches-py's pickled batches of 32x32 images."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)

    def batch(name, count):
        data = rng.integers(0, 256, (count, 3 * 32 * 32), dtype=np.uint8)
        with open(folder / name, "wb") as f:
            pickle.dump({"data": data, "labels": [i % 10 for i in range(count)]}, f)

    for i in range(1, 6):
        batch(f"data_batch_{i}", train // 5)
    batch("test_batch", test)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return root


def startup(capsys) -> str:
    return capsys.readouterr().out


def notes(recwarn) -> str:
    return "\n".join(str(w.message) for w in recwarn)


def test_the_small_data_command_runs_as_written(tmp_path, capsys, monkeypatch, recwarn):
    # offline here: the generated files stand for the download (torchvision checks the real ones' md5 sums)
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda *args: True)
    root = fake_cifar10(tmp_path / "data")
    out = tmp_path / "run"
    assert main(["train", str(root), *SMALL_DATA, *SMALL, "--out", str(out)]) == 0
    lines = startup(capsys)
    assert "data: cifar10, 70 training images of 10 classes, 224 px" in lines
    assert "init: impulse-neurips" in lines
    assert "--model-kwargs weight_init=skip post_weight_init=impulse: the init --init impulse-neurips" in notes(recwarn)
    assert "--model-ema-decay 0.9999 without --model-ema: no EMA, as in timm" in notes(recwarn)
    assert "steps: 1 an epoch at batch 64, 300 in 300 epochs" in lines
    assert "amp: auto -> " in lines
    assert "ema_test_top1" not in (out / "metrics.jsonl").read_text()


def test_the_imagenet_command_runs_as_written(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "imagenet", 40, per_class=33, splits=("train",))
    make_imagefolder(tmp_path / "imagenet", 41, per_class=2, splits=("val",))  # other bytes than train/'s
    out = tmp_path / "run"
    assert main(["train", str(root), *IMAGENET, *SMALL, "--num-classes", "2", "--out", str(out)]) == 0
    lines = startup(capsys)
    assert "66 training images of 2 classes, 224 px; evaluated on val/ (4 images" in lines
    assert "init: mimetic[base=kaiming]" in lines
    assert "epochs in all: 310 (300 + 10 of cool-down at --min-lr 1e-05, as timm's train.py)" in lines
    assert "lr: 6.25e-05 = --lr-base 0.0005 x (64 x 1 / 512), linear as timm's train.py" in lines
    assert "timm's -b is per process" in lines
    assert "--aug-repeats 3: off in one process" in lines
    assert "steps: 1 an epoch at batch 64, 310 in 310 epochs" in lines


@pytest.mark.parametrize("scale, lr", [("linear", 6.25e-05), ("sqrt", 0.0001768)])
def test_lr_base_scales_with_the_global_batch_as_timm(scale, lr):
    from structinit.training.settings import TrainConfig

    config = TrainConfig(lr_base=5e-4, lr_base_size=512, lr_base_scale=scale, batch_size=64, quiet=True)
    assert config.peak_lr == pytest.approx(lr, rel=1e-3)
    # timm's default scale: sqrt for adamw ('ada' in its name), linear for sgd
    assert TrainConfig(lr_base=0.1, batch_size=64, grad_accum_steps=4).peak_lr == pytest.approx(0.1)
    assert TrainConfig(lr_base=0.1, batch_size=64, opt="sgd").peak_lr == pytest.approx(0.025)


def test_the_imagenet_command_runs_under_torchrun(tmp_path):
    """`torchrun ... -m structinit train` in place of `torchrun ... train.py`: two processes (gloo on a CPU)."""
    root = make_imagefolder(tmp_path / "imagenet", 40, per_class=33, splits=("train",))
    make_imagefolder(tmp_path / "imagenet", 41, per_class=2, splits=("val",))
    out = tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    argv = ["-m", "structinit", "train", str(root), *IMAGENET, *SMALL, "--num-classes", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(structinit.__file__).parents[1])}
    result = subprocess.run([*torchrun, *argv], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[:1500]
    assert "epochs in all: 310 (300 + 10 of cool-down" in result.stdout
    assert "--aug-repeats 3: timm's RepeatAugSampler, each image drawn 3 times across the processes" in result.stdout
    note = "structinit: note: --model-kwargs weight_init=skip post_weight_init=mimetic"
    assert result.stderr.count(note) == 1  # rank 0's, not each process's
    epochs = [json.loads(line)["epoch"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1] and (out / "last.pt").is_file()  # rank 0 wrote one epoch and its checkpoint
