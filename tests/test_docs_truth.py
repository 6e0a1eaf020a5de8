"""The docs say what the code is (issue 68): every module path a doc names exists, and docs/layout.md
lists every module of the package."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "structinit"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_module_path_a_doc_names_exists():
    named = {
        (doc.relative_to(ROOT).as_posix(), path)
        for doc in DOCS
        for path in re.findall(r"structinit/[\w/]+\.py", doc.read_text())
    }
    missing = sorted((doc, path) for doc, path in named if not (ROOT / "src" / path).exists())
    assert not missing, f"docs name modules that do not exist: {missing}"


def test_the_layout_lists_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"[\w]+\.py", layout))
    modules = {p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert not sorted(modules - listed), f"docs/layout.md lists no {sorted(modules - listed)}"


def test_an_unknown_flag_points_to_the_subcommands_help(capsys):
    from structinit.cli import main

    assert main(["train", "--grad-accum-step", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "structinit train: error: unrecognized arguments: --grad-accum-step (structinit train --help lists the flags)"
    ]


def test_the_digits_preset_is_built_alike_by_init_and_train_and_a_misfit_names_the_keywords(tmp_path, capsys):
    from structinit.cli import main

    train = ["train", "--data", "digits", "--per-class", "5", "-b", "25", "--epochs", "1", "--quiet"]
    assert main(["init", "vit_digits", "--init", "timm", "--save", str(tmp_path / "d.safetensors")]) == 0
    assert main([*train, "--initial-checkpoint", str(tmp_path / "d.safetensors"), "--out", str(tmp_path / "r")]) == 0
    wide = ["init", "vit_digits", "--init", "timm", "--num-classes", "1000", "--model-kwargs", "in_chans=3"]
    assert main([*wide, "--save", str(tmp_path / "w.safetensors")]) == 0
    capsys.readouterr()
    assert main([*train, "--initial-checkpoint", str(tmp_path / "w.safetensors"), "--out", str(tmp_path / "q")]) == 2
    assert (
        "save them for this data with --model-kwargs in_chans=1,num_classes=10 (the file's: in_chans 3, "
        "num_classes 1000)" in capsys.readouterr().err
    )
