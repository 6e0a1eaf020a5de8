"""Runs you can trust, round three, the data: images are known by their content (a file replaced with
its mtime kept is read anew, a resume on it refused, a test set that is the training set refused), 16-bit
images scaled rather than clipped, only regular files read (a FIFO or /dev/zero never hangs a command
or fills memory), an image PIL guards against named in one line wherever it is read, and a dataset
spec taken whole."""

import contextlib
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import structinit
from conftest import make_imagefolder
from structinit.cli import main
from structinit.data.datasets import load_data
from structinit.errors import RunError
from structinit.inits.teacher import load_teacher
from structinit.training import TrainConfig, train
from test_trust import FAST, copy_run, one_line

# a tiny run on an image tree: in memory at 8 px, streamed (timm's transforms) at 72 px
TREE = ["--model", "vit_digits", "--batch-size", "4", "--epochs", "2", "--workers", "0", "--quiet"]
MODEL = {8: "depth=1", 72: "depth=1,img_size=72,patch_size=24"}


def tree_run(root: Path, size: int, *more: str) -> list[str]:
    return ["train", "--data", f"imagefolder:{root}", *TREE, "--model-kwargs", MODEL[size], *more]


def write_png(path: Path, pixels: np.ndarray) -> None:
    """Uncompressed, so that images of one size are files of one size."""
    Image.fromarray(pixels).save(path, compress_level=0)


def keeping_mtimes(*writes: tuple[Path, bytes]) -> None:
    """Write each file's new bytes and set its mtime back, as cp -p, rsync -a or tar -x do."""
    times = {path: path.stat() for path, _ in writes}
    for path, data in writes:
        path.write_bytes(data)
        os.utime(path, ns=(times[path].st_atime_ns, times[path].st_mtime_ns))


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> Path:
    """A run on the digits stopped after 1 of its 2 epochs, copied by the tests that change it."""
    run = tmp_path_factory.mktemp("stopped") / "run"
    train(TrainConfig(**FAST, epochs=2, stop_after=1, out=str(run)))
    return run


# --- images are known by their content --------------------------------------------------------------


def test_an_image_replaced_with_its_mtime_kept_is_decoded_anew(tmp_path):
    root = make_imagefolder(tmp_path / "data", 8)
    load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")
    new = np.full((8, 8, 3), 7, dtype=np.uint8)
    write_png(tmp_path / "new.png", new)
    keeping_mtimes((root / "train" / "cat" / "0.png", (tmp_path / "new.png").read_bytes()))
    again = load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")
    assert torch.equal(again.train_images[0], torch.from_numpy(new).permute(2, 0, 1))


@pytest.mark.parametrize(
    ("size", "more"), [(8, []), (72, []), (72, ["--classes", "cat,dog"])], ids=["memory", "streamed", "classes"]
)
def test_a_resume_refuses_two_images_of_one_size_swapped_between_classes_with_their_mtimes_kept(
    tmp_path, capsys, size, more
):
    root = make_imagefolder(tmp_path / "data", size, per_class=2)
    cat, dog = root / "train" / "cat" / "0.png", root / "train" / "dog" / "0.png"
    for path in (cat, dog):
        write_png(path, np.asarray(Image.open(path)))
    assert cat.stat().st_size == dog.stat().st_size
    run = tmp_path / "run"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main([*tree_run(root, size, *cache, *more), "--stop-after", "1", "--out", str(run)]) == 0
    keeping_mtimes((cat, dog.read_bytes()), (dog, cat.read_bytes()))
    assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 2
    one_line(capsys, "changed since its checkpoint", "resume it on the data it trained on")


def test_digests_are_taken_once_and_again_only_for_a_changed_file(tmp_path, monkeypatch):
    from structinit.data import digests

    monkeypatch.setattr(digests, "RECENT_NS", 0)  # files made a moment ago are kept too
    taken = []
    real = digests._digest
    monkeypatch.setattr(digests, "_digest", lambda path: taken.append(path) or real(path))
    root = make_imagefolder(tmp_path / "data", 8)
    cache = tmp_path / "cache"
    load_data(f"imagefolder:{root}", cache_dir=cache)
    assert len(taken) == 16
    taken.clear()
    load_data(f"imagefolder:{root}", cache_dir=cache)
    assert taken == []
    time.sleep(0.05)  # past the clock's tick: the replacement gets a ctime of its own
    image = root / "test" / "dog" / "3.png"
    new = np.full((8, 8, 3), 200, dtype=np.uint8)
    write_png(tmp_path / "new.png", new)
    keeping_mtimes((image, (tmp_path / "new.png").read_bytes()))
    again = load_data(f"imagefolder:{root}", cache_dir=cache)
    assert taken == [image]
    assert torch.equal(again.test_images[7], torch.from_numpy(new).permute(2, 0, 1))


