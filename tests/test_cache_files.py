"""The data's caches (decoded images, image digests) follow the rules of the solve's cache
(cachefiles.py): a file the cache could not have written is not a reason to fail, hang or run out of
memory, and a cache that cannot be written costs the work again, not the run."""

import json

import pytest
import torch

from conftest import make_imagefolder
from structinit.cachefiles import keep, read_kept
from structinit.data.datasets import load_data
from structinit.errors import Notice


def loaded(root, cache):
    data = load_data(f"imagefolder:{root}", cache_dir=cache)
    return data.train_images, data.test_images


@pytest.fixture
def folder(tmp_path):
    return make_imagefolder(tmp_path / "photos", size=8)


def test_a_deep_or_huge_digests_file_is_read_as_none_and_written_again(folder, tmp_path):
    cache = tmp_path / "cache"
    first = loaded(folder, cache)
    for text in ("[" * 200_000 + "]" * 200_000, "{" + '"a": ' * 50_000 + "1" + "}" * 50_000):
        for path in cache.glob("digests-*.json"):
            path.write_text(text)
        again = loaded(folder, cache)
        assert all(torch.equal(a, b) for a, b in zip(first, again))
        for path in cache.glob("digests-*.json"):
            assert isinstance(json.loads(path.read_text()), dict)  # the digests, taken again and kept


def test_decoded_images_that_cannot_be_kept_are_decoded_and_the_run_goes_on(folder, tmp_path):
    cache = tmp_path / "cache"
    first = loaded(folder, cache)
    for path in cache.glob("images-*.pt"):
        path.unlink()
        path.mkdir()  # a folder where the file goes: it cannot be written
    with pytest.warns(Notice, match="decoded images are not kept"):
        again = loaded(folder, cache)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_read_kept_refuses_what_a_cache_does_not_write(tmp_path):
    path = tmp_path / "kept.json"
    assert read_kept(path, 100) == (None, None)  # nothing kept
    assert keep(path, {"mass": 0.5}) is None and read_kept(path, 100) == ({"mass": 0.5}, None)
    path.write_text("x" * 101)
    assert read_kept(path, 100) == (None, f"{path} is larger than 100 bytes")
    path.write_bytes(b"\xff\xfe{")
    assert read_kept(path, 100)[1].startswith(f"{path} is not JSON")
    path.write_text("[" * 2_000 + "]" * 2_000)
    assert read_kept(path, 10_000) == (None, f"{path} is nested too deep to read")
    path.unlink()
    path.mkdir()
    assert "is a directory, not a regular file" in read_kept(path, 100)[1]
    assert keep(path, 1).startswith(f"cannot write {path}")
