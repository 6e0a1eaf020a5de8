"""Runs you can trust, round three: bounded config files, one line (not a traceback) and the right
line for every failure, and nothing taken silently from the environment or a library call."""

import os
import shutil
from pathlib import Path

import pytest

from structinit.cli import main
from structinit.training import TrainConfig, train

FAST = dict(data="digits", per_class=20, model="vit_digits", model_kwargs={"depth": 2}, batch_size=50, quiet=True)
FLAGS = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet", "--epochs", "1"]


def one_line(capsys, *fragments: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err[:2000]
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A finished 1-epoch run, copied by the tests that change it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train(TrainConfig(**FAST, epochs=1, out=str(run)))
    return run


def copy_run(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns(".lock"))
    return to


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
    one_line(capsys, f"--config {pipe}: not a regular file")
    assert not out.exists()
