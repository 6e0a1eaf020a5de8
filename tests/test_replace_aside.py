"""Nothing is deleted before its replacement is accepted (issue 75): what `choose --rerun` and `compare --rerun`
replace is set aside in --out (ownership.replaced_aside) and dropped only once the new plan is written or the new run
has checkpointed; a refusal or a failure before then puts every file back as it was, and a command removes only
what its own records name."""

import os
from pathlib import Path

import pytest

from conftest import make_imagefolder
from structinit.cli import main
from structinit.errors import Notice, RunError
from structinit.training.ownership import recover_aside, replaced_aside

TINY = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--quiet"]
SMALL = [*TINY, "--model", "vit_digits", "-b", "4"]  # on 16 px photos: 4 steps an epoch
GRID = ["compare", *TINY, "--per-class", "10", "-b", "50", "--seeds", "0", "--epochs", "1"]


def tree(root: Path) -> dict[str, object]:
    """Every entry under `root`: a file's bytes, a link's target, or 'folder'."""

    def entry(path: Path) -> object:
        if path.is_symlink():
            return ("link", os.readlink(path))
        return path.read_bytes() if path.is_file() else "folder"

    return {str(p.relative_to(root)): entry(p) for p in sorted(root.rglob("*"))}


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


# --- the helper -------------------------------------------------------------------------------------------------


def test_what_is_set_aside_goes_back_byte_identical_when_the_block_refuses(tmp_path):
    write(tmp_path, {"run/last.pt": "old", "run/snapshots/epoch_0001.pt": "old", "plan.json": "old", "mine": "x"})
    before = tree(tmp_path)
    group = [tmp_path / "run/last.pt", tmp_path / "run/snapshots/epoch_0001.pt"]
    with pytest.raises(RunError, match="refused"), replaced_aside(tmp_path, [group]):
        assert not (tmp_path / "run/last.pt").exists()
        raise RunError("refused")
    assert tree(tmp_path) == before


def test_what_is_set_aside_is_deleted_once_the_block_returns_and_nothing_else(tmp_path):
    write(tmp_path, {"a/last.pt": "old", "a/notes.txt": "mine", "b/last.pt": "old", "b/snapshots/epoch_0001.pt": "old"})
    groups = [[tmp_path / "a/last.pt"], [tmp_path / "b/last.pt", tmp_path / "b/snapshots/epoch_0001.pt"]]
    with replaced_aside(tmp_path, groups):
        (tmp_path / "a/last.pt").write_text("new")
    assert tree(tmp_path) == {"a": "folder", "a/last.pt": b"new", "a/notes.txt": b"mine"}  # b emptied: removed


def test_a_group_whose_place_its_replacement_took_stays_replaced_and_the_others_go_back(tmp_path):
    write(tmp_path, {"a/last.pt": "old", "a/prev.pt": "old", "b/last.pt": "old"})
    groups = [[tmp_path / "a/last.pt", tmp_path / "a/prev.pt"], [tmp_path / "b/last.pt"]]
    with pytest.raises(KeyboardInterrupt), replaced_aside(tmp_path, groups):
        (tmp_path / "a/last.pt").write_text("new")  # a's replacement checkpointed, b's did not start
        raise KeyboardInterrupt
    # a whole or not at all: its old prev.pt beside the new last.pt would be another run's
    assert tree(tmp_path) == {"a": "folder", "a/last.pt": b"new", "b": "folder", "b/last.pt": b"old"}


def test_nothing_is_put_back_through_a_link_that_took_the_place_of_its_folder(tmp_path):
    write(tmp_path, {"out/a/last.pt": "old", "elsewhere/keep": "theirs"})
    with pytest.raises(KeyboardInterrupt), replaced_aside(tmp_path / "out", [[tmp_path / "out/a/last.pt"]]):
        (tmp_path / "out/a").rmdir()
        (tmp_path / "out/a").symlink_to(tmp_path / "elsewhere")
        raise KeyboardInterrupt
    assert tree(tmp_path / "elsewhere") == {"keep": b"theirs"} and not list((tmp_path / "out").glob(".replaced-*"))


def test_what_a_killed_command_set_aside_goes_back_on_the_next_and_a_drop_it_began_is_finished(tmp_path):
    write(tmp_path, {"a/notes.txt": "mine", "b/last.pt": "new"})
    write(tmp_path / ".replaced-41", {"0/a/last.pt": "old", "1/b/last.pt": "old", "1/b/prev.pt": "old"})
    write(tmp_path / ".replaced-42.dropped", {"0/c/last.pt": "old"})  # killed while it deleted what it replaced
    assert recover_aside(tmp_path) == [tmp_path / "a/last.pt"]
    assert tree(tmp_path) == {
        "a": "folder",
        "a/last.pt": b"old",
        "a/notes.txt": b"mine",
        "b": "folder",
        "b/last.pt": b"new",  # replaced before the kill: the old group is dropped
    }


