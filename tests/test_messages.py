"""Runs you can trust, round three: bounded config files, one line (not a traceback) and the right
line for every failure, and nothing taken silently from the environment or a library call."""

import contextlib
import errno
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import make_imagefolder, small_vit
from structinit import initialize
from structinit.cli import main
from structinit.inits.labels import InitSpec
from structinit.models import build_model
from structinit.studies.grid import compare
from structinit.training import TrainConfig, train
from test_trust import FAST, copy_run, one_line

FLAGS = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet", "--epochs", "1"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 1-epoch run, copied by the tests that change it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(TrainConfig(**FAST, epochs=1, out=str(run)))
    return run


def laughs(levels: int) -> str:
    """YAML of `levels` lists of nine aliases of the list before: 9**levels leaves in a few hundred bytes."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


# --- 6. bounded config files ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        laughs(9) + "epochs: *l8\n",  # a billion leaves, as a setting's value
        "depths: &d [2, 2]\nmodel_kwargs: {depth: 2, depths: *d}\n",  # an alias under model_kwargs
        "classes: &c ['0', '1']\nlog: *c\n",  # a list given twice through an alias
    ],
    ids=["billion-laughs", "model-kwargs", "list"],
)
def test_a_config_file_with_aliases_is_one_line_naming_it_before_anything_is_made(tmp_path, capsys, text):
    settings = tmp_path / "settings.yaml"
    settings.write_text(text)
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "-c", str(settings), "--out", str(out)]) == 2
    one_line(capsys, f"--config {settings}: line ", "anchors and aliases (& and *) are not supported")
    assert not out.exists()


def test_a_runs_config_yaml_with_an_alias_is_named_damaged(finished, tmp_path, capsys):
    run = copy_run(finished, tmp_path / "run")
    config = run / "config.yaml"
    config.write_text(laughs(9) + config.read_text().replace("model_kwargs:\n  depth: 2\n", "model_kwargs: *l8\n"))
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    assert main(["attention", str(run), "--out", str(tmp_path / "a.png")]) == 2
    one_line(capsys, f"{config} is damaged (line 1: anchors and aliases")
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert not (tmp_path / "a.png").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("epochs: 1\n" + "# padding\n" * 7000, "larger than 64 KiB"),
        ("model_kwargs: {depth: " + "[" * 2000 + "]" * 2000 + "}\n", "line 1: nested deeper than 16 levels"),
        ("epochs: 1\nmodel_kwargs: {depth: " + "{a: " * 20 + "1" + "}" * 20 + "}\n", "line 2: nested deeper than 16"),
    ],
    ids=["large", "deep-lists", "deep-mappings"],
)
def test_a_config_file_too_large_or_too_deep_is_one_line_before_anything_is_made(tmp_path, capsys, text, message):
    settings = tmp_path / "settings.yaml"
    settings.write_text(text)
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "-c", str(settings), "--out", str(out)]) == 2
    one_line(capsys, f"--config {settings}: {message}")
    assert not out.exists()


# --- 7. one line, and the right line ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (os.urandom(64) + b"\xff\xfe", "not text (a binary file?)"),
        ("model_kwargs:\n  <<: {depth: 2}\n", "line 2: merge keys (<<) are not supported"),
        ("epochs: 1\n<<: {lr: 0.01}\n", "line 2: merge keys (<<) are not supported"),
        ("epochs: 1\n3: 4\n", "line 2: a key must be a name, got 3"),
        ("epochs: 1\n~: 4\n", "line 2: a key must be a name, got None"),
        ("model_kwargs: {depth: 2, 7: 1}\n", "line 1: a key must be a name, got 7"),
    ],
    ids=["binary", "merge-nested", "merge-top", "integer-key", "null-key", "integer-model-keyword"],
)
def test_a_config_file_that_is_not_settings_is_named_with_the_reason(tmp_path, capsys, content, message):
    settings = tmp_path / "settings.yaml"
    settings.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "-c", str(settings), "--out", str(out)]) == 2
    one_line(capsys, f"--config {settings}: {message}")
    assert not out.exists()


def test_a_directory_or_a_pipe_given_as_a_config_file_is_named_for_what_it_is(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "-c", str(tmp_path), "--out", str(out)]) == 2
    one_line(capsys, f"--config {tmp_path}: a directory, not a file")
    pipe = tmp_path / "settings.yaml"
    os.mkfifo(pipe)
    assert main(["train", *FLAGS, "-c", str(pipe), "--out", str(out)]) == 2  # not read: it would wait forever
    one_line(capsys, f"--config {pipe}: {pipe} is a FIFO, not a regular file")
    assert not out.exists()


def test_ctrl_c_on_a_parallel_grid_is_one_line_from_every_process(tmp_path):
    """Ctrl-C reaches the grid's whole process group, a worker between runs too: the workers print
    nothing, the grid one line. The long run goes first, so the short one has a worker of its own."""
    out = tmp_path / "grid"
    command = [sys.executable, "-m", "structinit", "compare", "--inits", "timm", "--seeds", "0", "--quiet"]
    command += ["--per-class", "120,5", "--model-kwargs", "depth=2", "--batch-size", "50", "--epochs", "10"]
    command += ["--eval-every", "10", "--parallel", "2", "--threads", "1", "--out", str(out)]
    process = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # not ignored, as in a test runner's shell
    )
    long, short = out / "per_class_120" / "timm-seed0", out / "per_class_5" / "timm-seed0"
    start = time.monotonic()
    while process.poll() is None and not (short / "summary.json").exists() and time.monotonic() - start < 300:
        time.sleep(0.05)
    try:
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)  # returns only when every worker, holding the pipe, has exited
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, err
    (line,) = err.splitlines()  # the grid's one line, saying what its folder holds at that moment
    assert re.fullmatch(
        f"structinit compare: interrupted; finished epochs are checkpointed: {out} holds 1 finished run"
        "( and 1 with finished epochs to resume)?; run the same command again: finished runs are skipped, "
        "interrupted ones resume",
        line,
    ), err
    assert not (long / "summary.json").exists()  # stopped while it trained (its first epoch may be unfinished)
    assert not list(out.rglob(".lock")) and not list(out.rglob("*.tmp*"))


@pytest.mark.parametrize("keyword", ["embed_dim=0", "patch_size=0", "num_heads=0"])
def test_a_model_keyword_timm_divides_by_is_one_line(tmp_path, capsys, keyword):
    assert main(["init", "vit_digits", "--model-kwargs", keyword]) == 2
    one_line(capsys, f"vit_digits cannot be built with {{'{keyword.split('=')[0]}': 0}}")
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--model-kwargs", keyword, "--out", str(out)]) == 2
    one_line(capsys, "vit_digits cannot be built with")
    assert not out.exists()


def limited_file_size(limit: int):
    """A subprocess's `ulimit -f` (Python ignores SIGXFSZ, so a write past it fails with EFBIG)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.parametrize(
    ("flags", "written"), [([], "last.pt"), (["--snapshot-epochs", "0"], "snapshots/epoch_0000.pt")]
)
def test_a_file_size_limit_inside_torch_save_is_one_line(tmp_path, flags, written):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "structinit", "train", *FLAGS, *flags, "--warmup-epochs", "0", "--out", str(out)]
    process = subprocess.run(command, stderr=subprocess.PIPE, text=True, preexec_fn=limited_file_size(60_000))
    assert process.returncode == 2, process.stderr
    assert process.stderr.splitlines() == [f"structinit train: error: cannot write {out / written}: File too large"]
    assert not out.exists()  # a fresh run that could not start removes its folder


