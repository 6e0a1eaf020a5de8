"""benchmarks/cifar_pack.py: the JPEG tree carried to the device machine comes back byte for byte."""

import json

import numpy as np
import pytest
from PIL import Image

from conftest import load_benchmark


def tree(root, names=("0000.jpg", "0001.jpg", "0002.jpg")):
    generator = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in ("cat", "dog"):
            folder = root / split / label
            folder.mkdir(parents=True)
            for name in names:
                pixels = generator.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / name, quality=75)
    return root


def test_a_packed_tree_unpacks_to_the_same_bytes_under_the_same_names(tmp_path, capsys):
    pack = load_benchmark("cifar_pack")
    source = tree(tmp_path / "cifar10")
    pack.pack(str(source), str(tmp_path / "packed"))
    assert "packed 12 images" in capsys.readouterr().out
    shared = len(bytes.fromhex(json.loads((tmp_path / "packed" / "cifar10.json").read_text())["prefix"]))
    assert shared > 300  # one encoder setting: the headers and tables are the same in every file
    pack.unpack(str(tmp_path / "packed"), str(tmp_path / "out"))
    originals = sorted(p.relative_to(source) for p in source.rglob("*.jpg"))
    assert sorted(p.relative_to(tmp_path / "out") for p in (tmp_path / "out").rglob("*.jpg")) == originals
    assert all((source / p).read_bytes() == (tmp_path / "out" / p).read_bytes() for p in originals)


def test_names_it_could_not_rebuild_are_refused(tmp_path):
    pack = load_benchmark("cifar_pack")
    source = tree(tmp_path / "cifar10", names=("0000.jpg", "cat_7.jpg"))
    with pytest.raises(SystemExit, match=r"train/cat holds files not named 0000\.jpg, 0001\.jpg"):
        pack.pack(str(source), str(tmp_path / "packed"))


def test_the_data_unpacks_from_either_pack_and_a_missing_pack_says_what_to_carry(tmp_path):
    pack = load_benchmark("cifar_pack")
    source = tree(tmp_path / "cifar")
    pack.pack(str(source), str(tmp_path / "ours"))
    pack.unpack(str(tmp_path / "ours"), str(tmp_path / "a"))
    assert (tmp_path / "a/test/dog/0001.jpg").read_bytes() == (source / "test/dog/0001.jpg").read_bytes()
    shared = tmp_path / "shared"  # the shared tool's pack carries its own unpacker beside cifar10.bin
    shared.mkdir()
    (shared / "cifar10.bin").write_bytes(b"")
    (shared / "gpu_data.py").write_text(
        "import pathlib, sys\np = pathlib.Path(sys.argv[3], 'train', 'cat')\np.mkdir(parents=True)\n"
        "(p / 'x.jpg').write_text(sys.argv[1] + ' ' + sys.argv[2])\n"
    )
    pack.unpack(str(shared), str(tmp_path / "b"))
    assert (tmp_path / "b/train/cat/x.jpg").read_text() == f"unpack {shared}"
    with pytest.raises(SystemExit, match=r"no CIFAR-10 pack in .*empty: run `python3 benchmarks/cifar_pack.py pack"):
        pack.unpack(str(tmp_path / "empty"), str(tmp_path / "c"))
