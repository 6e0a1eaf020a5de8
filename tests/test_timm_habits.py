"""timm's habits and a busy machine (issue 68): --grad-accum-steps with timm's meaning, --train-split and
--val-split naming an image folder's split folders, OpenMP threads that do not spin long."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import make_imagefolder
from structinit.cli import main
from structinit.data.datasets import load_data
from structinit.training import TrainConfig, train
from structinit.training import recipe as recipe_module
from structinit.training.device import Dist
from structinit.training.recipe import Recipe, data_of

FAST = dict(data="digits", per_class=20, model="vit_digits", model_kwargs={"depth": 2}, quiet=True, amp="none")


def test_two_accumulated_half_batches_take_the_step_of_one_whole_batch():
    """SGD without momentum moves the weights by lr x the gradient: the mean of two halves' gradients,
    each loss taken at half its weight, is the whole batch's (to float32 rounding)."""
    config = TrainConfig(**FAST, batch_size=50, opt="momentum", momentum=0.0, lr=0.5, warmup_epochs=0)
    data = data_of(config)
    whole, halves = (Recipe(config, data, torch.device("cpu"), Dist()) for _ in range(2))
    start = [p.detach().clone() for p in whole.model.parameters()]
    for recipe in (whole, halves):
        recipe.schedule(4, 0)
    images, labels = torch.randn(50, 1, 8, 8, generator=torch.Generator().manual_seed(0)), torch.arange(50) % 10
    whole.step(images, labels, 0)
    halves.step(images[:25], labels[:25], None, 0.5)
    assert all(torch.equal(p, q) for p, q in zip(halves.model.parameters(), start))  # not yet a step
    halves.step(images[25:], labels[25:], 0, 0.5)
    moved = max((p - q).abs().max().item() for p, q in zip(whole.model.parameters(), start))
    gap = max((p - q).abs().max().item() for p, q in zip(whole.model.parameters(), halves.model.parameters()))
    assert moved > 1e-3 and gap < 1e-6


def test_an_epoch_takes_one_step_per_accumulated_batches_and_the_schedule_counts_steps(tmp_path, monkeypatch):
    """200 images in batches of 50 with --grad-accum-steps 3: 4 batches, 2 steps an epoch (3 batches, then
    the last alone at its full weight, as timm's last_accum_steps); the lr schedule counts those steps,
    as a run of 2 steps an epoch (batches of 100) does."""
    calls, step = [], Recipe.step

    def spy(self, images, labels, update, share=1.0):
        calls.append((update, round(share, 6)))
        return step(self, images, labels, update, share)

    monkeypatch.setattr(recipe_module.Recipe, "step", spy)
    train(TrainConfig(**FAST, batch_size=50, grad_accum_steps=3, epochs=2, out=str(tmp_path / "a")))
    third = round(1 / 3, 6)
    assert calls == [
        (None, third),
        (None, third),
        (0, third),
        (1, 1.0),
        (None, third),
        (None, third),
        (2, third),
        (3, 1.0),
    ]
    train(TrainConfig(**FAST, batch_size=100, epochs=2, out=str(tmp_path / "b")))
    a, b = ([json.loads(line) for line in (tmp_path / r / "metrics.jsonl").read_text().splitlines()] for r in "ab")
    assert [m["step"] for m in a] == [m["step"] for m in b] == [2, 4]
    assert [m["lr"] for m in a] == [m["lr"] for m in b]
    startup = json.loads((tmp_path / "a" / "init_report.json").read_text())["startup"]
    assert "steps: 2 an epoch at batch 50 x 3 accumulated, 4 in 2 epochs; warm-up 6 steps (3 epochs)" in startup


def test_importing_structinit_first_shortens_openmps_spin_and_keeps_the_users_value():
    """libgomp reads GOMP_SPINCOUNT when torch loads: `import structinit` sets 3,000 turns before it does
    (docs/bench_contention.md), unless the user set one."""
    show = "import structinit, os, sys; print(os.environ['GOMP_SPINCOUNT'], 'torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    for given, expected in ((None, "3000 False"), ("200000", "200000 False")):
        run_env = env if given is None else {**env, "GOMP_SPINCOUNT": given}
        shown = subprocess.run([sys.executable, "-c", show], env=run_env, capture_output=True, text=True, check=True)
        assert shown.stdout.strip() == expected


def test_timms_split_flags_name_an_image_folders_folders(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "d", 8, splits=("mine", "holdout", "test"))
    data = load_data(f"imagefolder:{root}", splits=("mine", "holdout"))
    default_test = load_data(f"imagefolder:{root}", splits=("mine", None))
    assert len(data.train_labels) == len(data.test_labels) == 8
    assert not torch.equal(data.test_images, default_test.test_images)  # holdout/, not the test/ found first
    with pytest.raises(FileNotFoundError, match=r"\(or give --train-split/--val-split\)"):
        load_data(f"imagefolder:{root}")
    held = "\\['holdout/', 'mine/', 'test/'\\]"
    with pytest.raises(
        FileNotFoundError, match=rf"--train-split nope: {root}/nope is not a folder \({root} holds {held}"
    ):
        load_data(f"imagefolder:{root}", splits=("nope", None))
    with pytest.raises(ValueError, match=r"--val-split '\.\./d': give the name of a folder in .*, e.g. test"):
        load_data(f"imagefolder:{root}", splits=("mine", "../d"))
    with pytest.raises(ValueError, match="--data digits has its own"):
        load_data("digits", splits=("train", None))
    flags = ["--train-split", "mine", "--val-split", "holdout", "--epochs", "1", "-b", "4", "--quiet"]
    assert main(["train", str(root), *flags, "--out", str(tmp_path / "run")]) == 0
    assert main(["train", "--data", "digits", "--val-split", "validation", "--out", str(tmp_path / "r2")]) == 2
    assert "--data digits has its own" in capsys.readouterr().err
