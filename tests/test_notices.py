"""Notices from Python as on the command line: one line (`structinit: note: ...`, no file path or source
line), each cause once, none where the caller passed quiet=True, still warnings a filter or pytest.warns
sees; long init work shows tqdm's bar on a terminal. Each case in a fresh process, its stderr read whole."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import structinit

ENV = {**os.environ, "PYTHONPATH": str(Path(structinit.__file__).parents[1])}

MIMETIC = """
import sys, warnings, timm, structinit
from structinit.errors import Notice
from structinit.inits import progress
progress.NOTICE_SECONDS = -1.0  # every pool announced: mimetic's factorisations say their time
model = timm.create_model("vit_small_patch16_224", img_size=32, patch_size=8, depth=2, embed_dim=96, num_heads=3)
quiet = sys.argv[1] == "quiet"
structinit.initialize(model, "mimetic", seed=0, quiet=quiet)
structinit.initialize(model, "mimetic", seed=0, quiet=quiet)  # the same cause: shown once
warnings.warn("another library's warning", UserWarning)
with warnings.catch_warnings():
    warnings.simplefilter("error", Notice)
    try:
        structinit.initialize(model, "mimetic", seed=0, quiet=quiet)
    except Notice:
        print("a filter made the notice an error")
"""


def on_a_terminal(code: str, *args: str) -> tuple[str, str]:
    """What `code` writes to stdout, and to stderr when stderr is a terminal (a pseudo-terminal)."""
    main, other = pty.openpty()
    fcntl.ioctl(other, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 columns: tqdm's width
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, *args], env=ENV, stdout=subprocess.PIPE, stderr=other, text=True, timeout=300
        )
        os.close(other)
        written = b""
        while chunk := _read(main):
            written += chunk
    finally:
        os.close(main)
    assert done.returncode == 0, written
    return done.stdout, written.decode(errors="replace").replace("\r\n", "\n")


def _read(terminal: int) -> bytes:
    try:
        return os.read(terminal, 65536)
    except OSError:  # its other end closed: all read
        return b""


def test_a_notice_from_python_is_one_line_once_beside_a_bar_and_still_a_warning():
    printed, shown = on_a_terminal(MIMETIC, "shown")
    notes = re.findall(r"structinit: note: mimetic: [^\r\n]*", shown)
    assert len(notes) == 1 and "factorisations" in notes[0] and "about" in notes[0], shown  # the same cause: once
    assert "progress.py" not in shown and "warnings.warn" not in shown  # no file path, no source line
    assert re.search(r"mimetic: +\d+%\|", shown) and "step/s" in shown  # tqdm's bar
    assert re.search(r"<string>:\d+: UserWarning: another library's warning", shown)  # as Python shows it
    assert printed == "a filter made the notice an error\n"  # still a warning the warnings module filters


def test_quiet_shows_no_notice_nor_bar_and_a_filter_still_sees_the_notice():
    printed, shown = on_a_terminal(MIMETIC, "quiet")
    assert "structinit" not in shown and "%" not in shown and "UserWarning: another library's warning" in shown
    assert printed == "a filter made the notice an error\n"


TRAIN = """
import dataclasses, sys, structinit
from structinit import TrainConfig
config = TrainConfig(data="digits", per_class=5, model="vit_digits", model_kwargs={"depth": 1}, epochs=1,
                     batch_size=25, quiet=True, out="quiet")  # warm-up 3 epochs >= 1: a notice
structinit.train(config)
print("-- not quiet --", file=sys.stderr, flush=True)
config = dataclasses.replace(config, quiet=False, out="run")
structinit.compare(config, ["timm", "impulse"], seeds=[0], out="grid")
"""


def test_the_trainers_notice_is_one_line_once_a_cause_and_none_where_quiet(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", TRAIN], env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    quiet, shown = done.stderr.split("-- not quiet --\n")
    assert "warm-up" not in quiet, quiet
    notes = [line for line in shown.splitlines() if "--warmup-epochs" in line]
    assert len(notes) == 1, shown  # three runs, one cause: once
    assert notes[0].startswith("structinit: note: --warmup-epochs 3 >= --epochs 1: the whole run is warm-up"), shown
    assert "run.py" not in shown
