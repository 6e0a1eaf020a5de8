"""Every VisionTransformer configuration the core issue promises, and the errors for what is not."""

import pytest
import timm
import torch
from timm.layers import build_sincos2d_pos_embed

import structinit
from conftest import SHARP, small_vit

VARIANTS = {
    "class token": {},
    "no_embed_class": dict(no_embed_class=True),
    "no class token, average pooling": dict(class_token=False, global_pool="avg"),
    "register tokens": dict(reg_tokens=4),
    "register tokens, no_embed_class": dict(reg_tokens=4, no_embed_class=True),
    "non-square grid": dict(img_size=(32, 48)),
    "dynamic_img_size": dict(dynamic_img_size=True),
    "patch 2 (16x16 grid)": dict(patch_size=2, num_heads=3),
    "qk-norm": dict(qk_norm=True),
    "no qkv bias": dict(qkv_bias=False),
}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_reaches_the_target_and_runs(name, images):
    model = small_vit(**VARIANTS[name])
    report = structinit.initialize(model, SHARP, seed=0)
    assert report.min_fidelity >= 0.95, str(report)
    height, width = model.patch_embed.img_size
    out = model(torch.randn(2, 3, height, width))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_qk_norm_gain_lives_in_the_norms():
    model = small_vit(qk_norm=True)
    structinit.initialize(model, SHARP, seed=0)
    norm = model.blocks[0].attn.q_norm
    assert torch.all(norm.weight == norm.weight[0]) and norm.weight[0] != 1.0


@pytest.mark.parametrize("fused", [True, False])
def test_fused_and_unfused_attention_give_the_same_model_output(fused):
    model = small_vit()
    structinit.initialize(model, SHARP, seed=0)
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    for block in model.blocks:
        block.attn.fused_attn = True
    reference = model(x)
    for block in model.blocks:
        block.attn.fused_attn = fused
    assert torch.allclose(model(x), reference, atol=1e-4)


def test_fixed_sincos_position_embedding():
    model = small_vit()
    table = build_sincos2d_pos_embed((8, 8), 192).unsqueeze(0)
    model.pos_embed = torch.nn.Parameter(torch.cat([torch.zeros(1, 1, 192), table], 1), requires_grad=False)
    report = structinit.initialize(model, SHARP, seed=0)
    assert report.min_fidelity >= 0.95
    assert torch.equal(model.pos_embed[0, 1:], table[0])  # a fixed (frozen) table is never rescaled


def test_deit_distilled_has_two_prefix_tokens():
    model = timm.create_model("deit_tiny_distilled_patch16_224", img_size=64, num_classes=10)
    report = structinit.initialize(model, SHARP, seed=0)
    assert model.num_prefix_tokens == 2 and report.min_fidelity >= 0.95


# --- errors ------------------------------------------------------------------------------------


def test_unsupported_model_lists_the_supported_families():
    with pytest.raises(TypeError, match=r"does not support ResNet models; supported: timm VisionTransformer"):
        structinit.initialize(timm.create_model("resnet18"), SHARP)
    with pytest.raises(TypeError, match=r"expected a torch\.nn\.Module, got str"):
        structinit.initialize("vit_tiny_patch16_224", SHARP)
    with pytest.raises(TypeError, match="does not support ResNet"):
        structinit.fidelity(timm.create_model("resnet18"))


def test_kernel_larger_than_the_grid():
    fits = r"build the model with patch_size=3 for 10x10 tokens \(--model-kwargs patch_size=3\), or use a kernel_size "
    fits += "of at most 7"
    with pytest.raises(ValueError, match=r"kernel_size 9 does not fit the 8x8 token grid: " + fits):
        structinit.initialize(small_vit(), SHARP, kernel_size=9)


def test_even_kernel():
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        structinit.initialize(small_vit(), SHARP, kernel_size=4)


def test_unknown_method():
    with pytest.raises(
        ValueError,
        match=r"unknown init method 'xavier' for timm VisionTransformer .*; choose one of timm, kaiming, mimetic, imp",
    ):
        structinit.initialize(small_vit(), "xavier")


def test_unknown_option_lists_the_method_options():
    with pytest.raises(
        TypeError, match=r"unknown option\(s\) sharpness for method 'impulse'; its options are: assignment"
    ):
        structinit.initialize(small_vit(), SHARP, sharpness=3)
    with pytest.raises(TypeError, match=r"unknown option\(s\) assignment for method 'timm'; its options are: none"):
        structinit.initialize(small_vit(), "timm", assignment="random")


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(assignment="spiral"), "assignment must be one of 'random', 'ordered', got 'spiral'"),
        (dict(solver="lbfgs"), "solver must be one of 'closed_form', 'refine', 'authors', got 'lbfgs'"),
        (dict(pseudo_input="image"), "pseudo_input must be one of"),
        (dict(target_fidelity=1.0), r"target_fidelity must be in \(0, 1\) or None, got 1.0"),
        (dict(pos_scale=-1.0), "pos_scale must be > 0 or None, got -1.0"),
        (dict(rcond=1.0), r"rcond must be in \[0, 1\), got 1.0"),
    ],
)
def test_bad_option_values(options, message):
    with pytest.raises(ValueError, match=message):
        structinit.initialize(small_vit(), SHARP, **options)


def test_bad_seed():
    with pytest.raises(TypeError, match="seed must be an int or None"):
        structinit.initialize(small_vit(), SHARP, seed="0")


def test_model_without_position_embedding():
    model = small_vit(pos_embed="none")
    with pytest.raises(ValueError, match="this model has none"):
        structinit.initialize(model, SHARP)
    report = structinit.initialize(model, "mimetic", seed=0)  # needs no position embedding
    assert report.mean_fidelity is None


def test_unsupported_attention_block():
    model = small_vit()
    model.blocks[1].attn = torch.nn.Identity()
    with pytest.raises(TypeError, match=r"block 1 of this VisionTransformer \(Block\) has Identity as its `attn`"):
        structinit.initialize(model, SHARP)


def test_fidelity_rejects_bad_images():
    with pytest.raises(ValueError, match=r"images must be a \(B, C, H, W\) tensor"):
        structinit.fidelity(small_vit(), torch.randn(3, 32, 32))


def test_blind_to_content_keeps_patch_content_out_of_the_logits():
    model = small_vit()  # patch 4: the patch embedding spans 49 of 192 dimensions
    structinit.initialize(model, SHARP, seed=0)
    attn = model.blocks[0].attn
    content = torch.cat([model.patch_embed.proj.weight.flatten(1), model.patch_embed.proj.bias[:, None]], 1)
    content = content - content.mean(0)
    wq, wk = attn.qkv.weight[:192], attn.qkv.weight[192:384]
    assert (wq @ content).abs().max() < 1e-4 * wq.abs().max() * content.abs().max()
    assert (wk @ content).abs().max() < 1e-4 * wk.abs().max() * content.abs().max()


def test_gap_sincos_preset_has_a_frozen_table_that_inits_leave_alone():
    from structinit.models import create_model

    model = create_model("vit_d6_p4_gap_sincos", num_classes=10, in_chans=3, data_size=32)
    table = build_sincos2d_pos_embed((8, 8), 192).unsqueeze(0)
    assert model.cls_token is None and model.global_pool == "avg" and not model.pos_embed.requires_grad
    assert torch.equal(model.pos_embed, table)
    for method in ("timm", SHARP):
        report = structinit.initialize(model, method, seed=0)
        assert torch.equal(model.pos_embed, table)
    assert report.min_fidelity >= 0.95
