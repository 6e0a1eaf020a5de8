"""The init as a file: `structinit init --save` and `save_init` write weights that timm's
load_checkpoint takes and that train exactly like the in-process call; wrapped models initialise
through their wrapper; presets build at their own image size."""

import pytest
import timm
import torch
import torch.distributed as dist
from safetensors import safe_open
from timm.models import load_checkpoint

from structinit import initialize, save_init
from structinit.cli import main
from structinit.models import create_model

TINY = dict(img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, num_classes=10)
TINY_FLAGS = ["--model-kwargs", "img_size=16,patch_size=4,depth=2,embed_dim=32,num_heads=2,num_classes=10"]


def tiny_vit() -> torch.nn.Module:
    return timm.create_model("vit_tiny_patch16_224", **TINY)


def losses_of_a_plain_loop(model: torch.nn.Module, steps: int = 5) -> list[torch.Tensor]:
    """What any trainer does: a few SGD steps on fixed data."""
    data = torch.Generator().manual_seed(1)
    images, labels = torch.randn(8, 3, 16, 16, generator=data), torch.randint(10, (8,), generator=data)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_saved_init_loads_with_timm_and_trains_like_the_in_process_call(tmp_path, suffix, capsys):
    path = tmp_path / f"init{suffix}"
    assert main(["init", "vit_tiny_patch16_224", *TINY_FLAGS, "--seed", "3", "--save", str(path)]) == 0
    assert f"saved to {path}" in capsys.readouterr().out

    loaded = tiny_vit()  # a fresh, differently seeded timm model, as train.py builds it
    load_checkpoint(loaded, str(path))
    torch.manual_seed(3)  # `structinit init --seed` seeds the construction too
    in_process = tiny_vit()
    initialize(in_process, "impulse", seed=3)
    for name, tensor in in_process.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    assert all(map(torch.equal, losses_of_a_plain_loop(loaded), losses_of_a_plain_loop(in_process)))


def test_safetensors_record_the_init_and_the_digest(tmp_path):
    model = tiny_vit()
    report = initialize(model, "impulse", seed=4, target_fidelity=0.9)
    digest = save_init(model, tmp_path / "init.safetensors", report, model_kwargs=TINY)
    with safe_open(str(tmp_path / "init.safetensors"), "pt") as f:
        metadata = f.metadata()
    assert metadata["weights_sha256"] == digest and metadata["method"] == "impulse" and metadata["seed"] == "4"
    assert '"target_fidelity": 0.9' in metadata["options"]
    assert save_init(model, tmp_path / "init.pt") == digest  # the same weights in either format


def test_save_init_refuses_what_it_cannot_write(tmp_path):
    model = tiny_vit()
    with pytest.raises(ValueError, match=r"save the init as one of \.safetensors, \.pth, \.pt, got 'init.bin'"):
        save_init(model, tmp_path / "init.bin")
    with pytest.raises(ValueError, match="does not exist: create it first"):
        save_init(model, tmp_path / "nope" / "init.pt")
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        save_init(model, tmp_path / "dir.pt")
    assert main(["init", "vit_tiny_patch16_224", *TINY_FLAGS, "--save", str(tmp_path / "w.npz")]) == 2
    assert list(tmp_path.iterdir()) == [tmp_path / "dir.pt"]  # nothing written, no temporary file left


def test_initialize_goes_through_torch_compile_and_ddp_wrappers(tmp_path):
    torch.manual_seed(0)  # the weights the init leaves are the constructor's
    reference = tiny_vit()
    initialize(reference, "impulse", seed=0)

    torch.manual_seed(0)
    plain = tiny_vit()
    report = initialize(torch.compile(plain), "impulse", seed=0)  # compiles nothing until called
    assert report.model == "VisionTransformer"
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), reference.state_dict().values()))

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        wrapped = torch.nn.parallel.DistributedDataParallel(tiny_vit())
        initialize(wrapped, "impulse", seed=0)
        save_init(wrapped, tmp_path / "ddp.pt")
    finally:
        dist.destroy_process_group()
    saved = torch.load(tmp_path / "ddp.pt", map_location="cpu", weights_only=True)
    assert saved.keys() == reference.state_dict().keys()  # no "module." prefix
    assert all(torch.equal(saved[k], v) for k, v in reference.state_dict().items())


@pytest.mark.parametrize(
    "name, data_size, kwargs, img_size",
    [
        ("vit_digits", None, {}, 8),
        ("vit_w96_d4_p4", None, {}, 32),
        ("vit_digits", 16, {}, 16),
        ("vit_d6_p4", None, {"img_size": 64}, 64),
        ("vit_d6_p4", 32, {"img_size": 32}, 32),
        ("vit_d6_p4", 32, {"img_size": 64, "dynamic_img_size": True}, 64),
    ],
)
def test_presets_build_at_their_own_image_size_unless_data_or_a_flag_says_otherwise(name, data_size, kwargs, img_size):
    model = create_model(name, num_classes=10, in_chans=3, data_size=data_size, **kwargs)
    assert model.patch_embed.img_size == (img_size, img_size)


def test_an_image_size_that_does_not_fit_the_in_memory_data_is_refused():
    """Nothing resizes in-memory images: the model would fail on its first batch, deep in timm."""
    with pytest.raises(ValueError, match="img_size=64 does not fit the 32 px images of the data"):
        create_model("vit_d6_p4", num_classes=10, in_chans=3, data_size=32, img_size=64)
    with pytest.raises(ValueError, match=r"img_size=\(32, 64\) does not fit the 32 px images of the data"):
        create_model("vit_d6_p4", num_classes=10, in_chans=3, data_size=32, img_size=(32, 64))


def test_structinit_init_of_a_small_image_preset_is_quick(capsys):
    """vit_digits at its own 8 px: 64 tokens (it once built 224 px at patch 1, 50,176 tokens)."""
    assert main(["init", "vit_digits"]) == 0
    assert "weights sha256" in capsys.readouterr().out
