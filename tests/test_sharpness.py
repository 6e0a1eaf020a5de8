"""`impulse`'s sharpness (inits/sharpness.py, inits/paper_solve.py): the paper's solve, its shortcut,
the shipped table and the cache, which neither lies nor hangs nor stops the init."""

import functools
import json
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

import structinit
from conftest import small_vit
from structinit.errors import Notice
from structinit.inits import progress, sharpness
from structinit.inits.paper_solve import SATURATED, STEPS, paper_solve, saturated
from structinit.models import create_model

LEDGER = Path(__file__).resolve().parents[1] / "docs" / "solve-grid.jsonl"


def tiny_vit():
    """A 4 x 4 grid, width 32, 2 heads: the paper's solve on it takes about a second."""
    return small_vit(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2)


def impulse(**kwargs):
    return structinit.initialize(tiny_vit(), "impulse", seed=0, **kwargs)


@pytest.fixture
def real_cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("STRUCTINIT_CACHE", str(folder))
    return folder


@pytest.fixture
def cache(real_cache, monkeypatch):
    """The cache's tests: the paper's solve cut to 300 steps (what is kept, and how, is the same)."""
    monkeypatch.setattr(sharpness, "paper_solve", functools.partial(paper_solve, steps=300))
    return real_cache


def kept_file(cache):
    (path,) = (cache / sharpness.CACHE_FOLDER).iterdir()
    return path


def value_of(report):
    return float(report.source["target_fidelity"].split()[0])


def test_a_value_is_solved_once_then_read_from_the_cache(real_cache):
    cache = real_cache
    first = impulse()
    assert first.source["target_fidelity"].endswith("solved here)")
    again = impulse()
    assert again.source["target_fidelity"].endswith("the cache)") and value_of(again) == value_of(first)
    record = json.loads(kept_file(cache).read_text())
    assert record["mass"] == value_of(first) and 0 < record["steps"] <= STEPS


@pytest.mark.parametrize(
    "planted", [{"mass": 1e-300}, {"mass": 2.0}, {"mass": "0.5"}, {"mass": True}, {"mass": 0.555}, [0.5]]
)
def test_a_value_the_solver_cannot_write_is_solved_again_with_a_note_naming_the_file(cache, planted):
    first = value_of(impulse())
    path = kept_file(cache)
    path.write_text(json.dumps(planted))
    with pytest.warns(Notice, match=re.escape(str(path))):
        again = impulse()
    assert value_of(again) == first and again.source["target_fidelity"].endswith("solved here)")
    assert json.loads(path.read_text())["mass"] == first  # the planted value is replaced


def _on_alarm(signum, frame):
    raise TimeoutError("the init hung on the cache")


def test_a_fifo_at_the_cache_file_does_not_hang_the_init(cache):
    first = value_of(impulse())
    path = kept_file(cache)
    path.unlink()
    os.mkfifo(path)
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(120)
    try:
        with pytest.warns(Notice, match="FIFO"):
            assert value_of(impulse()) == first
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert stat.S_ISFIFO(os.lstat(path).st_mode)  # a write replaces only a regular file: the FIFO stays (issue 67)


def test_a_link_to_dev_zero_is_not_read_and_not_written_through(cache):
    first = value_of(impulse())
    path = kept_file(cache)
    path.unlink()
    path.symlink_to("/dev/zero")
    with pytest.warns(Notice) as notes:
        assert value_of(impulse()) == first
    said = " ".join(str(note.message) for note in notes)
    assert "character device" in said and "not kept" in said and f"impulse[target_fidelity={first}]" in said
    assert path.is_symlink()


@pytest.mark.parametrize(
    ("text", "why"), [("[" * 200_000 + "]" * 200_000, "larger than"), ("[" * 2_000 + "]" * 2_000, "too deep")]
)
def test_a_deep_or_large_cache_file_is_refused_and_replaced(cache, text, why):
    first = value_of(impulse())
    path = kept_file(cache)
    path.write_text(text)
    with pytest.warns(Notice, match=why):
        assert value_of(impulse()) == first
    assert json.loads(path.read_text())["mass"] == first


