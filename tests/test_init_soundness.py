"""The init is right on every model it accepts, and a refusal changes nothing (issue 49, item 10, and
item 8's frozen model): post-norm blocks are solved and measured on what their attention reads, every
impulse form warns when its maps fall short, every refusal comes before the first write, and the
refusals name the block they refuse."""

import warnings

import pytest
import timm
import torch
from timm.layers import build_sincos2d_pos_embed
from timm.models.mlp_mixer import MlpMixer
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer

import structinit
from conftest import SHARP
from structinit.models import create_model
from structinit.offsets import offset_mass
from structinit.report import best_offsets

EVA_POST_NORM = dict(use_rot_pos_emb=False, use_abs_pos_emb=True, use_post_norm=True)
POST_NORM = {
    # timm's vit_base_patch16_rpn_224 layout (ResPostBlock), and Eva with post-norm blocks
    "vit-rpn": lambda: timm.create_model(
        "vit_base_patch16_rpn_224", img_size=32, patch_size=4, embed_dim=192, depth=3, num_heads=3, num_classes=10
    ),
    "eva-post-norm": lambda: timm.create_model(
        "eva02_tiny_patch14_224", img_size=32, patch_size=4, depth=3, num_classes=10, **EVA_POST_NORM
    ),
}


def maps_on_a_blank_image(model):
    """Per block, the (1, heads, T, T) softmax maps the model's own attention computes in a forward
    pass whose patch embedding is zero (prefix tokens plus position embedding: the pseudo input),
    captured where timm's attention drops out of them."""
    maps, hooks = [], []
    for block in model.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda module, args, out: maps.append(out.detach())))
    hooks.append(model.patch_embed.register_forward_hook(lambda module, args, out: torch.zeros_like(out)))
    model.eval()
    with torch.no_grad():
        model.forward_features(torch.zeros(1, 3, 32, 32))
    for hook in hooks:
        hook.remove()
    return maps


# --- post-norm blocks: solved and measured on what the attention reads ------------------------------


@pytest.mark.parametrize("family", POST_NORM)
@pytest.mark.parametrize("init", [SHARP, "impulse-soft"])
def test_a_post_norm_models_report_is_what_its_attention_does(family, init):
    """A post-norm block's attention reads the block's input unnormalised (norm1 follows it), and
    block i > 0 reads block i - 1's output: the init solved block 0 on norm1 of the tokens and every
    block on the same tokens, so the report said 0.30 where the maps were 1.00 (vit-rpn), or 0.98
    where they were 0.1-0.3 (Eva). Now every head's reported fidelity is what its attention puts on
    the offset in the model's own forward pass on the pseudo input, and that offset is its best."""
    model = POST_NORM[family]()
    report = structinit.initialize(model, init, seed=0)
    grid, prefix = model.patch_embed.grid_size, model.num_prefix_tokens
    for layer, maps in zip(report.layers, maps_on_a_blank_image(model), strict=True):
        offsets = [head.offset for head in layer.heads]
        real = offset_mass(maps, offsets, grid, prefix).tolist()
        assert [head.fidelity for head in layer.heads] == pytest.approx(real, abs=1e-3), layer.index
        assert [best.offset for best in best_offsets(maps, 3, grid, prefix)] == offsets
    target = report.options["target_fidelity"]
    assert report.min_fidelity == pytest.approx(target, abs=5e-3)


@pytest.mark.parametrize("family", POST_NORM)
def test_fidelity_of_a_post_norm_model_on_the_pseudo_input_is_its_forward_pass(family):
    """`structinit.fidelity(model)` without images measures the same maps as the forward pass on the
    pseudo input, best offset and mass per head."""
    model = POST_NORM[family]()
    structinit.initialize(model, "impulse-soft", seed=0)
    measured = structinit.fidelity(model)
    grid, prefix = model.patch_embed.grid_size, model.num_prefix_tokens
    for layer, maps in zip(measured.layers, maps_on_a_blank_image(model), strict=True):
        real = best_offsets(maps, 3, grid, prefix)
        assert [h.offset for h in layer.heads] == [h.offset for h in real], layer.index
        assert [h.fidelity for h in layer.heads] == pytest.approx([h.fidelity for h in real], abs=1e-3)


# --- impulse-neurips warns where its maps fall short, as every other impulse form does -------------