def test_a_full_disk_at_the_first_checkpoint_says_to_run_it_again_not_to_resume(tmp_path, capsys, monkeypatch):
    def full(obj, f, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full)
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--out", str(out)]) == 2
    err = one_line(capsys, f"no space left on the device holding {out / 'last.pt'}: free some and run it again")
    assert "--resume" not in err and not out.exists()


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """A finished grid of one 1-epoch run (timm, seed 0, 10 per class)."""
    out = tmp_path_factory.mktemp("grid")
    compare(TrainConfig(**{**FAST, "per_class": None}, epochs=1), ["timm"], [0], [10], out)
    return out


DEEP = "[" * 100_000 + "]" * 100_000  # JSON that Python's parser cannot read: a RecursionError


def compare_over_damaged(grid: Path, tmp_path: Path, name: str, text: str) -> Path:
    """A copy of the finished grid with its run's file `name` replaced by `text`, compared again (and
    refused); returns the damaged file."""
    out = tmp_path / "grid"
    shutil.copytree(grid, out, ignore=shutil.ignore_patterns(".lock"))
    damaged = out / "per_class_10" / "timm-seed0" / name
    damaged.write_text(text)
    argv = ["compare", "--inits", "timm", "--seeds", "0", "--per-class", "10", "--model-kwargs", "depth=2"]
    assert main([*argv, "--batch-size", "50", "--epochs", "1", "--quiet", "--out", str(out)]) == 2
    return damaged


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("summary.json", DEEP),
        ("init_report.json", '{"layers": ' + DEEP + "}"),
        ("metrics.jsonl", DEEP + "\n{}\n"),
    ],
)
def test_a_deeply_nested_record_is_one_line_naming_it(grid, tmp_path, capsys, name, text):
    damaged = compare_over_damaged(grid, tmp_path, name, text)
    one_line(capsys, f"{damaged} ", "damaged")