@pytest.mark.parametrize("how", ["link", "copy"])
def test_a_test_folder_that_is_the_training_folder_is_refused(tmp_path, how):
    root = make_imagefolder(tmp_path / "data", 8, splits=("train",))
    if how == "link":
        (root / "test").symlink_to("train")
    else:
        shutil.copytree(root / "train", root / "test")
    with pytest.raises(ValueError, match=r"8 of the 8 test images are training images \(.*test/cat/0.png holds"):
        load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")


# --- 16-bit images ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [8, 72])
def test_a_16_bit_grayscale_png_is_scaled_to_8_bits_not_clipped_to_white(tmp_path, size):
    root = make_imagefolder(tmp_path / "data", size)
    samples = np.random.default_rng(0).integers(0, 65536, (size, size), dtype=np.uint16)
    samples[0, :4] = [0, 257, 32768, 65535]
    Image.fromarray(samples).save(root / "train" / "cat" / "0.png")
    assert Image.open(root / "train" / "cat" / "0.png").mode == "I;16"
    data = load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")
    pixels = np.asarray(data.train[0][0]) if size > 64 else data.train_images[0].permute(1, 2, 0).numpy()
    expected = np.round(samples / 257).astype(np.uint8)
    assert list(expected[0, :4]) == [0, 1, 128, 255]
    assert np.array_equal(pixels, np.repeat(expected[..., None], 3, axis=2))


def test_an_image_of_32_bit_samples_is_refused_in_one_line(tmp_path):
    root = make_imagefolder(tmp_path / "data", 8)
    image = root / "train" / "dog" / "1.png"  # a TIFF by its bytes (PNG holds 16 bits at most): Pillow reads those
    Image.fromarray(np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)).save(image, format="TIFF")
    with pytest.raises(ValueError, match=rf"cannot read image {image}: its samples are 32-bit \(mode F\)"):
        load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")


# --- only regular files are read ----------------------------------------------------------------------


@contextlib.contextmanager
def fifo(path: Path):
    """A FIFO at `path`. Whoever opens it to read gets a few bytes and their end, so that code which reads
    it fails rather than hangs (and code that refuses it never opens it)."""
    os.mkfifo(path)
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet
                time.sleep(0.01)
                continue
            with contextlib.suppress(OSError):
                os.write(fd, b"not what it seems\n")
            os.close(fd)
            time.sleep(0.05)  # the reader sees the end

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        yield path
    finally:
        stop.set()
        feeder.join()


def structinit_process(*argv: str) -> subprocess.CompletedProcess:
    """`structinit ARGV` in a process of its own, its memory and time bounded: a command that reads
    /dev/zero fails there rather than filling the machine's memory or hanging the tests."""

    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = {**os.environ, "PYTHONPATH": str(Path(structinit.__file__).parents[1])}
    command = [sys.executable, "-m", "structinit", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, preexec_fn=bounded)


@pytest.mark.parametrize("size", [8, 72])
@pytest.mark.parametrize("kind", ["FIFO", "socket"])
def test_a_special_file_among_the_images_is_refused_in_one_line_before_it_is_read(
    tmp_path, capsys, monkeypatch, size, kind
):
    root = make_imagefolder(tmp_path / "data", size)
    special = root / "train" / "dog" / "9.png"
    argv = tree_run(root, size, "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "run"))
    with contextlib.ExitStack() as stack:
        if kind == "FIFO":
            stack.enter_context(fifo(special))
        else:
            monkeypatch.chdir(special.parent)  # a socket's path is short
            stack.enter_context(socket.socket(socket.AF_UNIX)).bind(special.name)
        assert main(argv) == 2
    one_line(capsys, f"{special} is a {kind}, not a regular file: structinit reads only regular files")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("command", "name", "special"),
    [
        ("resume", "last.pt", "FIFO"),
        ("resume", "last.pt", "directory"),
        ("attention", "config.yaml", "FIFO"),
        ("attention", "last.pt", "FIFO"),
    ],
)
def test_a_special_file_in_a_run_is_refused_in_one_line(stopped, tmp_path, capsys, command, name, special):
    run = copy_run(stopped, tmp_path / "run")
    (run / name).unlink()
    argv = ["train", "--resume", "--out", str(run), "--quiet"]
    if command == "attention":
        argv = ["attention", str(run), "--out", str(tmp_path / "maps.png")]
    with fifo(run / name) if special == "FIFO" else contextlib.nullcontext():
        if special == "directory":
            (run / name).mkdir()
        assert main(argv) == 2
    kind = "a FIFO" if special == "FIFO" else "a directory"
    one_line(capsys, f"{run / name} is {kind}, not a regular file")


