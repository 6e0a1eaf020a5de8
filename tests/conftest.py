import csv
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from structinit.inits.labels import BUNDLE

# `impulse` as it was before 0.3 (labels.label_before): sharp maps, x18, mimetic V/proj on the model's own
# weights; the tests of the solve's mechanics use it, test_bundle the paper's text that `impulse` is now
SHARP = BUNDLE


def pytest_configure(config):
    """Under pytest-xdist (`make test` runs two workers) each worker takes one torch thread: two workers of
    two threads each on two cores wait on each other's OpenMP teams."""
    if hasattr(config, "workerinput"):
        torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _own_solve_cache(tmp_path_factory):
    """`impulse`'s solved sharpness (inits/sharpness.py) kept in the run's own folder, not ~/.cache, one
    for both xdist workers (each value is solved once a run)."""
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "structinit-cache"
    folder.mkdir(exist_ok=True)
    os.environ["STRUCTINIT_CACHE"] = str(folder)


def small_vit(**kwargs):
    """A ViT for 32x32 images with patch 4 (8x8 grid), the paper's small-image configuration."""
    config = dict(img_size=32, patch_size=4, embed_dim=192, depth=2, num_heads=12, num_classes=10)
    config.update(kwargs)
    return timm.create_model("vit_tiny_patch16_224", **config)


@pytest.fixture
def make_vit():
    return small_vit


@pytest.fixture
def images():
    generator = torch.Generator().manual_seed(0)
    return torch.randn(4, 3, 32, 32, generator=generator)


def make_imagefolder(root, size, per_class=4, classes=("cat", "dog"), splits=("train", "test")):
    rng = np.random.default_rng(0)
    for split in splits:
        for cls in classes:
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    return root


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def load_benchmark(name):
    """A script of benchmarks/ as a module (registered in sys.modules: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def grid_rows(grid):
    """A grid's results.csv rows without the clock (secs): what two equal grids share."""
    with open(Path(grid) / "results.csv") as f:
        return [{k: v for k, v in row.items() if k != "secs"} for row in csv.DictReader(f)]


def assert_same_final_weights(grid, other):
    """Every run of `grid` ended with the weights of the same run in `other`."""
    runs = list(Path(grid).glob("per_class_*/*"))
    assert runs
    for run in runs:
        a = torch.load(run / "last.pt", map_location="cpu", weights_only=True)["model"]
        b = torch.load(Path(other) / run.relative_to(grid) / "last.pt", map_location="cpu", weights_only=True)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a), run.name
