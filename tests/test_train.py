"""The trainer: resume equivalence, divergence handling, DDP, grids and figures, on the digits."""

import csv
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from structinit.cli import main
from structinit.data.datasets import load_data
from structinit.studies.grid import compare
from structinit.training import TrainConfig, resume_config, train
from structinit.training import recipe as recipe_module
from structinit.training import run as train_module
from structinit.training.device import prefer_math_attention, resolve_amp
from structinit.training.provenance import device_name
from structinit.training.run import TrainingDiverged

FAST = dict(data="digits", per_class=20, model="vit_digits", model_kwargs={"depth": 2}, batch_size=50, quiet=True)


def deterministic_metrics(run):
    """metrics.jsonl without the wall-clock columns."""
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in m.items() if k not in ("time", "img_per_s", "epoch_seconds", "eval_seconds")} for m in lines
    ]


def test_stopped_and_resumed_run_ends_bit_identical(tmp_path):
    # RandAugment too: each image's draws come from the epoch's generator, so the resumed epochs draw the same
    augment = {"ema_decay": 0.9, "randaugment": "rand-m9-n2-mstd0.5"}
    config = TrainConfig(**FAST, epochs=3, **augment, out=str(tmp_path / "full"))
    train(config)
    part = TrainConfig(**FAST, epochs=3, **augment, out=str(tmp_path / "part"), stop_after=1)
    summary = train(part)
    assert not summary["finished"] and not (tmp_path / "part" / "summary.json").exists()
    train(resume_config(tmp_path / "part"))
    a = torch.load(tmp_path / "full" / "last.pt", map_location="cpu", weights_only=False)
    b = torch.load(tmp_path / "part" / "last.pt", map_location="cpu", weights_only=False)
    for key in ("model", "ema"):
        for name, value in a[key].items():
            assert torch.equal(value, b[key][name]), (key, name)
    assert a["epoch"] == b["epoch"] == 3
    assert deterministic_metrics(tmp_path / "full") == deterministic_metrics(tmp_path / "part")
    assert json.loads((tmp_path / "part" / "summary.json").read_text())["finished"]


@pytest.mark.parametrize(("check_every", "good_steps", "step"), [(50, 5, 2), (3, 5, 2), (3, 7, 4), (1, 6, 3)])
def test_a_diverging_loss_stops_the_run_and_keeps_the_last_good_checkpoint(
    tmp_path, monkeypatch, check_every, good_steps, step
):
    """The losses are checked every `check_every` steps and at the epoch's end (4 steps here): the
    message names the first step whose loss was not finite, whichever check finds it."""
    real = recipe_module.LabelSmoothingCrossEntropy
    calls = {"n": 0}

    class Diverging(real):
        def forward(self, x, target):
            calls["n"] += 1
            loss = super().forward(x, target)
            return loss * float("nan") if calls["n"] > good_steps else loss  # dies in epoch 2

    monkeypatch.setattr(recipe_module, "LabelSmoothingCrossEntropy", Diverging)
    monkeypatch.setattr(train_module, "FINITE_CHECK_STEPS", check_every)
    message = rf"the loss became nan at epoch 2, step {step}; the last good checkpoint"
    with pytest.raises(TrainingDiverged, match=message):
        train(TrainConfig(**FAST, epochs=3, out=str(tmp_path / "run")))
    assert torch.load(tmp_path / "run" / "last.pt", map_location="cpu", weights_only=False)["epoch"] == 1


def test_existing_runs_are_not_overwritten_and_resume_needs_a_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "run")
    args = ["train", "--per-class", "10", "--epochs", "1", "--batch-size", "50", "--quiet", "--out", out]
    assert main(args) == 0
    assert "finished: test top-1" in capsys.readouterr().out
    assert main(args) == 2
    assert "already holds a run: it is finished (1 epoch): --resume --epochs N" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(tmp_path / "none")]) == 2
    assert "--resume: there is no run in" in capsys.readouterr().err