@pytest.mark.parametrize(
    "name, kwargs, uniform",
    [
        ("vit_tiny_p4", dict(embed_dim=64, num_heads=1, depth=1), "0.015"),  # 1 head of width 64: 1/65 exactly
        ("vit_w96_d6_p2_gap_sincos", dict(depth=1), "0.004"),  # the 256-token regime's model: 1/256
    ],
)
def test_the_authors_solver_warns_when_its_maps_are_uniform(name, kwargs, uniform, make_vit):
    """The authors' solver can give uniform maps; the closed form warns when a head falls short of
    target_fidelity, and so does it now, with the uniform value beside the fidelity reached. Where its
    maps are sharp (3 heads of width 64 on 65 tokens: > 0.99) it stays silent."""
    torch.manual_seed(0)
    model = create_model(name, num_classes=10, in_chans=3, data_size=None, **kwargs)
    with pytest.warns(UserWarning, match=rf"fidelity {uniform} \(a uniform map: {uniform}\), short of target_fidelity"):
        report = structinit.initialize(model, "impulse-neurips", seed=0)
    assert f"{report.min_fidelity:.3f}" == uniform
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert structinit.initialize(make_vit(num_heads=3), "impulse-neurips", seed=0).min_fidelity > 0.99


# --- a refusal changes nothing: every check comes before the first write ----------------------------


def vit(**kwargs):
    config = dict(img_size=32, patch_size=4, embed_dim=192, depth=2, num_heads=3, num_classes=10)
    return timm.create_model("vit_tiny_patch16_224", **{**config, **kwargs})


def non_affine_qk_norms():
    model = vit(qk_norm=True)
    for block in model.blocks:
        block.attn.q_norm = nn.LayerNorm(64, elementwise_affine=False)
        block.attn.k_norm = nn.LayerNorm(64, elementwise_affine=False)
    return model


def zero_position_teacher():
    teacher = vit(embed_dim=384, num_heads=6)
    teacher.pos_embed.data.zero_()
    return teacher


