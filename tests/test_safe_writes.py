"""Runs you can trust, round three: nothing is written through a link planted where the tool writes (a
run's or a grid's directory, a figure), init labels never become paths, and nothing the tool did not
write is replaced or deleted. Tiny runs on the digits."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import make_imagefolder
from structinit.cli import main
from structinit.models import create_model
from structinit.studies.grid import compare
from structinit.training import TrainConfig, train
from test_trust import FAST, FLAGS, one_line


def state(path: Path) -> object:
    """What is at `path`, to compare before and after: a file's bytes, a folder's listing, or nothing."""
    if path.is_dir():
        return sorted(p.name for p in path.iterdir())
    return path.read_bytes() if path.exists() else None


def plant(where: Path, outside: Path, kind: str = "file") -> Path:
    """A link at `where` to `outside`: a file of someone else's, a folder holding one, or nothing yet
    ('dangling')."""
    outside.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        outside.write_bytes(b"someone else's file\n")
    elif kind == "folder":
        outside.mkdir()
        (outside / "mine.txt").write_text("someone else's")
    where.symlink_to(outside)
    return outside


def assert_untouched(capsys, link: Path, outside: Path, before: object) -> None:
    """Refused in one line naming the link, which stays a link, its target as it was."""
    one_line(capsys, f"{link} is a link", "move it away")
    assert link.is_symlink() and state(outside) == before


# --- nothing is written through a link --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [(".lock", "file"), ("metrics.jsonl", "dangling"), ("snapshots", "folder"), ("summary.json", "dangling")],
)
def test_a_fresh_run_writes_nothing_through_a_link_in_its_directory(tmp_path, capsys, name, kind):
    run = tmp_path / "run"
    run.mkdir()
    outside = plant(run / name, tmp_path / "elsewhere" / name, kind)
    before = state(outside)
    assert main(["train", *FLAGS, "--epochs", "1", "--snapshot-epochs", "0", "--out", str(run)]) == 2
    assert_untouched(capsys, run / name, outside, before)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run of 2 epochs stopped after the first, copied by the tests that resume it."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    train(TrainConfig(**FAST, epochs=2, stop_after=1, out=str(run)))
    return run


@pytest.mark.parametrize("name", [".lock", "metrics.jsonl", "last.pt", "snapshots"])
def test_a_resume_writes_nothing_through_a_link_in_its_directory(stopped, tmp_path, capsys, name):
    run = tmp_path / "run"
    shutil.copytree(stopped, run)
    outside = tmp_path / "elsewhere" / name
    if name in ("metrics.jsonl", "last.pt"):  # the run's own file, moved out and linked back
        outside.parent.mkdir()
        (run / name).rename(outside)
        (run / name).symlink_to(outside)
    else:
        plant(run / name, outside, "file" if name == ".lock" else "folder")
    before = state(outside)
    assert main(["train", "--resume", "--out", str(run), "--snapshot-epochs", "2", "--quiet"]) == 2
    assert_untouched(capsys, run / name, outside, before)


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory) -> Path:
    """A finished grid of one 1-epoch run (timm, seed 0, 10 per class), copied by the tests."""
    out = tmp_path_factory.mktemp("grid") / "grid"
    compare(TrainConfig(**FAST, epochs=1), ["timm"], [0], [10], out)
    return out


GRID = ["compare", "--per-class", "10", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet", "--epochs", "1"]
GRID += ["--inits", "timm"]


@pytest.mark.parametrize("name", [".lock", "results.csv", "results.md", "curves.png", "per_class_10"])
def test_compare_writes_nothing_through_a_link_in_its_grid(finished_grid, tmp_path, capsys, name):
    grid = tmp_path / "grid"
    shutil.copytree(finished_grid, grid)
    outside = tmp_path / "elsewhere" / name
    if name == "per_class_10":  # the setting's folder, moved out and linked back: seed 1 would train there
        outside.parent.mkdir()
        (grid / name).rename(outside)
        (grid / name).symlink_to(outside)
    else:
        (grid / name).unlink(missing_ok=True)
        plant(grid / name, outside)
    before = state(outside)
    assert main([*GRID, "--seeds", "0,1", "--out", str(grid)]) == 2
    assert_untouched(capsys, grid / name, outside, before)


def test_compare_removes_the_temporaries_its_interrupted_results_left_and_nothing_else(finished_grid, tmp_path):
    grid = tmp_path / "grid"
    shutil.copytree(finished_grid, grid)
    dead = dead_pid()
    ours, theirs = grid / f".results.csv.tmp{dead}", grid / f".results.txt.tmp{dead}"
    for path in (ours, theirs):
        path.write_text("half")
    assert main([*GRID, "--seeds", "0", "--out", str(grid)]) == 0
    assert not ours.exists() and theirs.read_text() == "half"


def test_a_figure_is_not_written_through_a_link(stopped, tmp_path, capsys):
    figure = tmp_path / "attention.png"
    outside = plant(figure, tmp_path / "elsewhere" / "mine.png")
    assert main(["attention", str(stopped), "--images", "4", "--out", str(figure)]) == 2
    assert_untouched(capsys, figure, outside, b"someone else's file\n")


# --- init labels are not paths ------------------------------------------------------------------------------


@pytest.fixture
def teacher(tmp_path) -> Path:
    """Weights of the grid's model, as the teacher of a select label."""
    model = create_model("vit_digits", num_classes=10, in_chans=1, data_size=8, depth=2)
    torch.save(model.state_dict(), tmp_path / "t.pth")
    return tmp_path / "t.pth"