def test_compare_runs_the_grid_writes_tables_and_skips_finished_runs(tmp_path):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    rows = compare(base, ["timm", "impulse"], [0, 1], [10], tmp_path)
    assert len(rows) == 4
    header, *lines = (tmp_path / "results.csv").read_text().splitlines()
    assert header == (
        "dataset,model,heads,per_class,init,seed,epochs,steps,split,images,top1,best_top1,epochs_to_timm,top5,secs,"
        "train_loss,recipe,device,precision"
    )
    assert len(lines) == 4 and all(line.startswith("digits,vit_digits,4,10,") for line in lines)
    cpu = torch.device("cpu")  # where each run ran, as its config.yaml recorded it
    precision = {None: "float32", torch.bfloat16: "bfloat16"}[resolve_amp("auto", cpu)]
    with open(tmp_path / "results.csv") as f:
        assert {(r["device"], r["precision"]) for r in csv.DictReader(f)} == {(device_name(cpu), precision)}
    table = (tmp_path / "results.md").read_text()
    assert "**digits**, vit_digits, 4 heads, 10 training images per class, 1 epochs" in table
    assert "| impulse | 2 |" in table and "| 360 |" in table  # digits' test images
    assert (tmp_path / "curves.png").stat().st_size > 10_000
    before = (tmp_path / "per_class_10" / "timm-seed0" / "metrics.jsonl").read_text()
    compare(base, ["timm", "impulse"], [0, 1], [10], tmp_path)  # all finished: nothing reruns
    assert (tmp_path / "per_class_10" / "timm-seed0" / "metrics.jsonl").read_text() == before


def test_attention_figures_for_a_run_and_for_a_model(tmp_path, capsys):
    run = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=1, out=str(run)))
    for args in (
        [str(run), "--out", str(tmp_path / "a.png")],
        [str(run), "--at-init", "--out", str(tmp_path / "b.png")],
    ):
        assert main(["attention", *args]) == 0
    assert (
        main(["attention", "vit_digits", "--init", "mimetic", "--images", "8", "--out", str(tmp_path / "c.png")]) == 0
    )
    for name in "abc":
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000
    assert main(["attention", str(tmp_path), "--out", str(tmp_path / "d.png")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_on_cpu_with_two_processes_matches_one_process(tmp_path):
    """Two gloo processes, each with half of every batch, train the same model as one process with
    the whole batch (same data order and augmentation; the gradients are averaged): the metrics agree
    to float precision."""
    flags = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--epochs", "2"]
    flags += ["--amp", "none", "--quiet"]
    single = tmp_path / "single"
    assert main(["train", *flags, "--out", str(single)]) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
    ]
    command += ["-m", "structinit", "train", *flags, "--out", str(tmp_path / "ddp")]
    subprocess.run(command, check=True, env=env, capture_output=True, timeout=300)
    one = [json.loads(line) for line in (single / "metrics.jsonl").read_text().splitlines()]
    two = [json.loads(line) for line in (tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()]
    assert len(one) == len(two) == 2
    for a, b in zip(one, two):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=1e-4)
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)
        assert b["test_top1"] == pytest.approx(a["test_top1"], abs=0.3)  # one image of 360 may flip


def test_the_full_recipe_runs_and_reports_the_ema(tmp_path):
    config = TrainConfig(
        **FAST,
        epochs=1,
        mixup=0.8,
        cutmix=1.0,
        reprob=0.25,
        randaugment="rand-m9-mstd0.5-inc1",
        ema_decay=0.99,
        clip_grad=1.0,
        drop_path=0.1,
        out=str(tmp_path / "run"),
    )
    summary = train(config)
    assert summary["finished"] and torch.isfinite(torch.tensor(summary["train_loss"]))
    assert {"ema_test_top1", "ema_test_top5", "ema_test_loss"} <= set(summary)


def test_presets_fill_the_config_and_flags_override_them():
    config = TrainConfig.from_preset("small-data", epochs=5)
    assert (config.epochs, config.lr, config.mixup, config.warmup_epochs) == (5, 2e-3, 0.8, 50)
    with pytest.raises(ValueError, match="unknown preset 'fast'; presets: cpu-quick, imagenet, small-data"):
        TrainConfig.from_preset("fast")


def test_init_labels_reach_the_init_and_eval_every_skips_test_epochs(tmp_path):
    label = "impulse-neurips[qk_scale=2,kernel_size=5]"
    run = tmp_path / "run"
    train(TrainConfig(**FAST, init=label, epochs=3, eval_every=2, out=str(run)))
    report = json.loads((run / "init_report.json").read_text())
    assert report["method"] == "impulse"
    assert report["options"]["solver"] == "authors" and report["options"]["qk_scale"] == 2
    assert report["options"]["kernel_size"] == 5 and report["options"]["assignment"] == "ordered"
    evaluated = [m["epoch"] for m in deterministic_metrics(run) if "test_top1" in m]
    assert evaluated == [2, 3]  # every 2nd epoch, and the last
    with pytest.raises(ValueError, match="unknown init 'xavier'"):
        TrainConfig(**FAST, init="xavier")


