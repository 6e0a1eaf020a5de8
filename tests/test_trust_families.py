"""Every family at its edges (issue 60): a refusal is one line naming the cause, and the model is unchanged."""

import pytest
import timm
import torch
from timm.models.convmixer import ConvMixer
from timm.models.mlp_mixer import MlpMixer

import structinit

EMPTY = {
    "relpos ViT": lambda: timm.create_model("vit_relpos_small_patch16_224", img_size=32, patch_size=4, depth=0),
    "BEiT": lambda: timm.create_model("beit_base_patch16_224", img_size=32, patch_size=4, depth=0),
    "MLP-Mixer": lambda: MlpMixer(num_classes=10, img_size=32, patch_size=4, num_blocks=0, embed_dim=32),
    "ConvMixer": lambda: ConvMixer(dim=16, depth=0, kernel_size=3, patch_size=4, num_classes=10),
    "ViT": lambda: timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=0),
}


def refused_unchanged(model, method, match):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=match):
        structinit.initialize(model, method, seed=0)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


@pytest.mark.parametrize("family", sorted(EMPTY))
def test_a_model_with_no_blocks_is_refused_in_one_line(family):
    refused_unchanged(EMPTY[family](), "impulse", r"the model has no blocks \(blocks is empty: built with depth 0\)")


def test_a_transformers_vit_with_no_layers_is_refused_as_empty_not_as_an_old_layout():
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=32, patch_size=4, num_hidden_layers=0, hidden_size=32, num_attention_heads=2, intermediate_size=64
    )
    refused_unchanged(transformers.ViTModel(config), "impulse", r"the model has no blocks \(.* is empty")


def test_convmixer_impulse_with_an_even_kernel_is_refused_and_changes_nothing():
    model = ConvMixer(dim=16, depth=2, kernel_size=4, patch_size=4, num_classes=10)
    refused_unchanged(model, "impulse", "this ConvMixer's 4 x 4 filters have no centre")
    structinit.initialize(model, "box", seed=0)  # box and random take any kernel


@pytest.mark.parametrize("written", ["freeze=true", "freeze=True", "freeze=TRUE"])
def test_convmixer_freeze_is_read_as_yaml_and_the_shell_write_it(written):
    model = ConvMixer(dim=16, depth=2, kernel_size=3, patch_size=4, num_classes=10)
    structinit.initialize(model, f"impulse[{written}]", seed=0)
    assert not any(
        conv.weight.requires_grad for conv in model.modules() if isinstance(conv, torch.nn.Conv2d) and conv.groups > 1
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: MlpMixer(num_classes=10, img_size=32, patch_size=4, num_blocks=1, embed_dim=32),
        lambda: timm.create_model(
            "swin_tiny_patch4_window7_224",
            img_size=32,
            patch_size=2,
            window_size=4,
            depths=(1, 1),
            num_heads=(2, 2),
            embed_dim=32,
        ),
    ],
    ids=["MLP-Mixer", "Swin"],
)
def test_impulse_neurips_on_another_family_names_the_bundle_not_options_never_written(build):
    refused_unchanged(
        build(), "impulse-neurips", r"impulse-neurips is a setting of the plain ViT's impulse init .* use impulse"
    )


def test_the_authors_solver_with_a_target_fidelity_is_refused_not_ignored():
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, depth=1)
    refused_unchanged(model, "impulse-neurips[target_fidelity=0.5]", r"target_fidelity=0.5: the authors' solver")