@pytest.mark.parametrize("where", ["cache", "folder"])
def test_a_cache_that_cannot_be_written_leaves_the_init_working(cache, where):
    blocked = cache if where == "cache" else cache / sharpness.CACHE_FOLDER
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where a folder should be\n")
    for _ in range(2):  # the value is not kept: solved, and noted, each time
        with pytest.warns(Notice, match="not kept"):
            report = impulse()
        assert report.source["target_fidelity"].endswith("solved here)")
    assert blocked.read_text() == "a file where a folder should be\n"


WRITER = """
import sys, torch
from structinit.inits import progress, sharpness
class Solved:
    def __init__(self, mass): self.mass, self.steps = mass, 1
sharpness.paper_solve = lambda pseudo, *a, **k: Solved(float(pseudo[0, 0]) / 100)
for i in range(30):
    key = int(sys.argv[1]) * 30 + i
    pseudo = torch.full((4, 8), float(key % 90 + 5))
    pseudo[1, 1] = key
    assert sharpness.paper_sharpness(pseudo, (2, 2), 1, 3)[1] == "solved here"
"""


def test_concurrent_writers_keep_every_key(cache):
    env = {**os.environ, "PYTHONPATH": str(Path(structinit.__file__).parents[1])}
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, str(n)], env=env) for n in range(4)]
    assert [w.wait(timeout=300) for w in writers] == [0] * 4
    assert len(list((cache / sharpness.CACHE_FOLDER).iterdir())) == 120
    for key in range(120):
        pseudo = torch.full((4, 8), float(key % 90 + 5))
        pseudo[1, 1] = key
        assert sharpness.paper_sharpness(pseudo, (2, 2), 1, 3) == ((key % 90 + 5) / 100, "the cache")


def test_a_long_solve_says_how_long_and_how_to_skip_it_and_shows_a_bar(cache, monkeypatch):
    monkeypatch.setattr(sharpness, "NOTICE_SECONDS", 0.0)
    bars = []

    class Bar:
        def __init__(self, total, description):
            self.total, self.done, self.closed = total, 0, False
            bars.append(self)

        def update(self, n):
            self.done += n

        def close(self):
            self.closed = True

    token = progress.PROGRESS_BAR.set(Bar)
    try:
        with pytest.warns(Notice) as notes:
            impulse()
    finally:
        progress.PROGRESS_BAR.reset(token)
    (note,) = [str(n.message) for n in notes if "solve for this model" in str(n.message)]
    assert "16 tokens, width 32, 2 heads" in note and re.search(r"up to \d+ s on \d CPU thread", note)
    assert "impulse[target_fidelity=X] skips it" in note[:200]  # within what the command's one line shows
    (bar,) = bars
    steps = json.loads(kept_file(cache).read_text())["steps"]
    assert bar.total == STEPS and bar.closed and bar.done == steps


def test_the_solve_stops_once_saturated_and_the_full_solve_agrees():
    pseudo = sharpness.standard_pseudo("learned", (4, 4), 64, 1e-6)
    fast = paper_solve(pseudo, (4, 4), 1, 3, stop_saturated=True)
    full = paper_solve(pseudo, (4, 4), 1, 3)
    assert fast.saturated and fast.steps < STEPS and fast.mass >= SATURATED
    assert full.steps == STEPS and sharpness.rounded(full.mass) == sharpness.rounded(fast.mass) == 0.99
    assert full.trace[: len(fast.trace)] == fast.trace  # the same solve, stopped


