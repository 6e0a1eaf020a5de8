"""Image folders read as timm reads them (issue 75): the split folders its train.py takes, the classes in its
order, the images its folder reader takes, and trees the two would read differently refused in one line."""

import unicodedata
import warnings

import numpy as np
import pytest
from PIL import Image
from timm.data.dataset_factory import _search_split
from timm.data.readers.reader_image_folder import find_images_and_targets

from conftest import make_imagefolder
from structinit.cli import main
from structinit.data.datasets import load_data
from structinit.data.imagefolder import list_images, split_dirs
from structinit.errors import Notice

CAFE = unicodedata.normalize("NFC", "café")  # caf\xe9
CAFE_DECOMPOSED = unicodedata.normalize("NFD", "café")  # cafe\u0301


def tree_state(root):
    """Every path under `root` and the bytes of its files: what a refusal must leave as it was."""
    return {p: p.read_bytes() if p.is_file() else None for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize(
    "folders, train, evaluation, others",
    [
        (("train", "val", "validation"), "train", "validation", ["val"]),
        (("train", "val", "test"), "train", "val", ["test"]),
        (("training", "train", "eval", "valid"), "train", "valid", ["eval"]),
        (("train", "test"), "train", "test", []),
    ],
)
def test_the_split_folders_are_those_timms_train_py_takes_and_a_notice_names_the_others(
    tmp_path, folders, train, evaluation, others
):
    for name in folders:
        (tmp_path / name).mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert split_dirs(tmp_path) == (tmp_path / train, tmp_path / evaluation)
    for split, flag in ((train, "train"), (evaluation, "validation")):  # timm's train.py's default split names
        if split != "test":  # timm looks for no test/: structinit's own, taken where timm finds none
            assert _search_split(str(tmp_path), flag) == str(tmp_path / split)
    notes = [str(w.message) for w in caught if issubclass(w.category, Notice)]
    for other in others + (["training"] if "training" in folders else []):
        assert any(f"{other}/" in note and f"split {other} takes {other}/ instead" in note for note in notes), notes
    assert len(notes) == bool(others) + ("training" in folders)


def test_both_val_and_validation_evaluate_on_validation_as_timm_does(tmp_path):
    root = make_imagefolder(tmp_path / "d", 8, splits=("train", "val", "validation"))
    for cls in ("cat", "dog"):
        (root / "validation" / cls / "3.png").unlink()
    with pytest.warns(Notice, match=r"holds validation/, val/: structinit evaluates on validation/"):
        data = load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")
    assert len(data.test_labels) == 6  # validation/'s 3 a class, not val/'s 4


def test_a_file_where_timm_looks_for_a_split_folder_is_refused(tmp_path):
    root = make_imagefolder(tmp_path / "d", 8, splits=("train", "val"))
    (root / "validation").write_text("notes")
    with pytest.raises(NotADirectoryError, match=r"validation is a file where timm's train.py looks for a split"):
        load_data(f"imagefolder:{root}")


def test_a_split_is_listed_as_timms_folder_reader_lists_it(tmp_path):
    """Classes in timm's natural order (b2 before b10, a before B3), its extensions in any case, hidden
    images as timm takes them, other files left out (other images with a Notice)."""
    root = make_imagefolder(tmp_path / "d", 8, per_class=1, classes=("b10", "b2", "a", "B3"))
    split = root / "train"
    for cls in ("b10", "b2", "a", "B3"):
        pixels = np.full((8, 8, 3), 7, dtype=np.uint8)
        Image.fromarray(pixels).save(split / cls / "1.PNG")
        Image.fromarray(pixels).save(split / cls / "2.JPEG", format="JPEG")
        Image.fromarray(pixels).save(split / cls / ".3.png")
        (split / cls / "4.webp").write_bytes((split / cls / "1.PNG").read_bytes())
        (split / cls / "notes.txt").write_text("not an image")
    with pytest.warns(Notice, match=r"4 image\(s\) in .*train left out, as timm's folder reader leaves them"):
        files, labels, classes = list_images(split)
    samples, class_to_idx = find_images_and_targets(str(split))
    assert classes == list(class_to_idx) == ["a", "b2", "B3", "b10"]
    assert sorted((str(f), classes[i]) for f, i in zip(files, labels)) == sorted((f, classes[i]) for f, i in samples)
    assert len(files) == 16


def test_images_timm_would_label_otherwise_are_refused_in_one_line_leaving_the_tree_as_it_was(tmp_path, capsys):
    root = make_imagefolder(tmp_path / "d", 8)
    (root / "train" / "cat" / "kittens").mkdir()
    (root / "train" / "cat" / "0.png").rename(root / "train" / "cat" / "kittens" / "0.png")
    before = tree_state(tmp_path)
    assert main(["train", str(root), "--epochs", "1", "-b", "4", "--quiet", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "kittens/0.png is in a folder below class folder" in err
    assert "timm's folder reader would take 'kittens' as its class, structinit 'cat'" in err
    assert tree_state(tmp_path) == before


def test_images_beside_the_class_folders_are_refused(tmp_path):
    root = make_imagefolder(tmp_path / "d", 8)
    (root / "train" / "cat" / "0.png").rename(root / "train" / "0.png")  # timm: a class named ''
    (root / "train" / "notes.txt").write_text("not an image: no class to timm either")
    with pytest.raises(ValueError, match=r"train holds images outside its class folders \(0.png\)"):
        load_data(f"imagefolder:{root}")


@pytest.mark.parametrize(
    "train_names, test_names, pair, shown",
    [
        ((CAFE, CAFE_DECOMPOSED), (CAFE, CAFE_DECOMPOSED), (CAFE, CAFE_DECOMPOSED), "two Unicode forms: they print"),
        ((CAFE, "tea"), (CAFE_DECOMPOSED, "tea"), (CAFE, CAFE_DECOMPOSED), "two Unicode forms: they print"),
        (("Cat", "cat"), ("Cat", "cat"), ("Cat", "cat"), "differ only in case or leading zeros"),
        (("a1", "a01"), ("a1", "a01"), ("a01", "a1"), "differ only in case or leading zeros"),
    ],
)
def test_class_folders_that_are_one_name_to_a_reader_are_refused_naming_both(
    tmp_path, train_names, test_names, pair, shown
):
    root = tmp_path / "d"
    make_imagefolder(root, 8, classes=train_names, splits=("train",))
    (root / "test").mkdir()
    for name, source in zip(test_names, train_names):  # test images of their own bytes
        (root / "test" / name).mkdir()
        for i in range(2):
            pixels = np.full((8, 8, 3), 10 * i + len(source), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "test" / name / f"{i}.png")
    with pytest.raises(ValueError) as refused:
        load_data(f"imagefolder:{root}")
    message = str(refused.value)
    assert shown in message and "rename one" in message and "\n" not in message
    assert all(f"{name!r} ({name!a})" in message for name in pair), message