def test_convmixer_reference_trains_as_constructed(tmp_path):
    config = TrainConfig(**{**FAST, "model": "convmixer_d6_p4"}, init="default", epochs=1, out=str(tmp_path / "cm"))
    torch.manual_seed(0)
    model, report = recipe_module.model_of(config, load_data("digits", per_class=20))
    assert report.method == "default" and report.layers == []
    depthwise = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert [(m.kernel_size, m.out_channels) for m in depthwise] == [((3, 3), 192)] * 2  # FAST: depth 2
    summary = train(config)
    assert summary["finished"] and summary["init"]["method"] == "default"


def test_cpu_bf16_runs_attention_unfused():
    """(that unfused attention gives the same output is test_models' fused/unfused test)"""
    from conftest import small_vit

    model = small_vit()
    prefer_math_attention(model, torch.device("cpu"), None)  # fp32: fused is faster, stays
    assert all(block.attn.fused_attn for block in model.blocks)
    prefer_math_attention(model, torch.device("cpu"), torch.bfloat16)
    assert not any(block.attn.fused_attn for block in model.blocks)


def test_an_evaluation_subset_is_stratified_used_during_training_and_the_last_evaluation_is_whole(tmp_path):
    from structinit.training import TrainConfig, train

    base = dict(data="digits", per_class=10, epochs=3, batch_size=50, quiet=True, warmup_epochs=1)
    small = {"model_kwargs": {"depth": 1, "embed_dim": 32, "num_heads": 2}}
    train(TrainConfig(**base, **small, eval_per_class=3, out=str(tmp_path / "a")))
    lines = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [m["test_images"] for m in lines] == [30, 30, 360]  # 3 of each of the 10 classes, then all
    assert all(m["eval_seconds"] > 0 for m in lines)
    train(TrainConfig(**base, **small, eval_per_class=3, eval_final="subset", out=str(tmp_path / "b")))
    lines_b = [json.loads(line) for line in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["test_images"] for m in lines_b] == [30, 30, 30]
    assert [m["test_top1"] for m in lines_b[:2]] == [m["test_top1"] for m in lines[:2]]  # the same subset


def test_the_time_left_counts_the_evaluations_still_to_come():
    from structinit.training.progress import Progress

    progress = Progress(0, 4, show=False, split="test", evaluated=lambda epoch: 10_000 if epoch == 4 else 100)
    metrics = {"epoch": 1, "epoch_seconds": 5.0, "eval_seconds": 1.0, "test_images": 100}
    # 3 epochs of 5 s, then 2 evaluations of 100 images and one of 10,000 at 0.01 s an image
    progress.epoch(metrics)
    assert progress.left(1) == pytest.approx(15 + 0.01 * 10_200)


def test_a_batch_larger_than_the_images_is_refused_with_the_batch_that_fits(tmp_path, capsys):
    from conftest import make_imagefolder
    from structinit.cli import main

    folder = make_imagefolder(tmp_path / "photos", 16, per_class=40, classes=("a", "b", "c"))
    assert main(["train", str(folder), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    assert (
        "--batch-size 128 exceeds the 120 training images: give -b 120 or less (-b 8: 15 steps an epoch)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists()


def test_the_default_model_takes_streamed_photos_at_their_own_size_not_its_8_px(tmp_path):
    """Photos over 64 px stream from their files; vit_digits (its patch follows the data) is built for their
    size, up to 224 px, not for the 8 px digits it defaults to; --img-size still decides where given."""
    from conftest import make_imagefolder
    from structinit.training import TrainConfig
    from structinit.training.device import Dist
    from structinit.training.recipe import Recipe, data_of

    folder = make_imagefolder(tmp_path / "photos", 96, per_class=2, classes=("a", "b"))
    for img_size, expected in ((None, 96), (48, 48)):
        config = TrainConfig(data=f"imagefolder:{folder}", img_size=img_size, batch_size=2, quiet=True)
        recipe = Recipe(config, data_of(config), torch.device("cpu"), Dist())
        assert recipe.model.patch_embed.img_size == (expected, expected)
        assert recipe.model.patch_embed.grid_size == (8, 8)
