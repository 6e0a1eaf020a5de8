"""Runs you can trust, round two: the record never lies, nothing is deleted that the tool did not
write, one writer per run, no file runs code, data read one way, damaged files named in one line,
no temporary file left behind, numbers checked before any work. Tiny runs on the digits."""

import contextlib
import dataclasses
import errno
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from conftest import make_imagefolder
from structinit import files as files_module
from structinit.cli import main
from structinit.data.datasets import load_data
from structinit.errors import RunError
from structinit.inits.api import initialize
from structinit.studies.grid import compare
from structinit.studies.results import collect
from structinit.training import TrainConfig, read_config, resume_config, train
from structinit.training.identity import identity
from structinit.training.lock import RunLock
from structinit.training.ownership import clear_run
from structinit.training.record import MetricsLog

FAST = dict(data="digits", per_class=20, model="vit_digits", model_kwargs={"depth": 2}, batch_size=50, quiet=True)
FLAGS = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet"]
# a grid of one run (timm, seed 0, 10 images per class) of FAST's model
GRID = ["compare", "--per-class", "10", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet"]
GRID += ["--inits", "timm", "--seeds", "0"]


def files(run: Path) -> dict[str, bytes]:
    kept = [p for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".lock"]
    return {str(p.relative_to(run)): p.read_bytes() for p in kept}


def one_line(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


class Planted:
    """A pickle that runs code when it is opened."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 2-epoch run, copied by the tests that change it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(TrainConfig(**FAST, epochs=2, out=str(run)))
    return run


def copy_run(run: Path, to: Path) -> Path:

    shutil.copytree(run, to, ignore=shutil.ignore_patterns(".lock"))
    return to


# --- the record never lies ------------------------------------------------------------------------


def test_a_change_to_a_finished_run_that_trains_nothing_is_refused_and_writes_nothing(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path / "run")
    before = files(run)
    assert main(["train", "--out", str(run), "--resume", "--lr", "0.5", "--quiet"]) == 2
    one_line(capsys, "has done 2 of its epochs, so --lr 0.5 would change nothing", "add --epochs N")
    assert files(run) == before
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 0  # nothing asked: a no-op
    assert files(run) == before


def test_a_resume_that_diverges_leaves_no_record_and_the_next_resume_is_recorded_as_trained(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "3", "--stop-after", "1", "--out", str(run)]) == 0
    assert main(["train", "--out", str(run), "--resume", "--lr", "1e9", "--quiet"]) == 2
    capsys.readouterr()
    assert read_config(run / "config.yaml").lr == 1e-3  # what was trained, not what diverged
    assert not [r for r in MetricsLog(run).records() if "event" in r]
    assert main(["train", "--out", str(run), "--resume", "--lr", "0.001", "--quiet"]) == 0
    config = read_config(run / "config.yaml")
    assert config.lr == 1e-3 and config.epochs == 3
    # the recorded config repeats the run: the same identity as the checkpoint's
    saved = torch.load(run / "last.pt", map_location="cpu", weights_only=True)["config"]
    assert identity({**saved, "resume": False}) == identity(vars(config))


def test_a_resume_change_is_recorded_with_its_first_checkpoint_and_a_crash_before_the_record_is_repaired(
    tmp_path, monkeypatch
):
    run = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=2, out=str(run)))
    real = files_module.atomic_write_text

    def crash(path, text, then=""):
        if Path(path).name == "config.yaml":
            raise KeyboardInterrupt  # just after the checkpoint of epoch 3 became durable
        return real(path, text, then)

    monkeypatch.setattr("structinit.training.rundir.atomic_write_text", crash)
    with pytest.raises(KeyboardInterrupt):
        train(resume_config(run, epochs=3, lr=5e-4))
    monkeypatch.undo()
    assert read_config(run / "config.yaml").lr == 1e-3  # the crash left the record behind the checkpoint
    train(resume_config(run))  # nothing asked: the checkpoint's settings, and the record repaired
    config = read_config(run / "config.yaml")
    assert (config.epochs, config.lr) == (3, 5e-4)
    events = [r for r in MetricsLog(run).records() if "event" in r]
    assert events == [{"event": "resume", "after_epoch": 2, "changed": {"epochs": [2, 3], "lr": [1e-3, 5e-4]}}]
    assert [r["epoch"] for r in MetricsLog(run).epochs()] == [1, 2, 3]
    assert json.loads((run / "summary.json").read_text())["epochs_done"] == 3


def test_a_resume_of_a_hard_linked_copy_leaves_the_original_as_it_was(finished, tmp_path):
    original = copy_run(finished, tmp_path / "original")
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-al", str(original), str(copy)], check=True)  # the copy shares every file
    before = files(original)
    train(resume_config(copy, epochs=3))
    assert files(original) == before
    assert [r["epoch"] for r in MetricsLog(copy).epochs()] == [1, 2, 3]


def test_a_stop_after_the_run_is_past_is_refused_and_writes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "3", "--stop-after", "2", "--out", str(run)]) == 0
    before = files(run)
    assert main(["train", "--out", str(run), "--resume", "--stop-after", "1", "--quiet"]) == 2
    one_line(capsys, "--stop-after 1:", "has already done 2 epochs, so it would train nothing")
    assert files(run) == before


def test_a_summary_the_run_did_not_write_is_refused_and_the_runs_own_stale_one_is_replaced(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path / "run")
    mine = json.dumps({**json.loads((run / "summary.json").read_text()), "test_top1": 99.0, "test_top5": 99.5})
    (run / "summary.json").write_text(mine)  # the user's, over the run's
    assert main(["train", "--out", str(run), "--resume", "--epochs", "3", "--quiet"]) == 2
    one_line(capsys, "summary.json is not this run's", "move it away")
    assert (run / "summary.json").read_text() == mine
    own = copy_run(finished, tmp_path / "own")
    train(resume_config(own, epochs=3))  # its own summary of 2 epochs goes; one of 3 is written
    assert json.loads((own / "summary.json").read_text())["epochs_done"] == 3


# --- nothing deleted that the tool did not write ----------------------------------------------------


def test_a_finished_run_without_checkpoints_is_never_overwritten(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path / "run")
    (run / "last.pt").unlink()
    (run / "prev.pt").unlink()
    before = files(run)
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(run)]) == 2
    one_line(capsys, "holds a run's results (summary.json, metrics.jsonl)", "use another --out")
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 2
    err = one_line(capsys, "has no last.pt to resume from", "its results stay")
    assert "without --resume" not in err
    assert files(run) == before


def test_a_config_no_run_wrote_is_not_overwritten_and_foreign_files_stay(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.yaml").write_text("lr: 0.1\n")  # the user's own settings file
    (out / "notes.txt").write_text("keep me")
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(out)]) == 2
    one_line(capsys, "config.yaml was not written by a run of this directory")
    assert (out / "config.yaml").read_text() == "lr: 0.1\n"
    (out / "config.yaml").unlink()
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(out)]) == 0
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_run_that_stopped_before_its_first_checkpoint_starts_over(tmp_path, monkeypatch):
    out = tmp_path / "run"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("structinit.training.run.Run.train_epoch", crash)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**FAST, epochs=1, snapshot_epochs=[0], out=str(out)))
    monkeypatch.undo()
    assert (out / "config.yaml").exists() and (out / "snapshots" / "epoch_0000.pt").exists()
    train(TrainConfig(**FAST, epochs=1, out=str(out)))
    assert not (out / "snapshots").exists()  # its own unfinished work, cleared
    assert read_config(out / "config.yaml").snapshot_epochs == []


def test_rerun_deletes_only_the_runs_own_files_and_never_a_run_in_use(tmp_path, capsys):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    compare(base, ["timm"], [0], [10], tmp_path)
    run = tmp_path / "per_class_10" / "timm-seed0"
    (run / "notes.txt").write_text("keep me")
    before = files(run)
    argv = [*GRID, "--epochs", "2", "--out", str(tmp_path), "--rerun"]
    with RunLock(run):  # a `train --resume` of this run, live
        assert main(argv) == 2
    one_line(capsys, f"{run} is in use by pid")
    assert files(run) == before
    assert main(argv) == 0
    capsys.readouterr()
    assert (run / "notes.txt").read_text() == "keep me"
    assert read_config(run / "config.yaml").epochs == 2


def test_rerun_and_a_fresh_start_delete_only_the_snapshots_and_events_the_run_kept(tmp_path, capsys):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    compare(base, ["timm"], [0], [10], tmp_path)
    run = tmp_path / "per_class_10" / "timm-seed0"
    (run / "snapshots").mkdir()
    (run / "snapshots" / "epoch_0005.pt").write_bytes(b"the user's")
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out.tfevents.1.host").write_bytes(b"the user's")
    before = files(run)
    assert main([*GRID, "--epochs", "2", "--out", str(tmp_path), "--rerun"]) == 2
    one_line(capsys, "snapshots/epoch_0005.pt", "which a run writes and no unfinished run of this directory did")
    assert files(run) == before  # nothing deleted: the run's own results stay too
    out = tmp_path / "unfinished"
    (out / "tensorboard").mkdir(parents=True)
    (out / "tensorboard" / "events.out.tfevents.2.host").write_bytes(b"the user's")
    with pytest.raises(RunError, match=r"tensorboard/events\.out\.tfevents\.2\.host, which a run writes"):
        train(TrainConfig(**FAST, epochs=1, out=str(out)))


def test_kept_snapshots_are_the_runs_own_even_after_a_resume_changed_which(tmp_path):
    run = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=2, stop_after=1, snapshot_epochs=[1], out=str(run)))
    train(resume_config(run, snapshot_epochs=[2]))
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["epoch_0001.pt", "epoch_0002.pt"]
    removed = clear_run(run)
    assert {p.name for p in removed} >= {"epoch_0001.pt", "epoch_0002.pt", "last.pt", "config.yaml"}
    assert not run.exists() or not any(p.name != ".lock" for p in run.iterdir())


def test_a_run_a_resume_trained_partly_at_another_learning_rate_is_of_another_recipe(tmp_path):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=3)
    compare(dataclasses.replace(base, stop_after=1), ["timm"], [0], [10], tmp_path)
    run = tmp_path / "per_class_10" / "timm-seed0"
    train(resume_config(run, lr=0.5, stop_after=2))
    train(resume_config(run, lr=base.lr))  # set back: config.yaml says the grid's lr again
    assert read_config(run / "config.yaml").lr == base.lr
    compare(base, ["timm"], [1], [10], tmp_path)
    with pytest.raises(RunError, match=r"resumes that changed --lr 0\.001 -> 0\.5 after epoch 1"):
        compare(base, ["timm"], [0, 1], [10], tmp_path)
    recipes = {row["seed"]: row["recipe"] for row in collect(tmp_path)}
    assert recipes[0] != recipes[1]  # never averaged with the runs trained as they say


def test_a_run_leaves_no_lock_file_finished_or_refused_and_a_lock_removed_under_a_waiter_is_taken_anew(
    finished, tmp_path, capsys, monkeypatch
):
    assert not (finished / ".lock").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("lr: 0.1\n")
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(mine)]) == 2
    capsys.readouterr()
    assert sorted(p.name for p in mine.iterdir()) == ["config.yaml"]
    import fcntl

    real, locked = fcntl.flock, []

    def holder_leaves_just_then(file, flags):  # the holder removes .lock as this process locks it
        real(file, flags)
        if not locked:
            (tmp_path / "free" / ".lock").unlink()
        locked.append(os.fstat(file.fileno()).st_ino)

    monkeypatch.setattr(fcntl, "flock", holder_leaves_just_then)
    with RunLock(tmp_path / "free") as lock:
        assert len(locked) == 2 and os.fstat(lock.file.fileno()).st_ino == (tmp_path / "free" / ".lock").stat().st_ino


def test_a_resume_refuses_files_ahead_of_it_that_the_run_did_not_write(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "3", "--stop-after", "1", "--out", str(run)]) == 0
    (run / "snapshots").mkdir()
    (run / "snapshots" / "epoch_0003.pt").write_text("mine")
    before = files(run)
    assert main(["train", "--out", str(run), "--resume", "--snapshot-epochs", "3", "--quiet"]) == 2
    one_line(capsys, "snapshots/epoch_0003.pt is not this run's (it is at epoch 1)", "move it away")
    assert files(run) == before
    (run / "snapshots" / "epoch_0003.pt").unlink()
    (run / "prev.pt").write_text("mine")  # the run has no prev.pt yet after one epoch
    before = files(run)
    assert main(["train", "--out", str(run), "--resume", "--quiet"]) == 2
    one_line(capsys, "prev.pt is not this run's")
    assert files(run) == before
    (run / "prev.pt").unlink()
    assert main(["train", "--out", str(run), "--resume", "--stop-after", "2", "--quiet"]) == 0
    assert main(["train", "--out", str(run), "--resume", "--lr", "5e-4", "--quiet"]) == 0  # its own prev.pt


def test_a_resume_stopped_before_its_first_checkpoint_leaves_no_logger_file(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=3, stop_after=1, out=str(run)))

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("structinit.training.run.Run.train_epoch", crash)
    with pytest.raises(KeyboardInterrupt):
        train(resume_config(run, log=["tensorboard"]))
    monkeypatch.undo()
    assert not (run / "tensorboard").exists()
    train(resume_config(run, log=["tensorboard"], stop_after=2))
    assert len(list((run / "tensorboard").iterdir())) == 1
    assert {p.name for p in clear_run(run)} >= {"last.pt", "metrics.jsonl"}  # its events are its own


def test_a_hard_linked_copy_of_a_run_gets_a_lock_of_its_own(tmp_path):
    original = tmp_path / "a"
    original.mkdir()
    (original / ".lock").write_text("pid 1 (run)")  # left by kill -9
    subprocess.run(["cp", "-al", str(original), str(tmp_path / "b")], check=True)
    with RunLock(original), RunLock(tmp_path / "b"):
        assert (original / ".lock").stat().st_ino != (tmp_path / "b" / ".lock").stat().st_ino


def test_a_hard_linked_copy_made_while_a_run_trains_lets_no_second_process_in(tmp_path):
    run = tmp_path / "a"
    with RunLock(run):
        subprocess.run(["cp", "-al", str(run), str(tmp_path / "b")], check=True)  # .lock now has two links
        with pytest.raises(RunError, match="is in use by pid"):
            RunLock(run).__enter__()
        with pytest.raises(RunError, match="is in use by pid"):
            RunLock(tmp_path / "b").__enter__()  # the copy's lock is the holder's file: refused, never stolen


def test_an_epoch_checkpointed_has_its_snapshot_whenever_the_process_stops(tmp_path, monkeypatch):
    run = tmp_path / "run"
    real = MetricsLog.append

    def stopped(self, *records):
        real(self, *records)
        raise KeyboardInterrupt  # just after epoch 1's line: its checkpoint is written

    monkeypatch.setattr(MetricsLog, "append", stopped)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**FAST, epochs=2, snapshot_epochs=[1], out=str(run)))
    monkeypatch.undo()
    assert (run / "snapshots" / "epoch_0001.pt").exists()
    train(resume_config(run))
    assert [r["epoch"] for r in MetricsLog(run).epochs()] == [1, 2]


def test_prev_copied_over_last_resumes_over_the_runs_own_later_snapshot_and_leaves_no_temporary(tmp_path):
    run = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=4, snapshot_epochs=[2], stop_after=2, out=str(run)))
    snapshot = (run / "snapshots" / "epoch_0002.pt").read_bytes()
    shutil.copy(run / "prev.pt", run / "last.pt")  # what the damaged-checkpoint message says to do
    (run / "prev.pt").unlink()
    os.link(run / "last.pt", run / "prev.pt")  # as a kill -9 between a checkpoint's two renames leaves them
    train(resume_config(run))
    assert (run / "snapshots" / "epoch_0002.pt").read_bytes() == snapshot  # the same weights again
    assert not [p for p in run.iterdir() if ".tmp" in p.name]


# --- no file runs code ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["checkpoint_path", "pretrained_cfg_overlay"])
def test_model_keywords_that_load_files_are_refused_everywhere_before_anything_is_opened(
    finished, tmp_path, capsys, key
):
    marker = tmp_path / "code-ran"
    evil = tmp_path / "evil.pth"
    torch.save({"x": Planted(marker)}, evil)
    value = str(evil) if key == "checkpoint_path" else {"file": str(evil)}
    run = copy_run(finished, tmp_path / "run")
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["model_kwargs"] = {**config["model_kwargs"], key: value}
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    for argv in (
        ["attention", str(run), "--at-init", "--out", str(tmp_path / "a.png")],
        ["rank", str(run), "--at-init", "--out", str(tmp_path / "r.png")],
        ["train", "-c", str(run / "config.yaml"), "--out", str(tmp_path / "again")],
        ["init", "vit_digits", "--model-kwargs", f"{key}={evil}"],
    ):
        assert main(argv) == 2, argv
        one_line(capsys, f"--model-kwargs {key}: structinit does not load weights")
    assert not marker.exists() and not (tmp_path / "again").exists()


def test_upgrade_checkpoint_never_runs_code(tmp_path, capsys):
    marker = tmp_path / "code-ran"
    path = tmp_path / "last.pt"
    torch.save({"model": {}, "epoch": 1, "rng": Planted(marker)}, path)
    assert main(["upgrade-checkpoint", str(path)]) == 2
    one_line(capsys, "holds objects no structinit checkpoint holds", "not converted")
    assert not marker.exists()


# --- data read one way --------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [8, 72])  # in memory, and streamed through DataLoaders
def test_a_link_loop_in_the_data_is_refused_on_both_paths(tmp_path, size):
    root = make_imagefolder(tmp_path / "data", size)
    (root / "train" / "cat" / "loop").symlink_to("..")
    with pytest.raises(ValueError, match=r"cat/loop leads to .*train again \(a link loop"):
        load_data(f"imagefolder:{root}")


def test_both_paths_list_the_same_images_and_follow_links_to_folders(tmp_path):
    for size in (8, 72):
        root = make_imagefolder(tmp_path / f"data{size}", size)
        elsewhere = make_imagefolder(tmp_path / f"more{size}", size, classes=("cat",), splits=("extra",))
        shutil.rmtree(root / "train" / "cat")
        (root / "train" / "cat").symlink_to(elsewhere / "extra" / "cat")  # a class folder that is a link
        data = load_data(f"imagefolder:{root}")
        labels = data.train_labels.tolist()
        assert labels == [0] * 4 + [1] * 4, size
        if size > 64:
            assert data.train.files[:4] == [root / "train" / "cat" / f"{i}.png" for i in range(4)]


def test_one_class_is_refused(tmp_path):
    root = make_imagefolder(tmp_path / "data", 8, classes=("cat",))
    with pytest.raises(ValueError, match="one class \\(cat\\); a classifier needs two or more"):
        load_data(f"imagefolder:{root}")


def test_a_corrupt_large_image_is_named_in_one_line_by_a_worker(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "data", 72, per_class=2)
    bad = root / "train" / "dog" / "1.png"
    bad.write_bytes(b"not a png")
    argv = ["train", "--data", f"imagefolder:{root}", "--model", "vit_digits", "--batch-size", "2"]
    argv += ["--model-kwargs", "depth=1,img_size=72,patch_size=24", "--workers", "1", "--epochs", "1"]
    assert main([*argv, "--quiet", "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, f"cannot read image {bad}", "remove or replace it")


def test_images_changed_under_a_stopped_run_are_refused_on_resume(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "data", 8, per_class=4)
    argv = ["train", "--data", f"imagefolder:{root}", "--model", "vit_digits", "--batch-size", "4"]
    argv += ["--model-kwargs", "depth=1", "--cache-dir", str(tmp_path / "cache"), "--quiet"]
    run = tmp_path / "run"
    assert main([*argv, "--epochs", "2", "--stop-after", "1", "--out", str(run)]) == 0
    pixels = np.zeros((8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "train" / "cat" / "0.png")
    assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 2
    one_line(capsys, "changed since its checkpoint", "resume it on the data it trained on")


def test_a_damaged_image_cache_is_decoded_again(tmp_path):
    root = make_imagefolder(tmp_path / "data", 8)
    cache = tmp_path / "cache"
    first = load_data(f"imagefolder:{root}", cache_dir=cache)
    for path in cache.glob("images-*.pt"):
        path.write_bytes(b"garbage")
    again = load_data(f"imagefolder:{root}", cache_dir=cache)
    assert torch.equal(first.train_images, again.train_images)
    replaced = {torch.load(p, weights_only=True).shape[0] for p in cache.glob("images-*.pt")}
    assert replaced == {8}  # both splits' caches whole again (4 images x 2 classes each)


# --- damaged files: one line, naming the file and the fix ---------------------------------------------


@pytest.mark.parametrize(
    ("damage", "command", "message"),
    [
        ("metrics.jsonl", "compare", "metrics.jsonl line 2 is not an epoch or event record"),
        ("metrics.jsonl", "resume", "metrics.jsonl line 2 is not an epoch or event record"),
        ("config.yaml", "attention", "config.yaml is damaged (not valid YAML"),
        ("config.yaml truncated", "attention", "config.yaml is truncated"),
        ("summary.json", "compare", "summary.json is damaged"),
        ("init_report.json", "compare", "init_report.json is damaged"),
        ("last.pt", "resume", "last.pt is truncated or damaged, or not a checkpoint"),
    ],
)
def test_a_damaged_file_is_one_line_naming_it(tmp_path, capsys, damage, command, message):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=2)
    compare(base, ["timm"], [0], [10], tmp_path)
    run = tmp_path / "per_class_10" / "timm-seed0"
    name = damage.split()[0]
    text = (run / name).read_bytes()
    if damage == "metrics.jsonl":
        lines = text.decode().splitlines()
        (run / name).write_text("\n".join([lines[0], "[1, 2]", *lines[1:]]) + "\n")
    elif damage.endswith("truncated"):
        (run / name).write_bytes(text[: len(text) // 2].rstrip(b"\n") + b"x")
    elif name == "config.yaml":
        (run / name).write_text("lr: [unclosed\n")
    else:
        (run / name).write_bytes(os.urandom(64))
    argv = {
        "compare": [*GRID, "--epochs", "2", "--out", str(tmp_path)],
        "resume": ["train", "--resume", "--out", str(run), "--epochs", "3", "--quiet"],
        "attention": ["attention", str(run), "--out", str(tmp_path / "a.png")],
    }[command]
    assert main(argv) == 2
    err = one_line(capsys, str(run / name), message)
    assert "upgrade-checkpoint" not in err


# --- no temporary file survives -----------------------------------------------------------------------


def test_ctrl_c_during_a_checkpoint_write_leaves_no_temporary_file(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real, calls = torch.save, {"n": 0}

    def interrupted(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            f.write(b"half")
            raise KeyboardInterrupt
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr("structinit.training.checkpoint.torch.save", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**FAST, epochs=3, out=str(out)))
    monkeypatch.undo()
    assert not [p for p in out.iterdir() if ".tmp" in p.name]


def test_temporary_files_that_kill_minus_nine_left_are_removed_on_resume(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=2, stop_after=1, out=str(out)))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = [out / f".last.pt.tmp{dead.stdout.strip()}", out / f".config.yaml.tmp{dead.stdout.strip()}"]
    for path in stale:
        path.write_bytes(b"half")
    (out / ".notes.tmp1").write_text("not ours")
    train(resume_config(out))
    assert not any(p.exists() for p in stale) and (out / ".notes.tmp1").exists()


@pytest.mark.parametrize("where", ["metrics", "summary"])
def test_a_full_disk_while_writing_the_record_is_one_line(tmp_path, monkeypatch, capsys, where):
    out = tmp_path / "run"
    if where == "metrics":
        real_open = open

        def full(path, mode="r", *args, **kwargs):
            if str(path).endswith("metrics.jsonl") and "a" in mode:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_open(path, mode, *args, **kwargs)

        monkeypatch.setattr("builtins.open", full)
    else:
        real_fsync = files_module.os.fsync

        def full(fd):
            if ".summary.json.tmp" in os.readlink(f"/proc/self/fd/{fd}"):
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_fsync(fd)

        monkeypatch.setattr(files_module.os, "fsync", full)
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(out)]) == 2
    monkeypatch.undo()
    one_line(capsys, "no space left on the device holding", "free some")
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0  # and it goes on
    assert (out / "summary.json").exists()


# --- numbers: finite and in range before any work -------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lr", "nan"], "--lr takes a finite number, got nan"),
        (["--smoothing", "nan"], "--smoothing takes a finite number, got nan"),
        (["--weight-decay", "nan"], "--weight-decay takes a finite number, got nan"),
        (["--warmup-epochs", "nan"], "--warmup-epochs takes a finite number, got nan"),
        (["--min-lr", "nan"], "--min-lr takes a finite number, got nan"),
        (["--weight-decay", "inf"], "--weight-decay takes a finite number, got inf"),
        (["--seed", "-1"], "--seed must be >= 0 and <= 4294967295, got -1"),
        (["--seed", str(2**32)], "--seed must be >= 0 and <= 4294967295, got 4294967296"),
        (["--subset-seed", "-3"], "--subset-seed must be >= 0"),
        (["--init", "impulse[pos_scale=inf]"], "option pos_scale of the impulse init takes a number, got 'inf'"),
        (["--lr", "1e308"], "--lr 1e+308 does not fit in float32"),
        (["--min-lr", "0.01"], "--min-lr 0.01 exceeds --lr 0.001: the cosine schedule would climb"),
        (["--device", "meta"], "--device 'meta': expected auto, cpu, cuda, cuda:N or mps"),
        (["--train-fraction", "0.5"], "give --per-class or --train-fraction, not both"),
        (["--randaugment", "garbage"], "--randaugment takes timm's"),
        (["--data", "imagefolder:"], "--data imagefolder needs a path"),
        (["--data", "nonsense"], "unknown dataset 'nonsense'"),
        (["--snapshot-epochs", "0,0,1"], "--snapshot-epochs takes distinct integers"),
        (["--model-kwargs", "num_classes=3"], "--model-kwargs num_classes: the data sets it"),  # joins FLAGS
        (["--model-kwargs", "depth=1,depth=2"], "--model-kwargs: depth is given twice"),
        (["--init", "impulse[kernel_size=3,kernel_size=5]"], "kernel_size is given twice"),
    ],
)
def test_a_number_out_of_range_is_one_line_before_any_directory_is_made(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "1", *argv, "--out", str(out)]) == 2
    one_line(capsys, message)
    assert not out.exists()


def test_compare_refuses_a_seed_out_of_range_or_listed_twice_before_any_directory(tmp_path, capsys):
    for seeds, message in (("0,0", "--seeds lists 0 twice"), ("0,-1", "--seed must be >= 0")):
        assert main(["compare", "--inits", "timm", "--seeds", seeds, "--out", str(tmp_path / "grid")]) == 2
        one_line(capsys, message)
    assert not (tmp_path / "grid").exists()


def test_a_non_finite_init_option_is_refused_before_the_model_is_touched(make_vit):
    model = make_vit(depth=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for value, message in (
        (float("nan"), "pos_scale must be > 0 or None, got nan"),
        (float("inf"), "option pos_scale of the impulse init takes a finite number, got inf"),
    ):
        with pytest.raises(ValueError, match=message):
            initialize(model, "impulse", pos_scale=value, seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_an_init_that_makes_weights_non_finite_is_refused_and_nothing_is_saved(tmp_path, capsys):
    path = tmp_path / "init.safetensors"
    argv = ["init", "vit_digits", "--init", "impulse[pos_scale=1e41]", "--save", str(path)]
    assert main(argv) == 2
    one_line(capsys, "made", "not finite", "create it again")
    assert not path.exists()


# --- API and CLI edges ---------------------------------------------------------------------------------


def test_initialize_on_the_meta_device_is_one_line():
    import timm

    with torch.device("meta"):
        model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1)
    with pytest.raises(ValueError, match=r"on the meta device.*to_empty"):
        initialize(model, "impulse", seed=0)


def test_init_json_into_a_missing_folder_fails_before_the_weights_are_saved(tmp_path, capsys):
    path = tmp_path / "init.safetensors"
    argv = ["init", "vit_digits", "--save", str(path), "--json", str(tmp_path / "missing" / "init.json")]
    assert main(argv) == 2
    one_line(capsys, "missing does not exist: create it first")
    assert not path.exists()


@pytest.mark.parametrize("command", ["attention", "rank"])
def test_a_figure_out_that_is_a_directory_or_not_an_image_is_one_line(tmp_path, capsys, command):
    folder = tmp_path / "figures"
    folder.mkdir()
    assert main([command, "vit_digits", "--out", str(folder)]) == 2
    one_line(capsys, "is a directory: give a file name")
    assert main([command, "vit_digits", "--out", str(tmp_path / "figure")]) == 2
    one_line(capsys, "name a .png, .pdf, .svg file")
    assert not list(tmp_path.glob("*.png"))


def test_the_planted_payload_runs_code_when_unpickled(tmp_path):
    """The tests above would notice: unpickling the payload creates its marker."""
    pickle.loads(pickle.dumps(Planted(tmp_path / "ran")))
    assert (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("eval_every: 1.5", ": eval_every takes an integer, got 1.5"),
        ("snapshot_epochs: [0.5]", ": snapshot_epochs takes a list of integers, got [0.5]"),
        ("eval_batch_size: 100.0", ": eval_batch_size takes an integer, got 100.0"),
        ("workers: 2.0", ": workers takes an integer, got 2.0"),
        ("subset_seed: 0.5", ": subset_seed takes an integer, got 0.5"),
        ("val_per_class: true", ": val_per_class takes an integer, got True"),
        ("lr: !!python/object:os.system ls", "not valid YAML"),
        ("flip: 'false'", ": flip takes true or false, got 'false'"),
        ("init: 5", ": init takes text, got 5"),
        ("data: [1, 2]", ": data takes text, got [1, 2]"),
        ("log: tensorboard", ": log takes a list of names, got 'tensorboard'"),
        ("epochs: 1\nepochs: 2", "epochs given twice"),
    ],
)
def test_a_config_file_setting_of_the_wrong_type_is_one_line_before_any_directory(tmp_path, capsys, line, message):
    settings = tmp_path / "settings.yaml"
    settings.write_text(line + "\n")
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "1", "-c", str(settings), "--out", str(out)]) == 2
    one_line(capsys, message)
    assert not out.exists()


def test_files_a_run_writes_are_never_overwritten_unless_an_unfinished_run_of_this_directory_wrote_them(
    finished, tmp_path, capsys
):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "init_report.json").write_text('{"mine": true}')
    copied = tmp_path / "copied"
    (copied / "snapshots").mkdir(parents=True)
    (copied / "config.yaml").write_bytes((finished / "config.yaml").read_bytes())  # another run's config
    (copied / "snapshots" / "epoch_0007.pt").write_text("mine")
    for out, message in (
        (mine, "holds init_report.json, which a run writes"),
        (copied, "not written by a run of this"),
    ):
        before = files(out)
        assert main(["train", *FLAGS, "--epochs", "1", "--out", str(out)]) == 2
        one_line(capsys, message, "use another --out")
        assert files(out) == before


def test_compare_writes_no_results_over_files_of_a_directory_without_a_grid(tmp_path, capsys):
    (tmp_path / "results.md").write_text("my notes")
    assert main([*GRID, "--epochs", "1", "--out", str(tmp_path)]) == 2
    one_line(capsys, "holds results.md but no grid's runs")
    assert (tmp_path / "results.md").read_text() == "my notes" and not (tmp_path / "per_class_10").exists()


def test_compare_never_takes_or_reruns_a_config_no_run_wrote(tmp_path, capsys):
    run = tmp_path / "per_class_10" / "timm-seed0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("lr: 1\n")
    (run / "init_report.json").write_text("{}")
    before = files(run)
    for extra in ([], ["--rerun"]):
        assert main([*GRID, "--epochs", "1", "--out", str(tmp_path), *extra]) == 2
        one_line(capsys, "config.yaml was not written by a run: use another --out")
    assert files(run) == before


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory) -> Path:
    """A finished grid of one 2-epoch run (timm, seed 0, 10 per class)."""
    out = tmp_path_factory.mktemp("grid")
    compare(TrainConfig(**{**FAST, "per_class": None}, epochs=2), ["timm"], [0], [10], out)
    return out


def _edit_summary(run: Path) -> None:
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "test_top1": 99.0, "test_top5": 99.5}))


def _tear_the_last_line(run: Path) -> None:
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:-40])


def _edit_config(run: Path) -> None:
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("lr: 0.001\n", "lr: 0.002\n"))


def _strip_a_line(run: Path) -> None:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(['{"epoch": 1}', *lines[1:]]) + "\n")


REPAIRED = "structinit train --resume --out RUN puts it back"


@pytest.mark.parametrize(
    "damage, message, fix, repaired",
    [
        (_edit_summary, "summary.json is not the run's", REPAIRED, True),
        (
            lambda run: (run / "summary.json").write_text("{}"),
            "summary.json is damaged (its 'finished' is missing)",
            "delete it and run the grid again",
            True,
        ),
        (_tear_the_last_line, "metrics.jsonl ends at epoch 1, its summary.json at 2", REPAIRED, True),
        (_edit_config, "config.yaml says other --lr than its last.pt", REPAIRED, True),
        (
            _strip_a_line,
            "metrics.jsonl line 1 is not an epoch or event record (its 'train_loss' is missing)",
            "remove the damaged line",
            False,
        ),
    ],
    ids=["edited summary", "empty summary", "torn last line", "edited config", "line without its numbers"],
)
def test_compare_tabulates_only_a_whole_record(finished_grid, tmp_path, capsys, damage, message, fix, repaired):
    out = tmp_path / "grid"

    shutil.copytree(finished_grid, out)
    run = out / "per_class_10" / "timm-seed0"
    damage(run)
    argv = [*GRID, "--epochs", "2", "--out", str(out)]
    assert main([*argv, "--lr", "0.002"] if damage is _edit_config else argv) == 2  # the recipe it now says
    one_line(capsys, message, fix)
    if repaired:
        if "summary" in message:
            (run / "summary.json").unlink()
        assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 0
        assert main(argv) == 0
        assert "99.0" not in (out / "results.csv").read_text()


@pytest.mark.parametrize("event", ['{"event": "resume", "changed": "x"}', '{"event": "resume", "changed": {"lr": 5}}'])
def test_a_damaged_resume_event_is_named_by_its_line(finished_grid, tmp_path, capsys, event):
    out = tmp_path / "grid"
    shutil.copytree(finished_grid, out)
    log = out / "per_class_10" / "timm-seed0" / "metrics.jsonl"
    log.write_text(log.read_text() + event + "\n" + log.read_text().splitlines()[-1] + "\n")
    assert main([*GRID, "--epochs", "2", "--out", str(out)]) == 2
    one_line(capsys, "metrics.jsonl line 3 is not an epoch or event record", "remove the damaged line")


def test_a_moved_grid_whose_run_has_no_checkpoint_is_named_not_deleted(tmp_path, capsys, monkeypatch):
    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("structinit.training.run.Run.train_epoch", crash)
    with pytest.raises(KeyboardInterrupt):
        compare(TrainConfig(**{**FAST, "per_class": None}, epochs=2), ["timm"], [0], [10], tmp_path / "old")
    monkeypatch.undo()
    (tmp_path / "old").rename(tmp_path / "new")
    run = tmp_path / "new" / "per_class_10" / "timm-seed0"
    before = files(run)
    assert main([*GRID, "--epochs", "2", "--out", str(tmp_path / "new")]) == 2
    one_line(capsys, "holds the start of a run of another directory", "delete that folder to train the run here")
    assert files(run) == before


def test_a_finished_grid_moved_without_its_checkpoints_is_collected_not_refused(finished_grid, tmp_path, capsys):
    """As a lent GPU sends its runs back (their small files, no last.pt): nothing trains, the table is made."""
    out = tmp_path / "returned"
    shutil.copytree(finished_grid, out, ignore=shutil.ignore_patterns("*.pt"))
    assert main([*GRID, "--epochs", "2", "--out", str(out)]) == 0
    assert "timm" in (out / "results.csv").read_text()
    assert not list(out.rglob("*.pt"))


def test_sigterm_stops_a_parallel_grid_at_once_and_leaves_no_lock(tmp_path):
    out = tmp_path / "grid"
    command = [sys.executable, "-m", "structinit", *GRID[:-4], "--inits", "timm,kaiming", "--seeds", "0,1"]
    command += ["--parallel", "2", "--threads", "1", "--epochs", "400", "--out", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    # both runs of the first pair checkpointed (one alone may be ahead before the other has started)
    while process.poll() is None and len(list(out.glob("*/*/last.pt"))) < 2 and time.monotonic() - start < 300:
        time.sleep(0.1)
    process.terminate()
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130 and "interrupted" in err, err
    runs = [p.parent for p in out.glob("*/*/config.yaml")]
    assert len(runs) == 2  # the other two never started
    assert not list(out.glob("*/*/summary.json"))  # stopped, not trained to the end
    assert not list(out.rglob(".lock")) and not list(out.rglob("*.tmp*"))


@pytest.mark.parametrize("whom", ["the grid's process", "its process group"])
def test_sigterm_stops_a_parallel_grid_of_a_script_and_its_workers_exit(tmp_path, whom):
    # a benchmark script calls run_configs itself, without the CLI's SIGTERM handler
    out = tmp_path / "grid"
    script = (
        "import sys; from structinit.studies.grid import run_configs; from structinit.training import TrainConfig\n"
        f"fast = {FAST!r}\n"
        "configs = [TrainConfig(**fast, init=i, epochs=400, out=sys.argv[1] + '/' + i) for i in ('timm', 'kaiming')]\n"
        "run_configs(configs, parallel=2, threads=1)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script, str(out)], stderr=subprocess.PIPE, start_new_session=True)
    start = time.monotonic()
    while process.poll() is None and len(list(out.glob("*/last.pt"))) < 2 and time.monotonic() - start < 300:
        time.sleep(0.1)
    if whom == "its process group":
        os.killpg(process.pid, signal.SIGTERM)
    else:
        process.terminate()
    try:
        process.communicate(timeout=120)  # returns only when every worker, holding the pipe, has exited
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # what a failed check would leave behind
    assert process.returncode != 0
    assert not list(out.glob("*/summary.json")) and not list(out.rglob(".lock")) and not list(out.rglob("*.tmp*"))


def test_a_moved_grid_is_compared_and_resumed_but_its_runs_are_not_rerun(tmp_path, capsys):
    old, new = tmp_path / "old", tmp_path / "new"
    compare(TrainConfig(**{**FAST, "per_class": None}, epochs=2, stop_after=1), ["timm"], [0], [10], old)
    old.rename(new)
    assert main([*GRID, "--epochs", "2", "--out", str(new)]) == 0  # the moved run goes on
    assert [r["epoch"] for r in MetricsLog(new / "per_class_10" / "timm-seed0").epochs()] == [1, 2]
    newer = tmp_path / "newer"
    new.rename(newer)  # finished: compared as it is
    (newer / "results.md").unlink()
    assert main([*GRID, "--epochs", "2", "--out", str(newer)]) == 0
    assert "timm" in (newer / "results.md").read_text()
    run = newer / "per_class_10" / "timm-seed0"
    before = files(run)
    capsys.readouterr()
    assert main([*GRID, "--epochs", "3", "--out", str(newer), "--rerun"]) == 2
    one_line(capsys, "records a run of another directory (moved or copied here)")
    assert files(run) == before


@pytest.mark.parametrize("change", ["no optimizer", "another shape"])
def test_a_checkpoint_that_does_not_fit_its_run_is_one_line(finished, tmp_path, capsys, change):
    run = copy_run(finished, tmp_path / "run")
    state = torch.load(run / "last.pt", map_location="cpu", weights_only=True)
    if change == "no optimizer":
        del state["optimizer"]
    else:
        state["model"]["pos_embed"] = torch.zeros(1, 3, 64)
    torch.save(state, run / "last.pt")
    assert main(["train", "--resume", "--out", str(run), "--epochs", "3", "--quiet"]) == 2
    one_line(capsys, "last.pt does not fit its run", "prev.pt")
    if change == "another shape":
        assert main(["rank", str(run), "--out", str(tmp_path / "r.png")]) == 2
        one_line(capsys, "last.pt does not fit the model")


@pytest.mark.parametrize("kwargs", ["depth=-1", "depth=1,num_heads=3", "depth=1,act_layer=os.system"])
def test_a_model_timm_cannot_build_is_one_line(capsys, kwargs):
    assert main(["init", "vit_digits", "--model-kwargs", kwargs]) == 2
    one_line(capsys, "vit_digits cannot be built with")


def test_grid_and_init_edges_are_one_line_and_write_nothing(tmp_path, capsys):
    assert main(["compare", "--inits", "", "--seeds", "0", "--out", str(tmp_path / "grid")]) == 2
    one_line(capsys, "--inits lists nothing")
    weights = tmp_path / "w.pth"
    assert main(["init", "vit_digits", "--save", str(weights), "--json", str(weights)]) == 2
    one_line(capsys, "--json and --save both name")
    assert not weights.exists() and not (tmp_path / "grid").exists()


def test_upgrade_checkpoint_on_a_missing_or_current_file_is_one_line_and_changes_nothing(finished, tmp_path, capsys):
    assert main(["upgrade-checkpoint", str(tmp_path / "none.pt")]) == 2
    one_line(capsys, "no such checkpoint file")
    run = copy_run(finished, tmp_path / "run")
    before = (run / "last.pt").read_bytes()
    assert main(["upgrade-checkpoint", str(run / "last.pt")]) == 2
    one_line(capsys, "already in the current format")
    assert (run / "last.pt").read_bytes() == before


def test_a_file_link_that_puts_an_image_in_two_classes_is_refused(tmp_path):
    root = make_imagefolder(tmp_path / "data", 8)
    (root / "train" / "dog" / "stolen.png").symlink_to(root / "train" / "cat" / "0.png")
    with pytest.raises(ValueError, match=r"dog/stolen.png leads to .*cat/0.png again"):
        load_data(f"imagefolder:{root}")


def test_a_resume_records_where_and_how_far_it_goes_with_its_first_checkpoint(tmp_path):
    run = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=3, stop_after=1, out=str(run)))
    train(resume_config(run, workers=0, stop_after=2))
    recorded = read_config(run / "config.yaml")
    assert (recorded.workers, recorded.stop_after) == (0, 2)
    train(resume_config(run))
    assert read_config(run / "config.yaml").stop_after is None


def test_snapshots_a_resume_cannot_keep_are_refused_and_a_file_in_their_place_is_named(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "3", "--stop-after", "1", "--out", str(run)]) == 0
    before = files(run)
    assert main(["train", "--resume", "--out", str(run), "--snapshot-epochs", "0,3", "--quiet"]) == 2
    one_line(capsys, "--snapshot-epochs 0: the run is past them")
    (run / "snapshots").write_text("mine")
    assert main(["train", "--resume", "--out", str(run), "--snapshot-epochs", "3", "--quiet"]) == 2
    one_line(capsys, "snapshots is a file, where the run keeps its snapshots: move it away")
    assert files(run) == {**before, "snapshots": b"mine"}


def test_a_fresh_run_that_cannot_start_leaves_no_directory(tmp_path, capsys):
    out = tmp_path / "a" / "b"
    for kwargs in ("depth=1,num_heads=3", "depth=0"):  # unbuildable; built, but nothing to initialise
        assert (
            main(
                ["train", *FLAGS[:2], "--model-kwargs", kwargs, "--init", "impulse", "--epochs", "1", "--out", str(out)]
            )
            == 2
        )
        capsys.readouterr()
        assert not (tmp_path / "a").exists()
    assert main(["train", *FLAGS[:2], "--model-kwargs", "depth=1,num_heads=3", "--out", str(out)]) == 2
    one_line(capsys, "cannot be built with")


def test_sigterm_is_an_interrupt_that_leaves_no_temporary_file(tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "structinit", "train", *FLAGS, "--epochs", "50", "--out", str(out)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    while process.poll() is None and not (out / "last.pt").exists():
        time.sleep(0.05)
    process.terminate()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "interrupted; finished epochs are checkpointed" in err
    assert not [p for p in out.iterdir() if ".tmp" in p.name]


def test_a_file_where_a_folder_belongs_is_one_line_naming_the_flag(tmp_path, capsys):
    """The data folder, a grid's --out and --cache-dir given as files (or a FIFO): one line saying what
    the path is, where a bare "File exists" or "does not exist" came before."""
    (tmp_path / "f").write_text("notes\n")
    os.mkfifo(tmp_path / "pipe")
    data = make_imagefolder(tmp_path / "data", 8, per_class=2)
    for argv, message in [
        (["train", *FLAGS, "--data", f"imagefolder:{tmp_path / 'pipe'}", "--out", str(tmp_path / "r1")], "is a file"),
        (["train", *FLAGS, "--data", f"imagefolder:{data}", "--cache-dir", str(tmp_path / "f")], "is not a directory"),
        ([*GRID, "--out", str(tmp_path / "f")], f"--out {tmp_path / 'f'} is a file: give a directory for the grid"),
    ]:
        assert main(argv) != 0
        one_line(capsys, message)
    assert (tmp_path / "f").read_text() == "notes\n"
