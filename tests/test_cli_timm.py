"""The trainer speaks timm and explains itself (issue 51): timm's optimisers and schedules by their
train.py names, images resized on load, defaults that fit the user's data, -c files read as written,
help on one screen, progress in a log, messages that say what to type."""

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from timm.scheduler import CosineLRScheduler

import structinit
from conftest import SHARP, make_imagefolder
from structinit.cli import main
from structinit.cli.parser import build_parser
from structinit.cli.train_flags import train_config
from structinit.errors import Notice
from structinit.training.config_file import read_config
from structinit.training.identity import config_hash
from structinit.training.run import train
from structinit.training.settings import TrainConfig
from structinit.training.settings_yaml import load_yaml
from test_trust import FAST, FLAGS, copy_run, one_line

TINY = ["--model-kwargs", "depth=1", "--quiet"]


def config_of(run: Path) -> dict:
    return yaml.safe_load((run / "config.yaml").read_text())


def epochs_of(run: Path) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "event" not in r]


@pytest.fixture(scope="module")
def sgd_run(tmp_path_factory) -> Path:
    """A finished run of SGD (momentum 0.8) with a step schedule decaying every epoch (4 steps)."""
    out = tmp_path_factory.mktemp("sgd") / "run"
    argv = ["train", *FLAGS, "--epochs", "2", "--opt", "sgd", "--sched", "step", "--decay-epochs", "1"]
    argv += ["--momentum", "0.8", "--warmup-epochs", "0", "--lr", "0.01", "--min-lr", "0", "--out", str(out)]
    assert main(argv) == 0
    return out


# --- 1. timm's optimisers and schedules, images resized, classes checked, a data directory ---------


def test_sgd_with_a_step_schedule_trains_and_the_run_records_them(sgd_run):
    config = config_of(sgd_run)
    assert (config["opt"], config["sched"], config["momentum"], config["decay_epochs"]) == ("sgd", "step", 0.8, 1)
    assert [e["lr"] for e in epochs_of(sgd_run)] == pytest.approx([1e-3, 1e-4])  # x0.1 after every 4 steps
    groups = torch.load(sgd_run / "last.pt", map_location="cpu", weights_only=True)["optimizer"]["param_groups"]
    assert {g["momentum"] for g in groups} == {0.8} and "betas" not in groups[0]
    recorded = read_config(sgd_run / "config.yaml")
    adamw = dataclasses.replace(recorded, opt="adamw")
    assert config_hash(dataclasses.asdict(recorded)) != config_hash(dataclasses.asdict(adamw))


def test_the_default_optimiser_and_schedule_train_as_before():
    """AdamW and the cosine, now through timm's factories: the numbers of structinit 9d96443, bit for bit,
    and the identity (so every recorded run and ledger row) of a default config as it was, its init label
    aside (0.3 made `auto` the default)."""
    from structinit.training.optimizer import create_optimizer, create_schedule

    assert config_hash(dataclasses.asdict(TrainConfig(init="impulse"))) == "96c440f19c"
    config = TrainConfig(epochs=7, warmup_epochs=1.5)
    model = torch.nn.Linear(2, 2)
    scheduler = create_schedule(create_optimizer(model, config, torch.device("cpu")), config, 9)
    optimizer = torch.optim.AdamW(torch.nn.Linear(2, 2).parameters(), lr=config.lr)
    before = CosineLRScheduler(
        optimizer, t_initial=63, lr_min=config.min_lr, warmup_t=14, warmup_lr_init=config.warmup_lr, t_in_epochs=False
    )
    assert [scheduler._get_lr(t)[0] for t in range(70)] == [before._get_lr(t)[0] for t in range(70)]


def test_a_tiny_default_run_has_the_losses_it_had(tmp_path):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # the default init before 0.3, as it is written now: the same weights, so the same numbers
        config = TrainConfig(
            **{**FAST, "init": SHARP}, epochs=3, warmup_epochs=1.5, amp="none", out=str(tmp_path / "run")
        )
        train(config)
    finally:
        torch.set_num_threads(threads)
    epochs = epochs_of(tmp_path / "run")
    assert [e["train_loss"] for e in epochs] == [2.314188232421875, 2.308441162109375, 2.3013877868652344]
    assert [e["test_top1"] for e in epochs] == [11.11111111111111, 15.277777777777779, 15.0]