@pytest.mark.parametrize(
    "text",
    ['{"options": 5, "layers": []}', '{"options": null}', '{"options": {}, "layers": [{"heads": 4}]}'],
    ids=["options-a-number", "options-null", "heads-a-number"],
)
def test_a_grid_runs_init_report_of_the_wrong_shape_is_one_line_naming_it(grid, tmp_path, capsys, text):
    damaged = compare_over_damaged(grid, tmp_path, "init_report.json", text)
    one_line(capsys, f"{damaged} is damaged", "delete it")


@pytest.mark.parametrize(
    "text",
    [
        '{"layers": [{"index": 0}]}',  # a KeyError
        '{"layers": [{"heads": 4}]}',  # a TypeError naming no file
        "not json",  # a JSONDecodeError naming no file
        '{"layers": ' + DEEP + "}",  # a RecursionError
    ],
    ids=["no-heads", "heads-not-a-list", "not-json", "deep"],
)
def test_a_teachers_damaged_init_report_is_one_line_naming_it(finished, tmp_path, capsys, text):
    teacher = copy_run(finished, tmp_path / "teacher")
    (teacher / "init_report.json").write_text(text)
    student = ["init", "vit_digits", "--model-kwargs", "in_chans=1,num_classes=10,embed_dim=16,depth=1,num_heads=2"]
    assert main([*student, "--init", "select[rule=heads]", "--teacher", str(teacher)]) == 2
    one_line(capsys, f"{teacher / 'init_report.json'} is damaged", "teacher_heads=N")


def test_cluster_slurm_without_slurm_is_one_line_before_anything_is_made(tmp_path, capsys, monkeypatch):
    pytest.importorskip("submitit")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))  # no srun, no sbatch
    out = tmp_path / "grid"
    argv = ["compare", "--inits", "timm", "--seeds", "0", "--per-class", "10", "--quiet", "--out", str(out)]
    assert main([*argv, "--cluster", "slurm"]) == 2
    one_line(capsys, "--cluster slurm needs SLURM", "no srun", "--cluster local")
    assert not out.exists()


def test_test_images_of_another_size_name_a_training_image_of_the_size_they_must_have(tmp_path, capsys):
    make_imagefolder(tmp_path / "data", 8, splits=("train",))
    make_imagefolder(tmp_path / "data", 12, splits=("test",))
    out = tmp_path / "run"
    argv = ["train", "--data", f"imagefolder:{tmp_path / 'data'}", "--batch-size", "4", "--epochs", "1", "--quiet"]
    assert main([*argv, "--cache-dir", str(tmp_path / "cache"), "--out", str(out)]) == 2
    one_line(capsys, f"image {tmp_path / 'data' / 'test' / 'cat' / '0.png'} is 12x12 but {tmp_path / 'data' / 'train'}")
    assert not out.exists()