# --- choose --rerun -----------------------------------------------------------------------------------------------


def _choose(tmp_path: Path, *more: str) -> int:
    folder = tmp_path / "photos"
    if not folder.exists():
        make_imagefolder(folder, 16, per_class=10, classes=("a", "b"))
    return main(["choose", str(folder), *SMALL, "--val-per-class", "2", "--out", str(tmp_path / "c"), *more])


def test_a_choose_rerun_refused_on_its_new_flags_leaves_the_comparison_byte_identical(tmp_path, capsys):
    assert _choose(tmp_path, "--epochs", "1") == 0
    before = tree(tmp_path / "c")
    capsys.readouterr()
    assert _choose(tmp_path, "--epochs", "1", "--rerun", "--structured", "select[teacher=missing.pt]") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.pt" in err and "Traceback" not in err, err
    assert tree(tmp_path / "c") == before


def test_a_choose_rerun_deletes_only_the_runs_its_plan_named(tmp_path, capsys):
    assert _choose(tmp_path, "--epochs", "1") == 0
    out = tmp_path / "c"
    mine = out / "mine" / "run"  # the user's own run, kept beside the comparison
    assert main(["train", str(tmp_path / "photos"), *SMALL, "--epochs", "1", "--out", str(mine)]) == 0
    (out / "full" / "timm-seed0" / "notes.txt").write_text("mine")
    kept = tree(mine)
    assert _choose(tmp_path, "--epochs", "2", "--rerun") == 0, capsys.readouterr().err
    assert tree(mine) == kept
    assert (out / "full" / "timm-seed0" / "notes.txt").read_text() == "mine"
    runs = list((out / "full").iterdir())
    assert len(runs) == 10 and all(len((r / "metrics.jsonl").read_text().splitlines()) == 2 for r in runs)
    assert not list(out.glob(".replaced-*"))


# --- compare --rerun ----------------------------------------------------------------------------------------------


def test_a_compare_rerun_refused_at_a_later_run_leaves_the_earlier_ones_as_they_were(tmp_path, capsys):
    assert main([*GRID, "--inits", "timm", "--out", str(tmp_path)]) == 0
    write(tmp_path, {"per_class_10/kaiming-seed0/config.yaml": "lr: 1\n"})  # no run wrote it: refused, rerun or not
    before = tree(tmp_path)
    capsys.readouterr()
    assert main([*GRID, "--inits", "timm,kaiming", "--lr", "0.0005", "--out", str(tmp_path), "--rerun"]) == 2
    assert "kaiming-seed0/config.yaml was not written by a run" in capsys.readouterr().err
    assert tree(tmp_path) == before  # timm-seed0, of another --lr, was not emptied before the refusal


def test_a_compare_rerun_whose_new_run_fails_before_its_checkpoint_puts_the_old_back(tmp_path, capsys, monkeypatch):
    assert main([*GRID, "--inits", "timm", "--out", str(tmp_path)]) == 0
    (tmp_path / "per_class_10" / "timm-seed0" / "notes.txt").write_text("mine")
    before = tree(tmp_path)

    def unbuildable(*args, **kwargs):
        raise RunError("the model cannot be built here")

    monkeypatch.setattr("structinit.training.run.Run.build", unbuildable)
    capsys.readouterr()
    assert main([*GRID, "--inits", "timm", "--lr", "0.0005", "--out", str(tmp_path), "--rerun"]) == 2
    assert "the model cannot be built here" in capsys.readouterr().err
    assert tree(tmp_path) == before


def test_what_a_killed_compare_rerun_set_aside_is_put_back_by_the_next_compare_and_said(tmp_path):
    assert main([*GRID, "--inits", "timm", "--out", str(tmp_path)]) == 0
    run = tmp_path / "per_class_10" / "timm-seed0"
    kept = tree(run)
    aside = tmp_path / ".replaced-1" / "0" / "per_class_10"  # as a --rerun killed before its new run started left it
    aside.mkdir(parents=True)
    run.rename(aside / "timm-seed0")
    said = r"put back 5 file\(s\) a --rerun set aside in .* \(per_class_10/timm-seed0/config.yaml, "
    with pytest.warns(Notice, match=said):
        assert main([*GRID, "--inits", "timm", "--out", str(tmp_path)]) == 0  # not "results.md but no grid's runs"
    assert tree(run) == kept and not list(tmp_path.glob(".replaced-*"))  # the finished run, not trained again