def test_an_optimiser_timm_does_not_have_is_one_line(tmp_path, capsys):
    assert main(["train", *FLAGS, "--opt", "adamx", "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, "--opt adamx: timm has no such optimiser; e.g. adamw, adam, sgd")


def mixed_folder(root: Path) -> Path:
    """Two classes of 32 px images, and one 48 px image in each class of each split."""
    make_imagefolder(root, 32)
    for shade, folder in enumerate(sorted(root.glob("*/*"))):
        Image.new("RGB", (48, 48), (50 * shade, 10, 10)).save(folder / "big.png")
    return root


def test_img_size_trains_a_folder_of_mixed_sizes_given_as_a_directory(tmp_path, capsys):
    data = mixed_folder(tmp_path / "data")
    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "run"
    assert main(["train", str(data), "--epochs", "1", "-b", "4", *TINY, *cache, "--out", str(out)]) == 2
    one_line(capsys, "but", "is 32x32", "pass --img-size 32 to resize them as they are loaded")
    argv = ["train", str(data), "--img-size", "32", "--num-classes", "2", "--epochs", "1", "-b", "4", *TINY, *cache]
    with pytest.warns(Notice, match="--model vit_digits on 32 px images: patch 4, 8x8 tokens"):
        assert main([*argv, "--out", str(out)]) == 0
    capsys.readouterr()
    config = config_of(out)
    assert (config["data"], config["img_size"], config["num_classes"]) == (f"imagefolder:{data}", 32, 2)
    assert main(["rank", str(out), "--images", "4", "--out", str(tmp_path / "rank.png")]) == 0  # resized too
    capsys.readouterr()
    again = ["train", str(data), "--input-size", "3", "32", "32", "--epochs", "1", "-b", "4", *TINY, *cache]
    assert main([*again, "--out", str(tmp_path / "again")]) == 0
    assert config_of(tmp_path / "again")["img_size"] == 32
    capsys.readouterr()
    assert main([*again[:-2], "--num-classes", "3", "--out", str(tmp_path / "three")]) == 2
    one_line(capsys, f"--num-classes 3: --data imagefolder:{data} has 2 classes; leave --num-classes out")
    assert main(["train", str(data), "--data", "digits", "--out", str(tmp_path / "both")]) == 2
    one_line(capsys, f"DIR {data} and --data digits both name the data: give one")
    assert main(["train", "--input-size", "3", "32", "48", "--out", str(tmp_path / "oblong")]) == 2
    one_line(capsys, "--input-size 3 32 48: images are resized square; give one size, e.g. --img-size 32")


def test_digits_resized_on_load():
    args = build_parser().parse_args(["train", "--img-size", "16"])
    from structinit.data.datasets import load_data

    data = load_data("digits", per_class=2, img_size=train_config(args).img_size)
    assert data.image_shape == (1, 16, 16) and data.test_images.shape[-2:] == (16, 16)


# --- 2. defaults that fit the data, and messages that name the flag --------------------------------


def test_the_default_model_on_32_px_images_takes_patch_4_and_says_so_as_a_warm_up_as_long_as_the_run(tmp_path):
    """Each a line on the command's stderr (a Notice warning, for Python callers; --quiet silences them)."""
    data = make_imagefolder(tmp_path / "data", 32)
    argv = ["train", str(data), "--epochs", "1", "-b", "4", "--model-kwargs", "depth=1", "--cache-dir", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(Path(structinit.__file__).parents[1])}
    command = [sys.executable, "-m", "structinit", *argv, "--out", str(tmp_path / "run")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, check=True)
    notes = [line for line in result.stderr.splitlines() if line.startswith("structinit: note:")]
    assert notes == [
        "structinit: note: --model vit_digits on 32 px images: patch 4, 8x8 tokens (choose with "
        "--model-kwargs patch_size=P, or another --model: structinit init --list-models)",
        "structinit: note: --warmup-epochs 3 >= --epochs 1: the whole run is warm-up and the lr never reaches "
        "--lr 0.001; give fewer --warmup-epochs",
    ]
    weights = torch.load(tmp_path / "run" / "last.pt", map_location="cpu", weights_only=True)["model"]
    assert weights["patch_embed.proj.weight"].shape[-2:] == (4, 4)


def test_a_kernel_larger_than_the_grid_names_the_patch_that_fits(capsys):
    assert main(["init", "vit_tiny_patch16_224", "--model-kwargs", "img_size=32"]) == 2
    err = one_line(
        capsys,
        "kernel_size 3 does not fit the 2x2 token grid: build the model with patch_size=4 for 8x8 tokens "
        "(--model-kwargs patch_size=4), or use kernel_size 1",
    )
    assert "(odd)" not in err


def test_the_presets_are_listed_with_their_sizes(capsys, monkeypatch):
    from structinit.inspection import catalogue

    monkeypatch.setattr(catalogue, "EXAMPLES", {})  # no family built: the families' fidelities are test_cli's
    assert main(["init", "--list-models"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\n  vit_d6_p4 +64 tokens at 32 px \(patch 4\), width 192, depth 6, 3 heads\n", out)
    assert re.search(r"\n  swin_d6_p2_w4 +256 tokens at 32 px \(patch 2\), width 192, depth 6, 3-6 heads\n", out)
    assert re.search(r"\n  convmixer_d6_p4 +64 tokens at 32 px \(patch 4\), width 192, depth 6, no attention\n", out)


# --- 3. -c files ----------------------------------------------------------------------------------


def test_a_config_file_reads_numbers_as_they_are_written(tmp_path):
    settings = tmp_path / "settings.yaml"
    settings.write_text("lr: 1e-3\nwarmup_lr: 5E-7\nmin_lr: 1.0e-06\nepochs: 10\nopt_betas: [0.9, 99e-2]\n")
    config = train_config(build_parser().parse_args(["train", "-c", str(settings)]))
    assert (config.lr, config.warmup_lr, config.min_lr, config.epochs) == (0.001, 5e-7, 1e-6, 10)
    assert config.opt_betas == [0.9, 0.99] and isinstance(config.epochs, int)
    assert load_yaml("a: 1e3x\nb: 0x10\nc: '1e-3'") == {"a": "1e3x", "b": 16, "c": "1e-3"}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("lr: fast", "lr takes a number, got 'fast'"),
        ("epochs: 2.5", "epochs takes an integer, got 2.5"),
        ("weight_decay: -1e-2", "weight_decay must be >= 0, got -0.01"),
        ("decay_milestones: [1, x]", "decay_milestones takes a list of integers, got [1, 'x']"),
    ],
)
def test_a_config_file_error_names_the_file_and_its_key(tmp_path, capsys, line, message):
    settings = tmp_path / "settings.yaml"
    settings.write_text(line + "\n")
    assert main(["train", *FLAGS, "-c", str(settings), "--out", str(tmp_path / "run")]) == 2
    err = one_line(capsys, f"--config {settings}: {message}")
    assert "--lr" not in err and "--epochs" not in err and "--weight-decay" not in err


# --- 4. help --------------------------------------------------------------------------------------


def subparsers() -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_flag_of_every_command_has_help_and_shows_its_default():
    for command, parser in subparsers().items():
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue  # the removed flags, which say where their setting went
            assert action.help, (command, action.option_strings)
            if action.option_strings and action.nargs != 0:
                shown = parser._get_formatter()._get_help_string(action)
                assert "default" in shown, (command, action.option_strings)


def test_train_help_leads_with_the_common_flags_on_one_screen(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    screen = text[: text.index("\ndata:\n")].splitlines()
    assert len(screen) <= 26, "\n".join(screen)
    for flag in ("--data", "--model", "--init", "--epochs", "--lr", "--batch-size", "--out", "--resume", "--preset"):
        assert f"  {flag}" in "\n".join(screen) or f", {flag}" in "\n".join(screen), flag
    assert "--epochs N            epochs before --cooldown-epochs (default: 30)" in text
    assert "\noptimiser and schedule (timm's factories):\n" in text
    assert "--sched {cosine,tanh,step,multistep,poly}" in text


def test_demo_help_explains_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--epochs EPOCHS epochs of every run (default: sized to this CPU, at most 30)" in text
    assert "--seeds SEEDS comma-separated seeds: each init trained once per seed (default: 0)" in text


# --- 5. progress in a log, and what --resume does ------------------------------------------------


def test_progress_reaches_a_stdout_that_is_not_a_terminal(tmp_path, capsys):
    argv = ["train", *FLAGS[:-1], "--epochs", "2", "--warmup-epochs", "1", "--out", str(tmp_path / "run")]
    with warnings.catch_warnings():
        warnings.simplefilter("error", Notice)  # digits keep vit_digits' patch 1, the warm-up is shorter than the run
        assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == ["data", "model", "init", "  fidelity on 16 images"]
    lines = lines[next(i for i, line in enumerate(lines) if line.startswith("epoch ")) :]  # after the start-up lines
    pattern = r"epoch {}/2: train loss \d\.\d{{4}}, test top-1 \d+\.\d\d%, \d+ img/s, 0:00:\d\d left"
    assert re.fullmatch(pattern.format(1), lines[0]), lines
    assert re.fullmatch(pattern.format(2), lines[1]), lines
    assert lines[2].startswith("finished: test top-1")


def test_a_finished_run_says_what_resume_will_do_and_resume_does_it(sgd_run, tmp_path, capsys):
    run = copy_run(sgd_run, tmp_path / "run")
    assert main(["train", *FLAGS, "--opt", "sgd", "--out", str(run)]) == 2
    one_line(
        capsys,
        f"{run} already holds a run: it is finished (2 epochs): --resume --epochs N, with N above its epochs, "
        "trains it further (--resume alone prints its summary); or give another --out",
    )
    assert main(["train", "--out", str(run), "--resume", "--epochs", "3", "--quiet"]) == 0
    assert [e["epoch"] for e in epochs_of(run)] == [1, 2, 3]


def test_compare_into_a_run_directory_is_refused(sgd_run, tmp_path, capsys):
    run = copy_run(sgd_run, tmp_path / "run")
    argv = ["compare", "--per-class", "10", *TINY, "--batch-size", "50", "--inits", "timm", "--seeds", "0"]
    assert main([*argv, "--out", str(run)]) == 2
    one_line(
        capsys,
        f"--out {run} is a run's directory (it holds config.yaml, last.pt, metrics.jsonl): give the grid a "
        f"directory of its own, e.g. --out {run}-grid",
    )
    assert not (run / "results.md").exists() and not (run / "full").exists()
    shutil.rmtree(run)


# --- timm's habits: --initial-checkpoint, the spaced --model-kwargs, init's --num-classes/--img-size ---------

SMALL = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--per-class", "10", "-b", "16", "--quiet"]


def test_a_saved_init_feeds_train_through_initial_checkpoint_exactly(tmp_path):
    """init --save's file, or a bare state dict, starts the run from exactly its weights."""
    argv = ["init", "vit_digits", "--init", "impulse[target_fidelity=0.9]", "--num-classes", "10", "--img-size", "8"]
    assert (
        main(
            [
                *argv,
                "--model-kwargs",
                "depth=1",
                "embed_dim=32",
                "num_heads=2",
                "in_chans=1",
                "--save",
                str(tmp_path / "i.pt"),
            ]
        )
        == 0
    )
    saved = torch.load(tmp_path / "i.pt", weights_only=True)
    run = ["train", *SMALL, "--epochs", "1", "--snapshot-epochs", "0", "--out", str(tmp_path / "r")]
    assert main([*run, "--initial-checkpoint", str(tmp_path / "i.pt")]) == 0
    start = torch.load(next((tmp_path / "r" / "snapshots").iterdir()), weights_only=True)
    assert all(torch.equal(start[name], tensor) for name, tensor in saved.items())
    record = json.loads((tmp_path / "r" / "init_report.json").read_text())
    assert record["method"] == "initial-checkpoint" and record["source"]["initial_checkpoint"] == str(tmp_path / "i.pt")
    assert record["startup"][2].startswith(f"init: the weights of {tmp_path / 'i.pt'} (--initial-checkpoint)")


def test_initial_checkpoint_of_another_model_is_refused_naming_the_tensors(tmp_path, capsys):
    torch.save({"model": {"pos_embed": torch.zeros(1, 5, 7)}}, tmp_path / "other.pth")
    argv = ["train", *SMALL, "--epochs", "1", "--initial-checkpoint", str(tmp_path / "other.pth")]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "other.pth does not fit the model (1 of another shape: pos_embed (1, 5, 7) (the model's (1, 65, 32))" in err
    assert "missing: " in err and not (tmp_path / "r").exists()


def test_initial_checkpoint_and_an_init_both_given_are_refused(tmp_path, capsys):
    argv = ["train", "--init", "impulse", "--initial-checkpoint", str(tmp_path / "x.pt"), "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "--initial-checkpoint and --init impulse both set the starting weights: give one" in capsys.readouterr().err


def test_a_file_given_as_the_init_points_to_initial_checkpoint(capsys):
    assert main(["train", "--init", "runs/init.safetensors"]) == 2
    assert "a file of weights is --initial-checkpoint FILE" in capsys.readouterr().err


def test_model_kwargs_in_timms_spaced_form_equal_the_comma_form():
    spaced = train_config(build_parser().parse_args(["train", "--model-kwargs", "depth=2", "num_heads=4"]))
    commas = train_config(build_parser().parse_args(["train", "--model-kwargs", "depth=2,num_heads=4"]))
    assert spaced.model_kwargs == commas.model_kwargs == {"depth": 2, "num_heads": 4}


def test_a_folder_after_spaced_model_kwargs_is_named(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--model-kwargs", "depth=2", "photos/"])
    assert "--model-kwargs takes K=V items (a=1 b=2, or a=1,b=2); 'photos/' is not one" in capsys.readouterr().err


def test_init_takes_num_classes_and_img_size(tmp_path, capsys):
    argv = ["init", "vit_tiny_patch16_224", "--num-classes", "7", "--img-size", "32", "--init", "timm"]
    assert main([*argv, "--model-kwargs", "patch_size=4", "--save", str(tmp_path / "i.safetensors")]) == 0
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "i.safetensors"))
    assert weights["head.weight"].shape == (7, 192) and weights["pos_embed"].shape == (1, 65, 192)
    assert main([*argv, "--model-kwargs", "img_size=64"]) == 2
    assert "--img-size 32 and --model-kwargs img_size=64: give one" in capsys.readouterr().err