def test_ctrl_c_during_init_save_says_what_init_left(tmp_path, capsys, monkeypatch):
    def interrupted(obj, f, *args, **kwargs):
        f.write(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", interrupted)
    saved = tmp_path / "init.pt"
    assert main(["init", "vit_digits", "--save", str(saved)]) == 130
    err = capsys.readouterr().err
    assert err == "structinit init: interrupted; no file is left half-written: run it again\n", err
    assert list(tmp_path.iterdir()) == []


def test_an_interrupt_says_what_exists_then(tmp_path, capsys, monkeypatch):
    import structinit.studies.grid
    import structinit.training.run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    grid, run = tmp_path / "grid", tmp_path / "grid" / "timm-seed0"
    monkeypatch.setattr(structinit.training.run, "train", interrupted)
    monkeypatch.setattr(structinit.studies.grid, "compare", interrupted)
    assert main(["train", *FLAGS, "--out", str(run)]) == 130  # before any run exists
    again = f"no epoch had finished, so {run} holds no checkpoint: run it again"
    assert capsys.readouterr().err == f"structinit train: interrupted; {again}\n"
    assert main(["compare", "--inits", "timm", *FLAGS, "--out", str(grid)]) == 130
    again = f"no run in {grid} had finished an epoch: run the same command again: finished runs are skipped, "
    assert capsys.readouterr().err == f"structinit compare: interrupted; {again}interrupted ones resume\n"

    monkeypatch.undo()
    assert main(["train", *FLAGS, "--out", str(run)]) == 0  # one epoch, finished
    capsys.readouterr()
    monkeypatch.setattr(structinit.training.run, "train", interrupted)
    monkeypatch.setattr(structinit.studies.grid, "compare", interrupted)
    assert main(["train", *FLAGS[:-1], "2", "--out", str(run)]) == 130
    held = f"finished epochs are checkpointed: {run} holds 1 epoch; --resume goes on from there"
    assert capsys.readouterr().err == f"structinit train: interrupted; {held}\n"
    assert main(["compare", "--inits", "timm", *FLAGS, "--out", str(grid)]) == 130
    assert f"interrupted; finished epochs are checkpointed: {grid} holds 1 finished run; run" in capsys.readouterr().err


# --- 8. nothing taken silently ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("environment", "message"),
    [
        ({"RANK": "1"}, "the environment sets RANK=1, LOCAL_RANK=0 but no WORLD_SIZE above 1"),
        ({"RANK": "abc"}, "the environment sets RANK='abc', not an integer"),
        ({"RANK": "2", "WORLD_SIZE": "1"}, "the environment sets RANK=2, LOCAL_RANK=0 but no WORLD_SIZE above 1"),
        ({"LOCAL_RANK": "x", "WORLD_SIZE": "2", "RANK": "0"}, "the environment sets LOCAL_RANK='x', not an integer"),
        ({"WORLD_SIZE": "2"}, "the environment sets WORLD_SIZE=2 but no RANK: start the processes with torchrun"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2, LOCAL_RANK=0: each must lie in 0..1"),
        ({"WORLD_SIZE": "0"}, "the environment sets WORLD_SIZE=0"),
    ],
    ids=["stray-rank", "rank-not-a-number", "rank-past-one", "local-rank", "no-rank", "rank-past-world", "no-world"],
)
def test_the_distributed_environment_is_checked_before_anything_is_made(
    tmp_path, capsys, monkeypatch, environment, message
):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--out", str(out)]) == 2
    one_line(capsys, message)
    assert not out.exists()


def test_rank_zero_alone_is_one_process_that_prints_its_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert main(["train", *FLAGS, "--out", str(tmp_path / "run")]) == 0
    assert "test top-1" in capsys.readouterr().out


@pytest.mark.parametrize("seed", [-5, -1, 2**32, 2**64])
def test_the_library_takes_the_seeds_the_command_line_takes(seed):
    model = small_vit()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=rf"seed must lie in 0\.\.4294967295 \(numpy's seeds\), got {seed}"):
        initialize(model, "impulse", seed=seed)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match=r"seed must lie in 0\.\.4294967295"):
        build_model("vit_digits", InitSpec.parse("impulse"), seed, num_classes=10, in_chans=1, data_size=8)
    initialize(model, "impulse", seed=2**32 - 1)  # the largest seed, as on the command line


def test_a_note_is_shown_in_full_on_one_line_and_a_library_warning_without_its_source_line():
    import warnings

    from structinit.errors import PACKAGE, Notice, one_line_warning

    long = "the paper's solve of this shape takes about 3 minutes here; " * 5 + "target_fidelity=X skips it"
    shown = one_line_warning(Notice(long), Notice, str(PACKAGE / "inits" / "sharpness.py"), 1)
    assert shown == f"structinit: note: {long.strip()}\n"
    other = one_line_warning(UserWarning("slow"), UserWarning, warnings.__file__, 1, line="source()")
    assert "slow" in other and "source()" not in other and other.count("\n") == 1