def labels_in(grid: Path) -> list[str]:
    with open(grid / "results.csv") as f:
        return sorted(row["init"] for row in csv.DictReader(f))


def test_a_label_that_reads_as_a_path_trains_its_run_inside_the_grid(teacher, tmp_path, monkeypatch, capsys):
    here = tmp_path / "a" / "b" / "c"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    label = "select[teacher=../../../t.pth]"  # the teacher, three folders up
    assert main([*GRID, "--seeds", "0", "--inits", label, "--out", "grid"]) == 0
    assert "1 runs;" in capsys.readouterr().out
    assert labels_in(here / "grid") == [label]
    assert [p.name for p in here.iterdir()] == ["grid"]  # nothing made beside the grid
    (run,) = (here / "grid" / "per_class_10").iterdir()  # one folder, one level down
    assert (run / "summary.json").exists() and run.name.startswith("select-teacher-t-pth-")


def test_every_label_of_a_grid_is_tabulated_and_a_run_named_by_its_label_stays_where_it_is(teacher, tmp_path, capsys):
    (tmp_path / "escape").mkdir()
    teacher.rename(tmp_path / "escape" / "t.pth")
    inits = ["timm", f"select[teacher={tmp_path}/escape/t.pth]", "impulse[kernel_size=5]"]
    grid = tmp_path / "grid"
    assert main([*GRID, "--seeds", "0", "--inits", ",".join(inits), "--out", str(grid)]) == 0
    assert labels_in(grid) == sorted(inits)
    folders = grid / "per_class_10"
    hashed = next(p for p in folders.iterdir() if p.name.startswith("impulse-kernel_size-5-"))
    hashed.rename(folders / "impulse[kernel_size=5]-seed0")  # as structinit 0.2 named it
    before = sorted(p.name for p in folders.iterdir())
    assert main([*GRID, "--seeds", "0", "--inits", ",".join(inits), "--out", str(grid)]) == 0
    assert labels_in(grid) == sorted(inits) and sorted(p.name for p in folders.iterdir()) == before


# --- nothing the tool did not write is replaced or deleted ----------------------------------------------------

INIT = ["init", "vit_digits", "--model-kwargs", "depth=1,num_classes=10,in_chans=1,img_size=8", "--init", "timm"]


