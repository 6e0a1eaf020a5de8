"""The relative-position families (timm vit_relpos/srelpos, BEiT, Swin v2, swinv2_cr, torchvision's and Hugging
Face's Swin, Hugging Face's BEiT): the impulse init puts each head's offset into the bias, and the maps the model
itself computes (a hook on its own softmax) peak there with the reported fidelity; the same seed gives the same
bits in another process; and, for every family structinit supports, a refused init leaves every tensor as it was."""

import hashlib
import importlib.util
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import timm
import torch
from torchvision.models import swin_transformer as tv_swin

import structinit
from conftest import small_vit
from structinit.offsets import offset_mass, target_indices
from test_convmixer import convmixer
from test_families import small_eva, small_mixer, small_swin, small_torchvision_vit

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
VIT = dict(img_size=32, patch_size=4, embed_dim=96, depth=2, num_heads=3, num_classes=10)
SWIN = dict(img_size=32, patch_size=2, window_size=4, embed_dim=48, depths=(2, 2), num_heads=(3, 6), num_classes=10)
TV_SWIN = dict(patch_size=[2, 2], embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=[4, 4], num_classes=10)
DROPOUT_WARNING = "impulse init: this model's position MLP drops 12.5% of its hidden units in training"
pytestmark = pytest.mark.filterwarnings("ignore:.*position MLP drops")  # the warning has a test of its own


def hf(kind: str, **config):
    """A small Hugging Face model with random weights and eager attention (its softmax a call to F.softmax)."""
    import transformers

    family = kind.removesuffix("ForImageClassification").removesuffix("Model")
    settings = getattr(transformers, f"{family}Config")(image_size=32, num_labels=10, **config)
    settings._attn_implementation = "eager"
    return getattr(transformers, kind)(settings)


HF_BEIT = dict(patch_size=4, hidden_size=96, num_hidden_layers=2, num_attention_heads=3, intermediate_size=192)
BUILDERS = {
    "vit_relpos (bias MLP, log coordinates)": lambda: timm.create_model("vit_relpos_small_patch16_224", **VIT),
    "vit_relpos (bias MLP, 16 sigmoid)": lambda: timm.create_model(
        "vit_relpos_small_patch16_224", **VIT, rel_pos_type="mlp_swin"
    ),
    "vit_relpos (bias table)": lambda: timm.create_model("vit_relpos_small_patch16_224", **VIT, rel_pos_type="bias"),
    "vit_relpos (class token)": lambda: timm.create_model("vit_relpos_medium_patch16_cls_224", **VIT),
    "vit_srelpos (one shared bias)": lambda: timm.create_model("vit_srelpos_small_patch16_224", **VIT),
    "beit": lambda: timm.create_model("beit_base_patch16_224", **VIT),
    "swinv2": lambda: timm.create_model("swinv2_tiny_window8_256", **SWIN),
    "swinv2_cr": lambda: timm.create_model("swinv2_cr_tiny_ns_224", **SWIN),
    "torchvision swin_t": lambda: tv_swin.SwinTransformer(**TV_SWIN),
    "torchvision swin_v2_t": lambda: tv_swin.SwinTransformer(
        **TV_SWIN, block=tv_swin.SwinTransformerBlockV2, downsample_layer=tv_swin.PatchMergingV2
    ),
}
if HAS_TRANSFORMERS:
    BUILDERS |= {
        "HF BeitForImageClassification": lambda: hf(
            "BeitForImageClassification", **HF_BEIT, use_relative_position_bias=True
        ),
        "HF BeitModel (shared bias)": lambda: hf("BeitModel", **HF_BEIT, use_shared_relative_position_bias=True),
        "HF SwinForImageClassification": lambda: hf(
            "SwinForImageClassification", patch_size=2, embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=4
        ),
    }