def test_the_shortcut_is_taken_only_within_the_shapes_the_full_solves_cover(monkeypatch):
    shipped = json.loads(sharpness.TABLE.read_text())
    for tokens, width in shipped["shortcut"]:  # what benchmarks/solve_grid.py found
        assert sharpness.shortcut(tokens, width) and sharpness.shortcut(tokens // 2, width // 2)
    monkeypatch.setattr(sharpness, "_shipped", lambda: {**shipped, "shortcut": [[64, 384], [196, 192]]})
    assert sharpness.shortcut(64, 192) and sharpness.shortcut(196, 64) and sharpness.shortcut(16, 384)
    assert not sharpness.shortcut(196, 384) and not sharpness.shortcut(256, 64) and not sharpness.shortcut(64, 768)


def test_saturation_is_a_rising_trace_at_the_threshold():
    assert saturated([0.990, 0.993, 0.994, 0.996])
    assert not saturated([0.990, 0.993, 0.997, 0.996])  # falling at the end
    assert not saturated([0.991, 0.992, 0.993, 0.994])  # below the threshold
    assert not saturated([0.996, 0.997, 0.998])  # too few checks


@pytest.mark.parametrize("index", [0, 1, 2])
def test_the_full_solve_reproduces_the_committed_grid(index):
    """The ledger's cheapest rows, solved again here: the same value to the solve's precision (0.01)."""
    rows = sorted(
        (json.loads(line) for line in LEDGER.read_text().splitlines()), key=lambda r: r["grid"][0] * r["width"]
    )
    row = [r for r in rows if r["kind"] == "sincos" and r["heads"] == 1][index]
    pseudo = sharpness.standard_pseudo(row["kind"], tuple(row["grid"]), row["width"], row["eps"])
    solved = paper_solve(pseudo, tuple(row["grid"]), row["heads"], row["kernel"], stop_saturated=False)
    assert abs(solved.mass - row["reached"]) <= 0.01


def test_the_table_serves_the_presets_and_the_readme_model_without_a_solve(cache, monkeypatch):
    monkeypatch.setattr(sharpness, "paper_solve", None)  # any solve would fail
    for name, expected in [("vit_w96_d6_p2_gap_sincos", 0.09), ("vit_w256_d8_p2_gap_sincos", 0.41)]:
        model = create_model(name, num_classes=10, in_chans=3, data_size=None)
        report = structinit.initialize(model, "impulse", seed=0)
        assert (
            report.source["target_fidelity"] == f"{expected} (what the paper's solve reaches here; structinit's table)"
        )
    readme = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=10)
    assert structinit.initialize(readme, "impulse", seed=0).source["target_fidelity"].endswith("structinit's table)")
    assert not cache.exists()


@pytest.mark.parametrize(
    "name, image, patch",
    [("vit_small_patch16_224", 64, 4), ("vit_base_patch16_224", 96, 8), ("deit_tiny_patch16_224", 128, 8)],
)
def test_the_table_serves_timms_families_at_the_sizes_small_data_is_trained_at(cache, monkeypatch, name, image, patch):
    """A user's first cold impulse on a common custom shape (issue 76: 65 s for vit_small at 64 px, patch 4, on a
    2-core CPU without AVX-512) solves nothing: the shipped table has it (solve_grid.py --part common)."""
    monkeypatch.setattr(sharpness, "paper_solve", None)  # any solve would fail
    model = timm.create_model(name, img_size=image, patch_size=patch, num_classes=10)
    assert structinit.initialize(model, "impulse", seed=0).source["target_fidelity"].endswith("structinit's table)")
    assert not cache.exists()


def test_the_shipped_table_is_the_ledgers_full_solves():
    """Every entry is a line of docs/solve-grid.jsonl (solve_grid.py --write), its value the full solve's."""
    rows = {
        (r["kind"], *r["grid"], r["width"], r["heads"], r["kernel"], r["eps"]): r["mass"]
        for r in map(json.loads, LEDGER.read_text().splitlines())
        if r["part"] in ("table", "common")
    }
    entries = json.loads(sharpness.TABLE.read_text())["entries"]
    assert len(entries) == len(rows) >= 100
    for e in entries:
        assert rows[(e["kind"], *e["grid"], e["width"], e["heads"], e["kernel"], e["eps"])] == e["mass"]


def test_the_table_matches_the_pseudo_input_itself():
    pseudo = sharpness.standard_pseudo("learned", (8, 8), 192, 1e-6)
    assert sharpness.table_value(pseudo, (8, 8), 3, 3) == 0.99
    assert sharpness.table_value(pseudo + 1e-3, (8, 8), 3, 3) is None  # another pseudo input
    assert sharpness.table_value(pseudo, (8, 8), 3, 5) is None  # another kernel
    other_eps = sharpness.standard_pseudo("learned", (8, 8), 192, 1e-5)
    assert sharpness.table_value(other_eps, (8, 8), 3, 3) is None


def test_the_solve_reaches_the_same_mass_at_any_thread_count():
    """Its heads shared among threads (each of one torch thread): every head's arithmetic is the same."""
    pseudo = sharpness.standard_pseudo("sincos", (4, 4), 64, 1e-6)
    masses = {threads: paper_solve(pseudo, (4, 4), 4, 3, steps=500, threads=threads).mass for threads in (1, 2, 3)}
    assert masses[1] == masses[2] == masses[3], masses