# name -> (the model, the init label, its options as keywords, the refusal); built when the case runs
REFUSALS = {
    # the example: the whole model redrawn, then refused
    "impulse[base=kaiming] without a position embedding": (
        lambda: vit(pos_embed="none"),
        "impulse[base=kaiming,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic]",
        dict,
        "this model has none",
    ),
    "impulse without a position embedding": (lambda: vit(pos_embed="none"), SHARP, dict, "this model has none"),
    "impulse at depth 0": (
        lambda: vit(depth=0),
        SHARP,
        dict,
        r"the model has no blocks \(blocks is empty: built with depth 0\)",
    ),
    "impulse[scale=content] with a norm after the patch projection": (
        lambda: vit(embed_norm_layer="layernorm"),
        "impulse[scale=content,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
        dict,
        "scale=content divides",
    ),
    "impulse with q/k norms that have no weight": (non_affine_qk_norms, SHARP, dict, "needs affine q/k norms"),
    "qk-norm[pos_scale=18] on a model with q/k norms": (
        lambda: vit(qk_norm=True),
        "qk-norm[pos_scale=18.0]",
        dict,
        "this model normalises each head's q and k",
    ),
    "select from a teacher of another grid": (
        vit,
        "select",
        lambda: dict(teacher=vit(img_size=64, embed_dim=384, num_heads=6)),
        "other token counts",
    ),
    "select[qk=impulse] without a position embedding": (
        lambda: vit(pos_embed="none"),
        "select[qk=impulse]",
        lambda: dict(teacher=vit(pos_embed="none", embed_dim=384, num_heads=6)),
        "this model has none",
    ),
    "select[qk=impulse,pos_scale=18] from a constant position embedding": (
        vit,
        "select[qk=impulse,pos_scale=18.0]",
        lambda: dict(teacher=zero_position_teacher()),
        "pos_embed is constant",
    ),
    "Mixer impulse[base=timm] with fewer hidden units than tokens": (
        lambda: MlpMixer(img_size=32, patch_size=4, num_blocks=2, embed_dim=64, mlp_ratio=(0.5, 4.0)),
        "impulse[base=timm]",
        dict,
        "32 hidden units for 64 tokens",
    ),
    # refusals that came first already
    "select without a teacher": (vit, "select", dict, "select needs a teacher"),
    "select from a teacher of another family": (
        vit,
        "select",
        lambda: dict(teacher=POST_NORM["eva-post-norm"]()),
        "the teacher has no",
    ),
    "impulse[base=timm,kernel_size=9] on an 8 x 8 grid": (
        vit,
        "impulse[base=timm,kernel_size=9,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic]",
        dict,
        "does not fit",
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_init_leaves_the_model_as_it_was(case):
    """Seven and more refusals changed the model before raising (impulse[base=kaiming] on a ViT without
    a position embedding redrew every weight, then refused; a teacher's tensors were copied up to the
    one that did not fit): every check now comes before the first write."""
    make, label, options, refusal = REFUSALS[case]
    torch.manual_seed(0)
    model = make()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    with pytest.raises(ValueError, match=refusal):
        structinit.initialize(model, label, seed=0, **options())
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert [name for name in before if not torch.equal(before[name], after[name])] == []


# --- a refusal names the block it refuses ------------------------------------------------------------


@pytest.mark.parametrize("name, block", [("vit_dpwee_patch16_reg1_gap_256", "DiffParallelScalingBlock")])
def test_a_parallel_block_is_refused_by_its_name(name, block, capsys):
    """A parallel block whose attention structinit does not read (the differential one; ParallelThingsBlock
    and ParallelScalingBlock are supported: tests/test_rope_families.py) has no `attn` module: the refusal
    said "uses NoneType"; it names the block's class, in Python and in one line on the command line."""
    from structinit.cli import main

    model = timm.create_model(name, img_size=32, patch_size=4, depth=2)
    with pytest.raises(TypeError, match=rf"block 0 of this VisionTransformer \({block}\) has no `attn` module"):
        structinit.initialize(model, SHARP, seed=0)
    assert main(["init", name, "--model-kwargs", "img_size=32,patch_size=4,depth=2", "--init", "mimetic"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"({block}) has no `attn` module" in err and "NoneType" not in err, err


# --- a frozen model gets the init of an unfrozen one ---------------------------------------------------


FROZEN = {
    "timm ViT": vit,
    "torchvision ViT": lambda: VisionTransformer(
        image_size=32, patch_size=4, num_layers=2, num_heads=3, hidden_dim=192, mlp_dim=384, num_classes=10
    ),
    "the sin-cos preset": lambda: create_model(
        "vit_d6_p4_gap_sincos", num_classes=10, in_chans=3, data_size=32, depth=2
    ),
}


@pytest.mark.parametrize("family", FROZEN)
@pytest.mark.parametrize(
    "init",
    [SHARP, "impulse[base=kaiming,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic]", "qk-norm[pos_scale=18.0]"],
)
def test_a_frozen_model_gets_the_init_of_an_unfrozen_one(family, init):
    """With model.requires_grad_(False) the init took the learned position embedding for a fixed table
    (not redrawn from the seed, not rescaled): other weights, the same report. Learned or fixed is now
    what the table is (a Parameter, or a buffer / the sin-cos table), so the weights are bit-identical;
    the preset's sin-cos table stays as it is either way, and the frozen model stays frozen."""
    models = []
    for freeze in (False, True):
        torch.manual_seed(0)
        model = FROZEN[family]()
        if freeze:
            model.requires_grad_(False)
        structinit.initialize(model, init, seed=0)
        models.append(model)
    unfrozen, frozen = (model.state_dict() for model in models)
    assert [name for name in unfrozen if not torch.equal(unfrozen[name], frozen[name])] == []
    assert not any(p.requires_grad for p in models[1].parameters())
    if family == "the sin-cos preset":
        assert torch.equal(frozen["pos_embed"][0], build_sincos2d_pos_embed((8, 8), 192))


def test_the_authors_solver_on_fewer_grid_tokens_than_head_dimensions_writes_its_impulses():
    """A 32x16 image in patches of 4 is 32 grid tokens for heads of 64 dimensions: M's rank is at most
    32, and its other factors are zero (the solve used to stop at a shape error, after it had drawn
    the position embedding)."""
    model = timm.create_model("vit_tiny_patch16_224", num_classes=10, img_size=(32, 16), patch_size=4, depth=2)
    report = structinit.initialize(model, "impulse-neurips", seed=0)
    q, k = model.blocks[0].attn.qkv.weight[:192], model.blocks[0].attn.qkv.weight[192:384]
    assert (q.view(3, 64, 192)[:, 32:] == 0).all() and (k.view(3, 64, 192)[:, 32:] == 0).all()
    assert report.mean_fidelity > 0.9
    assert structinit.fidelity(model).mean_fidelity == pytest.approx(report.mean_fidelity)