@pytest.mark.parametrize("command", ["resume", "attention"])
def test_last_pt_linked_to_dev_zero_is_refused_before_it_is_read(stopped, tmp_path, command):
    run = copy_run(stopped, tmp_path / "run")
    (run / "last.pt").unlink()
    (run / "last.pt").symlink_to("/dev/zero")
    argv = ["train", "--resume", "--out", str(run), "--quiet"]
    if command == "attention":
        argv = ["attention", str(run), "--out", str(tmp_path / "maps.png")]
    done = structinit_process(*argv)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert f"{run / 'last.pt'} (a link to /dev/zero) is a character device, not a regular file" in done.stderr


@pytest.mark.parametrize("name", ["last.pt", "init_report.json"])
def test_a_special_file_in_a_teacher_run_is_refused_before_it_is_read(stopped, tmp_path, name):
    run = copy_run(stopped, tmp_path / "teacher")
    (run / name).unlink()
    with fifo(run / name), pytest.raises(RunError, match=f"{run / name} is a FIFO, not a regular file"):
        load_teacher(str(run))


def test_a_config_file_that_is_a_fifo_is_refused_in_one_line(tmp_path, capsys):
    with fifo(tmp_path / "settings.yaml") as config:
        assert main(["train", "-c", str(config), "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, f"{config} is a FIFO, not a regular file")
    assert not (tmp_path / "run").exists()


# --- an image PIL guards against is one line, wherever it is read ----------------------------------------


def bomb_png(side: int = 14000) -> bytes:
    """A black 1-bit PNG of side x side pixels: a few KB that PIL refuses to decode (a decompression bomb)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(bytes(side * (1 + side // 8)), 9)  # each row: its filter byte and side / 8 bytes
    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


@pytest.mark.parametrize(
    ("size", "where"),
    [(8, "memory"), (72, "streamed"), (72, "worker"), (72, "parallel")],
)
def test_a_decompression_bomb_is_one_line_naming_the_file(tmp_path, capfd, size, where):
    root = make_imagefolder(tmp_path / "data", size, per_class=2)
    bomb = root / "train" / "dog" / "1.png"
    bomb.write_bytes(bomb_png())
    argv = tree_run(root, size, "--cache-dir", str(tmp_path / "cache"), "--out", str(tmp_path / "run"))
    if where == "worker":
        argv += ["--workers", "1"]
    if where == "parallel":
        argv = ["compare", *argv[1:-2], "--inits", "timm", "--seeds", "0", "--parallel", "2"]
        argv += ["--out", str(tmp_path / "grid")]
    assert main(argv) == 2
    line = f"error: cannot read image {bomb}: Image size (196000000 pixels) exceeds limit"
    if where != "parallel":
        one_line(capfd, line, "PIL.Image.MAX_IMAGE_PIXELS")
    else:  # the last line; a stopped idle worker's own traceback before it is another matter
        err = capfd.readouterr().err
        assert line in err.splitlines()[-1] and "DecompressionBombError" not in err, err


# --- a dataset spec is taken whole ---------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ["digits:/nonexistent", "digits:"])
def test_digits_given_a_path_is_refused_in_one_line(tmp_path, capsys, spec):
    fast = ["--per-class", "5", "--model", "vit_digits", "--model-kwargs", "depth=1", "--epochs", "1", "--quiet"]
    assert main(["train", "--data", spec, *fast, "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, f"--data {spec}: digits is embedded and takes no path")
    assert not (tmp_path / "run").exists()
