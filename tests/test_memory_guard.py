"""The memory guard of a model's build (issue 75): a model's bytes and its init's work estimated from sketches
of it before anything is built (models.check_room, memory.estimated_bytes), so a model of 10^5 blocks or an
init's maps of 1024 heads are one line in milliseconds, not minutes of building or a failure after the
report; the digest of the weights copies none of them."""

import time
import tracemalloc

import pytest
import timm
import torch
from torch import nn

from structinit import memory, models
from structinit.cli import main
from structinit.errors import RunError
from structinit.files import weights_sha256
from structinit.inits.labels import InitSpec


@pytest.fixture
def nothing_built(monkeypatch):
    """timm's builds allowed only as sketches (on the meta device): a model built for real fails the test."""
    create = timm.create_model

    def sketched_only(*args, **kwargs):
        model = create(*args, **kwargs)
        assert next(model.parameters()).is_meta, "a model was built before the guard refused it"
        return model

    monkeypatch.setattr(timm, "create_model", sketched_only)


def one_line(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and not captured.out, (captured.out, err)
    return err[0]


def test_a_model_of_very_many_blocks_is_one_line_before_any_is_built(monkeypatch, capsys, nothing_built):
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**9)
    started = time.perf_counter()
    assert main(["init", "vit_tiny_patch16_224", "--model-kwargs", "depth=100000", "--init", "timm"]) == 2
    assert time.perf_counter() - started < 10  # it grew block by block for minutes
    said = one_line(capsys)
    assert "vit_tiny_patch16_224 (1,000 classes, depth=100000) and its timm init needs 177.9 GB of memory" in said
    assert "this process can have 1.0 GB: give a smaller model" in said


def test_an_inits_maps_of_many_heads_are_one_line_before_the_model_is_built(monkeypatch, capsys, nothing_built):
    monkeypatch.setattr(memory, "available_bytes", lambda: 3 * 10**8)  # the model's 53 MB fit; its maps do not
    argv = ["init", "vit_tiny_patch16_224", "--model-kwargs", "embed_dim=1024,num_heads=1024,depth=1"]
    assert main([*argv, "--init", "kaiming"]) == 2
    said = one_line(capsys)  # no report printed before it
    assert "num_heads=1024, depth=1) and its kaiming init needs 535.3 MB of memory" in said
    assert "(fewer classes, width, depth, heads or tokens)" in said


def test_mimetics_targets_for_every_head_are_counted(monkeypatch, nothing_built):
    monkeypatch.setattr(memory, "available_bytes", lambda: 8 * 10**9)  # the model's 0.6 GB fit, and 8 heads' work
    options, mimetic = dict(embed_dim=1024, num_classes=10, in_chans=3), InitSpec.parse("mimetic")
    assert models.check_room("vit_tiny_patch16_224", {**options, "num_heads": 8}, mimetic, "8 heads")
    with pytest.raises(RunError, match=r"^256 heads and its mimetic init needs 16.\d GB of memory"):
        models.check_room("vit_tiny_patch16_224", {**options, "num_heads": 256}, mimetic, "256 heads")


@pytest.mark.parametrize(
    "name, counts",
    [
        ("vit_digits", {"depth": 7}),
        ("swin_d6_p2_w4", {"depths": (3, 5)}),
        ("cait_xxs24_224", {"depth": 5, "depth_token_only": 3, "img_size": 32, "patch_size": 4}),
        ("mixer_d6_p4", {"num_blocks": 5}),
        ("convmixer_d6_p4", {"depth": 5}),
    ],
)
def test_sketches_of_one_and_two_blocks_give_the_models_own_bytes(name, counts):
    arch, preset = models.PRESETS.get(name, (name, {}))
    options = {**preset, **counts, "num_classes": 10, "in_chans": 3}
    build = arch if callable(arch) else lambda **kwargs: timm.create_model(arch, **kwargs)
    estimated = memory.estimated_bytes(build, options, memory.model_bytes, room=0)  # no room: no bound, exact
    built = memory.model_bytes(build(**options))
    assert built <= estimated <= built * 1.01  # Swin's shifted blocks carry a mask the first lacks: over, a little


def test_a_sketch_leaves_torchs_random_state_as_it_was():
    torch.manual_seed(0)
    state = torch.random.get_rng_state()
    memory.sketched(lambda **kwargs: timm.create_model("vit_tiny_patch16_224", **kwargs), {"depth": 2})
    assert torch.equal(torch.random.get_rng_state(), state)


class ReadsItsWeights(nn.Module):
    """A model whose constructor reads a value of its weights: no sketch of it can be made."""

    def __init__(self, width: int = 8, num_classes: int = 10, in_chans: int = 3) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width, width))
        self.scale = float(self.weight.sum())


def test_a_model_that_cannot_be_sketched_is_counted_as_it_is_built(monkeypatch):
    monkeypatch.setitem(models.PRESETS, "reads_its_weights", (ReadsItsWeights, {}))
    monkeypatch.setattr(memory, "available_bytes", lambda: 10**9)
    with pytest.raises(RunError, match=r"\(a tensor of 10,000,000,000 values\) needs 40.0 GB of memory or more"):
        models.create_model("reads_its_weights", num_classes=10, in_chans=3, data_size=None, width=100_000)


def test_the_digest_of_the_weights_copies_none_of_them():
    state = {"big": torch.zeros(10**7)}  # 40 MB
    tracemalloc.start()
    try:
        weights_sha256(state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 10**6  # a copy of the tensor's bytes was 40 MB more, after the report, where memory was short