@pytest.mark.parametrize("flag", ["--save", "--json"])
def test_init_replaces_an_existing_file_only_with_overwrite(stopped, tmp_path, capsys, flag):
    checkpoint = tmp_path / ("last.pt" if flag == "--save" else "init.json")
    shutil.copyfile(stopped / "last.pt", checkpoint)  # a training checkpoint, say
    before = checkpoint.read_bytes()
    other = ["--json", str(tmp_path / "report.json")] if flag == "--save" else ["--save", str(tmp_path / "w.pt")]
    assert main([*INIT, flag, str(checkpoint), *other]) == 2
    one_line(capsys, f"{flag} {checkpoint} exists", "--overwrite")
    assert checkpoint.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == [checkpoint.name]
    assert main([*INIT, flag, str(checkpoint), *other, "--overwrite"]) == 0
    assert checkpoint.read_bytes() != before
    link = tmp_path / ("link.pt" if flag == "--save" else "link.json")
    link.symlink_to(checkpoint)
    kept = checkpoint.read_bytes()
    assert main([*INIT, flag, str(link), "--overwrite"]) == 2  # nor through a link, even when asked
    assert_untouched(capsys, link, checkpoint, kept)


def dead_pid() -> int:
    """The pid of a process that has ended."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def test_a_config_files_cache_dir_loses_no_file_that_only_looks_like_a_temporary(tmp_path):
    root = make_imagefolder(tmp_path / "data", 8, per_class=4)
    cache = tmp_path / "mine"  # a folder of the user's, named as the cache in a -c file
    cache.mkdir()
    dead = dead_pid()
    theirs = [cache / f".images-notes.tmp{dead}", cache / f".images-0123456789abcdef.pt.tmp{dead}"]
    for path in theirs:
        path.write_text("someone else's")
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"data: imagefolder:{root}\ncache_dir: {cache}\nmodel_kwargs: {{depth: 1}}\nbatch_size: 4\n")
    argv = ["train", "-c", str(settings), "--epochs", "1", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "run")]) == 0
    assert all(path.read_text() == "someone else's" for path in theirs)
    stale = []  # the interrupted writes of the splits' caches, left by kill -9: the tool's own, removed
    for own in cache.glob("images-*.pt"):
        stale.append(own.with_name(f".{own.name}.tmp{dead}"))
        stale[-1].write_bytes(b"half")
        own.unlink()
    assert main([*argv, "--out", str(tmp_path / "again")]) == 0
    assert stale and not any(p.exists() for p in stale) and all(p.read_text() == "someone else's" for p in theirs)


@pytest.mark.parametrize(("given", "lock"), [("-c", "text"), ("--out", "text"), ("--out", "fifo")])
def test_a_lock_file_of_someone_elses_is_neither_written_nor_deleted(tmp_path, capsys, given, lock):
    out = tmp_path / "project"
    out.mkdir()
    if lock == "fifo":
        os.mkfifo(out / ".lock")
    else:
        (out / ".lock").write_text("held by my editor\n")

    def kept() -> tuple:
        lock = (out / ".lock").stat()
        return sorted(p.name for p in out.iterdir()), lock.st_ino, lock.st_mtime_ns

    before = kept()
    (tmp_path / "settings.yaml").write_text(f"out: {out}\nper_class: 20\nepochs: 1\n")
    where = ["-c", str(tmp_path / "settings.yaml")] if given == "-c" else ["--out", str(out), "--epochs", "1"]
    assert main(["train", *FLAGS, *where]) == 2
    message = "is not a regular file" if lock == "fifo" else "is not a lock of structinit's"
    one_line(capsys, f"{out / '.lock'} {message}", "move it away")
    assert kept() == before


@pytest.mark.parametrize(
    "argv",
    [
        ["train", *FLAGS, "--epochs", "1", "--out", ""],
        ["train", *FLAGS, "--epochs", "1", "-c", "settings.yaml"],  # out: ''
        [*GRID, "--seeds", "0", "--out", ""],
    ],
    ids=["--out", "-c", "compare"],
)
def test_an_empty_out_is_refused_and_nothing_is_written_here(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "settings.yaml").write_text("out: ''\n")
    assert main(argv) == 2
    one_line(capsys, "--out is empty")
    assert [p.name for p in tmp_path.iterdir()] == ["settings.yaml"]
