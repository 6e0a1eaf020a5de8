"""benchmarks/cifar_pack.py: the JPEG tree carried to the device machine comes back byte for byte, and a
pack is data: it writes nowhere but below its destination, through no link, and runs no code it carries."""

import json
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import BENCHMARKS, load_benchmark
from structinit.errors import RunError


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


def listing(root):
    """Every path under `root` (links as links) with a file's bytes: what must not change."""
    return {p: p.read_bytes() if p.is_file() and not p.is_symlink() else None for p in root.rglob("*")}


def tool_pack(source, dest, hostile=None):
    """The pack ../shared/tools/gpu_data.py makes: the files one after another in cifar10.bin, their paths,
    offsets and sizes in cifar10.idx.json, and the tool's own gpu_data.py beside them."""
    dest.mkdir()
    index, data = [], b""
    for path in sorted(source.rglob("*.jpg")):
        index.append([str(path.relative_to(source)), len(data), path.stat().st_size])
        data += path.read_bytes()
    (dest / "cifar10.bin").write_bytes(data)
    (dest / "cifar10.idx.json").write_text(json.dumps(hostile or index))
    return dest


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
    with pytest.raises(RunError, match=r"train/cat holds files not named 0000\.jpg, 0001\.jpg"):
        pack.pack(str(source), str(tmp_path / "packed"))
    assert not (tmp_path / "packed").exists()


def test_the_shared_tools_pack_is_read_here_and_the_code_it_carries_never_runs(tmp_path):
    pack = load_benchmark("cifar_pack")
    source = tree(tmp_path / "cifar")
    shared = tool_pack(source, tmp_path / "shared")
    (shared / "gpu_data.py").write_text(f"import pathlib\npathlib.Path({str(tmp_path / 'ran')!r}).write_text('x')\n")
    pack.unpack(str(shared), str(tmp_path / "b"))
    assert not (tmp_path / "ran").exists()
    originals = sorted(p.relative_to(source) for p in source.rglob("*.jpg"))
    assert sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.jpg")) == originals
    assert all((source / p).read_bytes() == (tmp_path / "b" / p).read_bytes() for p in originals)
    with pytest.raises(RunError, match=r"no CIFAR-10 pack in .*empty: run `python3 benchmarks/cifar_pack.py pack"):
        pack.unpack(str(tmp_path / "empty"), str(tmp_path / "c"))
    with pytest.raises(RunError, match=r"shared holds the shared tool's pack, which unpack reads first"):
        pack.pack(str(source), str(shared))  # this pack beside it would never be read


@pytest.mark.parametrize("folder", ["../../escaped", "{tmp}/escaped", "train/../../escaped", "train/..", "train"])
def test_a_pack_naming_a_folder_outside_its_destination_is_refused_before_anything_is_written(tmp_path, folder):
    pack = load_benchmark("cifar_pack")
    pack.pack(str(tree(tmp_path / "cifar")), str(tmp_path / "pack"))
    meta = json.loads((tmp_path / "pack" / "cifar10.json").read_text())
    meta["folders"][0][0] = folder.format(tmp=tmp_path)  # an absolute folder: one in the test's own folder
    (tmp_path / "pack" / "cifar10.json").write_text(json.dumps(meta))
    before = listing(tmp_path)
    with pytest.raises(RunError, match=r"cifar10\.json names .*, not a path below the destination: pack it again"):
        pack.unpack(str(tmp_path / "pack"), str(tmp_path / "deep" / "out"))
    assert listing(tmp_path) == before  # not even the destination's folders


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        (["../../escaped.jpg", 0, 10], "not a path below the destination"),
        (["{tmp}/escaped.jpg", 0, 10], "not a path below the destination"),
        (["train/cat/0000.jpg", 0, 10**9], "not bytes of cifar10.bin"),
        (["train/cat/0000.jpg", -5, 3], "not bytes of cifar10.bin"),
        ("train/cat/0000.jpg", "not bytes of cifar10.bin"),
    ],
)
def test_a_shared_tool_pack_naming_a_path_outside_or_bytes_beyond_its_file_is_refused(tmp_path, entry, why):
    pack = load_benchmark("cifar_pack")
    source = tree(tmp_path / "cifar")
    entry = [entry[0].format(tmp=tmp_path), *entry[1:]] if isinstance(entry, list) else entry
    shared = tool_pack(source, tmp_path / "shared", hostile=[["train/cat/0001.jpg", 0, 10], entry])
    before = listing(tmp_path)
    with pytest.raises(RunError, match=f"cifar10.idx.json names .*, {why}: pack it again"):
        pack.unpack(str(shared), str(tmp_path / "out"))
    assert listing(tmp_path) == before


@pytest.mark.parametrize("kind", ["folder", "dangling"])
def test_a_link_at_the_destination_is_refused_and_its_target_stays_as_it_was(tmp_path, kind):
    pack = load_benchmark("cifar_pack")
    pack.pack(str(tree(tmp_path / "cifar")), str(tmp_path / "pack"))
    outside = tmp_path / "elsewhere"
    if kind == "folder":
        outside.mkdir()
    (tmp_path / "out").symlink_to(outside)
    before = listing(tmp_path)
    with pytest.raises(RunError, match=r"out is a link, and structinit writes no file through one"):
        pack.unpack(str(tmp_path / "pack"), str(tmp_path / "out"))
    assert listing(tmp_path) == before


def test_a_destination_holding_files_is_refused_and_a_failed_unpack_leaves_no_half_tree(tmp_path, monkeypatch):
    pack = load_benchmark("cifar_pack")
    pack.pack(str(tree(tmp_path / "cifar")), str(tmp_path / "pack"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match=r"full holds something already: unpack into a new or empty folder"):
        pack.unpack(str(tmp_path / "pack"), str(tmp_path / "full"))
    assert listing(tmp_path / "full") == {tmp_path / "full" / "notes.txt": b"mine"}
    written = []

    def fails_at_the_fifth(path, flags):
        written.append(path)
        if len(written) == 5:
            raise OSError(28, "No space left on device")
        return pack.os.open(path, flags)

    monkeypatch.setattr(pack, "no_follow", fails_at_the_fifth)
    before = listing(tmp_path)
    with pytest.raises(OSError, match="No space left"):
        pack.unpack(str(tmp_path / "pack"), str(tmp_path / "new"))
    assert listing(tmp_path) == before  # no train/ the device scripts would take for the data, no scratch folder


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda pack: (pack / "cifar10.json").write_text("{not json"), "cifar10.json is damaged"),
        (lambda pack: (pack / "cifar10.json").write_text('{"prefix": 5, "folders": [], "size_bytes": 4}'), "damaged"),
        (lambda pack: (pack / "cifar10.sizes").write_bytes(b"\x01\x02\x03"), "damaged pack"),
        (lambda pack: (pack / "cifar10.rest").write_bytes(b"cut"), "cifar10.rest holds 3 bytes, not the"),
    ],
)
def test_a_damaged_pack_is_one_line_from_the_command_and_nothing_is_written(tmp_path, damage, said):
    pack = load_benchmark("cifar_pack")
    pack.pack(str(tree(tmp_path / "cifar")), str(tmp_path / "pack"))
    damage(tmp_path / "pack")
    before = listing(tmp_path)
    command = [
        sys.executable,
        str(BENCHMARKS / "cifar_pack.py"),
        "unpack",
        str(tmp_path / "pack"),
        str(tmp_path / "out"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("cifar_pack.py: error: ") and said in done.stderr
    assert done.stderr.count("\n") == 1 and listing(tmp_path) == before
