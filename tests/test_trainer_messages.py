"""What the trainer says where a run is not what its flags suggest (issue 75): accumulation longer than an
epoch, and a resume given starting weights the run did not start from."""

import json

import pytest
import torch

from structinit.cli import main
from structinit.errors import Notice
from structinit.training import TrainConfig, train

FAST = dict(data="digits", per_class=10, model="vit_digits", model_kwargs={"depth": 1}, quiet=True, amp="none")
FLAGS = ["--data", "digits", "--per-class", "10", "--model-kwargs", "depth=1", "-b", "50", "--quiet"]


def test_accumulation_longer_than_an_epoch_says_each_epoch_is_one_step_of_its_batches(tmp_path):
    """100 images in batches of 50: 2 batches an epoch; timm's train.py ends accumulation with the epoch."""
    with pytest.warns(Notice, match=r"--grad-accum-steps 3 exceeds the 2 batches of an epoch: .* one optimiser step"):
        summary = train(TrainConfig(**FAST, batch_size=50, grad_accum_steps=3, epochs=1, out=str(tmp_path / "a")))
    assert summary["finished"]
    startup = json.loads((tmp_path / "a" / "init_report.json").read_text())["startup"]
    assert "steps: 1 an epoch at batch 50 x 2 accumulated, 1 in 1 epochs; warm-up 3 steps (3 epochs)" in startup


def test_accumulation_within_an_epoch_says_nothing(tmp_path, recwarn):
    train(TrainConfig(**FAST, batch_size=50, grad_accum_steps=2, epochs=1, warmup_epochs=0, out=str(tmp_path / "a")))
    assert not [w for w in recwarn if issubclass(w.category, Notice)]


def files_of(run):
    return {p.name: p.read_bytes() for p in sorted(run.iterdir())}


@pytest.mark.parametrize(
    "started, given, named",
    [
        (["--init", "impulse"], ["--initial-checkpoint"], "--initial-checkpoint '{weights}' (the run has None)"),
        (["--initial-checkpoint"], ["--init", "impulse"], "--init 'impulse' (the run has 'auto')"),
    ],
)
def test_a_resume_given_other_starting_weights_names_the_flag_given_now(tmp_path, capsys, started, given, named):
    weights = tmp_path / "weights.pt"
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(tmp_path / "source")]) == 0
    torch.save(torch.load(tmp_path / "source" / "last.pt", weights_only=True)["model"], weights)
    start = [*started, str(weights)] if started[-1] == "--initial-checkpoint" else started
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "1", *start, "--out", str(run)]) == 0
    before = files_of(run)
    capsys.readouterr()
    again = [*given, str(weights)] if given[-1] == "--initial-checkpoint" else given
    assert main(["train", "--out", str(run), "--resume", "--epochs", "2", *again]) == 2
    err = capsys.readouterr().err
    assert err == f"structinit train: error: --resume cannot change {named.format(weights=weights)}: start a new " + (
        "run with another --out\n"
    )
    assert files_of(run) == before


@pytest.mark.parametrize("flag", ["--mixup", "--cutmix"])
def test_mixing_an_odd_batch_is_one_line_before_the_run_writes(tmp_path, capsys, flag):
    """timm's Mixup pairs each image with its mirror and asserts an even batch: a traceback from inside a grid
    before (found by the invariant harness: compare ... -b 25 --cutmix 1e-9)."""
    out = tmp_path / "odd"
    assert main(["train", *FLAGS[:-3], "-b", "25", flag, "0.2", "--epochs", "1", "--quiet", "--out", str(out)]) == 2
    said = capsys.readouterr().err.strip()
    assert said == (
        "structinit train: error: --mixup/--cutmix mix each image with its mirror in the batch (timm's Mixup): a "
        "batch of 25 a process is odd; give an even --batch-size"
    )
    assert not out.exists()