def build(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return BUILDERS[name]()


def own_maps(model: torch.nn.Module, image: torch.Tensor, monkeypatch) -> list[torch.Tensor]:
    """Each attention layer's softmax maps (B, heads, T, T) as the model computes them on `image` (eval mode), in
    forward order: a hook after timm's softmax (fused attention off), or the calls of torchvision and Hugging Face's
    eager attention to F.softmax recorded."""
    model.eval()
    maps, hooked = [], False
    for module in model.modules():
        if hasattr(module, "attn_drop") and hasattr(module, "qkv"):  # timm: softmax, then attn_drop
            module.fused_attn = False
            module.attn_drop.register_forward_hook(lambda m, args, out: maps.append(out))
            hooked = True
    if not hooked:  # no timm attention: record F.softmax (timm's nn.Softmax calls it too, hence not for timm)
        softmax = torch.nn.functional.softmax
        monkeypatch.setattr(
            torch.nn.functional, "softmax", lambda x, *a, **k: maps.append(softmax(x, *a, **k)) or maps[-1]
        )
    with torch.no_grad():
        model(image)
    return maps


@pytest.mark.parametrize("name", BUILDERS)
def test_every_head_of_the_model_s_own_maps_peaks_at_its_reported_offset_with_the_reported_mass(name, monkeypatch):
    model = build(name)
    report = structinit.initialize(model, "impulse", seed=0)
    assert report.measured_on == "uniform image"
    maps = own_maps(model, torch.zeros(1, 3, 32, 32), monkeypatch)
    assert len(maps) == len(report.layers) >= 2
    for layer, attn in zip(report.layers, maps):
        attn = attn[:1].float()  # the first window (never masked by the shifted windows) or the whole grid
        tokens = attn.shape[-1]
        prefix = 0 if math.isqrt(tokens) ** 2 == tokens else 1
        side = math.isqrt(tokens - prefix)
        offsets = [head.offset for head in layer.heads]
        target, valid = target_indices(offsets, (side, side))
        argmax = attn[0, :, prefix:].argmax(-1) - prefix
        assert torch.equal(argmax[valid], target[valid]), (layer.index, offsets)
        mass = offset_mass(attn, offsets, (side, side), prefix)
        assert mass.tolist() == pytest.approx([head.fidelity for head in layer.heads], abs=1e-4)
        assert mass.min() > 0.979


def test_a_shared_bias_gives_every_layer_the_same_offsets():
    report = structinit.initialize(build("vit_srelpos (one shared bias)"), "impulse", seed=0)
    assert [head.offset for head in report.layers[0].heads] == [head.offset for head in report.layers[1].heads]


@pytest.mark.parametrize("name", ["swinv2", "torchvision swin_v2_t", "vit_relpos (bias MLP, log coordinates)"])
def test_the_bias_mlp_is_two_valued_per_head_exactly_up_to_float32(name):
    from structinit.adapters.relpos_base import BiasMlp
    from structinit.inits.registry import family_of

    model = build(name).eval()
    structinit.initialize(model, "impulse", seed=1, target_fidelity=0.9)
    for layer in family_of(model)[1].layers():
        assert isinstance(layer.source, BiasMlp)
        with torch.no_grad():
            bias = layer.relative_bias()[:, layer.num_prefix :, layer.num_prefix :]
        for head in bias:
            low, high = head.min(), head.max()
            assert high - low > 1.0
            assert torch.all(((head - low).abs() < 1e-4) | ((head - high).abs() < 1e-4))


@pytest.mark.parametrize("name", ["vit_relpos (bias MLP, log coordinates)", "swinv2_cr", "swinv2"])
def test_a_position_mlp_that_drops_units_in_training_is_named_in_a_warning(name):
    model = build(name)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        structinit.initialize(model, "impulse", seed=0)
    said = [str(w.message) for w in caught if str(w.message).startswith(DROPOUT_WARNING)]
    assert len(said) == (0 if name == "swinv2" else 1)
    assert not said or "set that dropout to 0 or use a bias table (vit_relpos: rel_pos_type='bias')" in said[0]


@pytest.mark.parametrize("name", ["swin", "swinv2"])
def test_a_last_stage_of_one_token_takes_kernel_1_and_refuses_kernel_3_untouched(name):
    """At 32 px with patch 4 the fourth stage is 1 x 1: its window holds one key (every map is the impulse at
    (0, 0)), which once made the bias log(0) after the first stages were written."""
    small = dict(img_size=32, patch_size=4, window_size=4, embed_dim=24, depths=(1, 1, 1, 1), num_heads=(3,) * 4)
    model = timm.create_model(
        {"swin": "swin_tiny_patch4_window7_224", "swinv2": "swinv2_tiny_window8_256"}[name], **small
    )
    refused_without_a_change(model, "impulse", {"kernel_size": 3}, r"does not fit the 1x1 token grid")
    report = structinit.initialize(model, "impulse", kernel_size=1, seed=0)
    assert [round(layer.heads[0].fidelity, 3) for layer in report.layers] == [0.98, 0.98, 0.98, 1.0]


def digests(names: list[str]) -> dict[str, str]:
    """sha256 of each family's state dict after the impulse init with seed 0."""
    result = {}
    for name in names:
        model = build(name)
        structinit.initialize(model, "impulse", seed=0)
        state = model.state_dict()
        result[name] = hashlib.sha256(
            b"".join(state[k].contiguous().numpy().tobytes() for k in sorted(state))
        ).hexdigest()
    return result


def test_the_same_seed_gives_the_same_bits_in_another_process():
    names = list(BUILDERS)
    script = (
        "import sys, json; sys.path.insert(0, 'tests'); import torch; torch.set_num_threads(1);"
        f"from test_relpos_families import digests; print(json.dumps(digests({names!r})))"
    )
    root = Path(__file__).resolve().parents[1]
    other = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    here = digests(names)  # meanwhile, here
    out, _ = other.communicate(timeout=600)
    assert other.returncode == 0
    assert json.loads(out.strip().splitlines()[-1]) == here


# --- a refusal changes nothing, for every family -------------------------------------------------


def small_hf_vit():
    return hf("ViTForImageClassification", patch_size=4, hidden_size=96, num_hidden_layers=2, num_attention_heads=3)


EVERY_FAMILY = {
    "timm ViT": small_vit,
    "timm Eva": small_eva,
    "torchvision ViT": small_torchvision_vit,
    "timm Swin v1": small_swin,
    "timm MlpMixer": small_mixer,
    "timm ConvMixer": convmixer,
    **({"HF ViT": small_hf_vit} if HAS_TRANSFORMERS else {}),
    **BUILDERS,
}
# (method, options, the refusal's message); ConvMixer's filters have their own kernel and options
REFUSALS = {
    "an even kernel": ("impulse", {"kernel_size": 4, "base": "timm"}, r"kernel_size must be odd|does not match this"),
    "a kernel larger than the grid": ("impulse", {"kernel_size": 99}, r"does not fit the|does not match this"),
    "another family's options": ("impulse", {"solver": "refine", "unit_bias": 3.0}, r"unknown option\(s\)"),
    "an option's bad value": (
        "impulse",
        {"target_fidelity": 1.5},
        r"target_fidelity must be in \(0, 1\)|unknown option\(s\) target_fidelity",
    ),
    "an init the family does not take": ("select", {"base": "kaiming"}, r"unknown init method 'select'|select"),
    "a factor that would overflow float32": (
        "impulse",
        {"vproj_alpha": 1e300},
        r"vproj_alpha must be in \[-1e\+06, 1e\+06\] \(larger ones overflow|unknown option\(s\) vproj_alpha",
    ),
}
OVERFLOW = r"must be in .*1e\+06\] (or None )?\((it keeps .*; )?larger ones overflow float32 weights\)"
OTHER_REFUSALS = {  # (model, method, options, message): models of a supported class, or options, refused
    "Eva with RoPE, post-norm": (
        lambda: small_eva(use_rot_pos_emb=True, use_post_norm=True),
        "impulse",
        {},
        r"is post-norm: the rotary impulse init reads the LayerNorm in front of RoPE",
    ),
    "BEiT without a relative-position bias": (
        lambda: timm.create_model("beit_base_patch16_224", **VIT, use_rel_pos_bias=False),
        "impulse",
        {},
        r"puts the impulse in a BEiT's relative-position bias",
    ),
    "qk-norm on a ViT that normalises q and k": (lambda: small_vit(qk_norm=True), "qk-norm", {}, r"use norm=None"),
    "a Mixer with fewer hidden units than tokens": (
        lambda: small_mixer(mlp_ratio=(32 / 192, 4.0)),
        "impulse",
        {},
        r"32 hidden units for 64 tokens",
    ),
    "mimetic's qk_alpha beyond float32": (small_vit, "mimetic", {"qk_alpha": 1e300}, OVERFLOW),
    "qk-norm's norm beyond float32": (small_vit, "qk-norm", {"norm": 1e300}, OVERFLOW),
    "Mixer's unit_bias beyond float32": (small_mixer, "impulse", {"unit_bias": 1e300}, OVERFLOW),
}


def refused_without_a_change(model: torch.nn.Module, method: str, options: dict, message: str) -> None:
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with pytest.raises((ValueError, TypeError), match=message):
        structinit.initialize(model, method, seed=0, **options)
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert [name for name in before if not torch.equal(before[name], after[name])] == []


@pytest.mark.parametrize("refusal", REFUSALS)
@pytest.mark.parametrize("family", EVERY_FAMILY)
def test_a_refused_init_leaves_every_tensor_as_it_was(family, refusal):
    method, options, message = REFUSALS[refusal]
    torch.manual_seed(0)
    refused_without_a_change(EVERY_FAMILY[family](), method, options, message)


@pytest.mark.parametrize("case", OTHER_REFUSALS)
def test_a_refused_model_or_option_leaves_every_tensor_as_it_was(case):
    make, method, options, message = OTHER_REFUSALS[case]
    refused_without_a_change(make(), method, options, message)


def test_a_fidelity_the_16_sigmoid_cannot_reach_is_refused_by_name_before_any_write():
    message = r"target_fidelity must be below 0\.99999\d+ for layer 0: its bias is 16 sigmoid"
    refused_without_a_change(build("swinv2"), "impulse", {"target_fidelity": 0.9999999, "base": "timm"}, message)
    refused_without_a_change(build("torchvision swin_v2_t"), "impulse", {"target_fidelity": 0.9999999}, "below")
