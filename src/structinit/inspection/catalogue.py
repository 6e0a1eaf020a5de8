"""The families structinit initialises, read from its registry, each with the inits it takes and, built
small, the fidelity its impulse init reaches at full strength (fidelity 0.98 where it takes one): what
`structinit init --list-models` prints, and the table of docs/families.md (`--list-models --markdown`).

A family in the registry without a small example here is listed with its inits and no fidelity: an
entry in EXAMPLES (32 px, patch 4, 2 blocks where the family allows) fills it in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import timm
import torch
from torch import nn

from ..adapters import ADAPTERS
from ..adapters.cait import CaitAdapter
from ..adapters.convmixer import ConvMixerAdapter
from ..adapters.hf_vit import HFViTAdapter
from ..adapters.mixer import MixerAdapter
from ..adapters.relpos import HFBeitAdapter, TimmBeitAdapter, TimmRelPosAdapter
from ..adapters.rope import RopeEvaAdapter
from ..adapters.swin import SwinAdapter
from ..adapters.swin_v2 import HFSwinAdapter, TimmSwinV2Adapter, TimmSwinV2CrAdapter, TorchvisionSwinAdapter
from ..adapters.timm_eva import TimmEvaAdapter
from ..adapters.timm_vit import TimmViTAdapter
from ..adapters.torchvision_vit import TorchvisionViTAdapter
from ..inits.api import initialize
from ..inits.names import FILTER_METHODS
from ..inits.registry import FAMILIES, METHODS
from ..models import create_model

SMALL = dict(img_size=32, patch_size=4, depth=2, embed_dim=96, num_heads=4, num_classes=10)


def _timm(name: str, **kwargs) -> Callable[[], nn.Module]:
    return lambda: timm.create_model(name, **{**SMALL, **kwargs})


def _preset(name: str) -> Callable[[], nn.Module]:
    return lambda: create_model(name, num_classes=10, in_chans=3, data_size=32)


def _torchvision() -> nn.Module:
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=4, hidden_dim=96, mlp_dim=384)


HF_VIT = dict(patch_size=4, hidden_size=96, num_hidden_layers=2, num_attention_heads=4)


def _hf(family: str, model: str, sizes: dict = HF_VIT, **settings) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        import transformers

        config = getattr(transformers, f"{family}Config")(image_size=32, num_labels=10, **sizes, **settings)
        return getattr(transformers, f"{family}{model}")(config)

    return build


def _torchvision_swin(version: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        from torchvision.models import swin_transformer as tv

        v2 = dict(block=tv.SwinTransformerBlockV2, downsample_layer=tv.PatchMergingV2) if version == 2 else {}
        sizes = dict(patch_size=[2, 2], embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=[4, 4])
        return tv.SwinTransformer(**sizes, num_classes=10, **v2)

    return build


# windowed families: patch 2, windows of 4 x 4 tokens, two stages
WINDOWS = dict(img_size=32, patch_size=2, window_size=4, embed_dim=48, depths=(2, 2), num_heads=(3, 6), num_classes=10)
HF_SWIN = dict(patch_size=2, embed_dim=48, depths=[2, 2], num_heads=[3, 6], window_size=4)


# adapter -> {example: builder}, in the order the table lists them
EXAMPLES: dict[type, dict[str, Callable[[], nn.Module]]] = {
    TimmViTAdapter: {
        "vit_tiny_patch16_224": _timm("vit_tiny_patch16_224"),
        "deit_tiny_distilled_patch16_224": _timm("deit_tiny_distilled_patch16_224"),
        "vit_base_patch16_rpn_224 (post-norm)": _timm("vit_base_patch16_rpn_224"),
        "vit_small_patch16_18x2_224 (parallel blocks)": _timm("vit_small_patch16_18x2_224"),
        "vit_pwee_patch16_reg1_gap_256 (parallel attention and MLP)": _timm("vit_pwee_patch16_reg1_gap_256"),
    },
    TimmEvaAdapter: {
        "eva02_tiny_patch14_224, use_rot_pos_emb=False": _timm("eva02_tiny_patch14_224", use_rot_pos_emb=False)
    },
    TorchvisionViTAdapter: {"VisionTransformer": _torchvision},
    HFViTAdapter: {
        "ViTForImageClassification": _hf("ViT", "ForImageClassification"),
        "DeiTForImageClassification": _hf("DeiT", "ForImageClassification"),
        "Dinov2Model": _hf("Dinov2", "Model"),
    },
    SwinAdapter: {"swin_d6_p2_w4 (preset)": _preset("swin_d6_p2_w4")},
    MixerAdapter: {"mixer_d6_p4 (preset)": _preset("mixer_d6_p4")},
    RopeEvaAdapter: {
        "vit_small_patch16_rope_224 (axial)": _timm("vit_small_patch16_rope_224"),
        "vit_small_patch16_rope_mixed_224 (learned frequencies)": _timm("vit_small_patch16_rope_mixed_224"),
        "vit_small_patch16_rope_ape_224 (and an absolute embedding)": _timm("vit_small_patch16_rope_ape_224"),
        "eva02_tiny_patch14_224 (RoPE and an absolute embedding)": _timm("eva02_tiny_patch14_224", ref_feat_shape=8),
        "vit_small_patch16_rope_224, num_kv_heads=2 (grouped-query)": _timm(
            "vit_small_patch16_rope_224", num_kv_heads=2, qkv_fused=False
        ),
        "vit_small_patch16_dinov3 (DINOv3's RoPE)": _timm("vit_small_patch16_dinov3"),
        "vit_pe_core_tiny_patch16_384 (Perception Encoder)": _timm("vit_pe_core_tiny_patch16_384"),
    },
    CaitAdapter: {"cait_xxs24_224": _timm("cait_xxs24_224")},
    TimmRelPosAdapter: {
        "vit_relpos_small_patch16_224 (bias MLP)": _timm("vit_relpos_small_patch16_224"),
        "vit_relpos_small_patch16_224, rel_pos_type='bias'": _timm("vit_relpos_small_patch16_224", rel_pos_type="bias"),
        "vit_srelpos_small_patch16_224 (one shared bias)": _timm("vit_srelpos_small_patch16_224"),
    },
    TimmBeitAdapter: {"beit_base_patch16_224": _timm("beit_base_patch16_224")},
    HFBeitAdapter: {
        "BeitForImageClassification": _hf("Beit", "ForImageClassification", use_relative_position_bias=True)
    },
    TimmSwinV2Adapter: {
        "swinv2_tiny_window8_256 (patch 2, window 4)": lambda: timm.create_model("swinv2_tiny_window8_256", **WINDOWS)
    },
    TimmSwinV2CrAdapter: {
        "swinv2_cr_tiny_ns_224 (patch 2, window 4)": lambda: timm.create_model("swinv2_cr_tiny_ns_224", **WINDOWS)
    },
    TorchvisionSwinAdapter: {
        "swin_t (patch 2, window 4)": _torchvision_swin(1),
        "swin_v2_t (patch 2, window 4)": _torchvision_swin(2),
    },
    HFSwinAdapter: {"SwinForImageClassification (patch 2, window 4)": _hf("Swin", "ForImageClassification", HF_SWIN)},
    ConvMixerAdapter: {"convmixer_d6_p4 (preset)": _preset("convmixer_d6_p4")},
}


@dataclass(frozen=True)
class Row:
    family: str
    example: str
    inits: list[str]
    fidelity: str  # the impulse init's mean and worst, on what its report measures; or why not
    measured_on: str


def registry() -> list[tuple[type, list[str]]]:
    """Every family adapter the registry holds, with the inits its models take."""
    families = [(adapter, list(METHODS)) for adapter in ADAPTERS]
    families += [(family.adapter, list(family.methods)) for family in FAMILIES]
    return [*families, (ConvMixerAdapter, list(FILTER_METHODS))]


def rows() -> list[Row]:
    """A row per example of every family (one without examples: a row without fidelity)."""
    table = []
    for adapter, inits in registry():
        examples = EXAMPLES.get(adapter) or {adapter.example: None}
        for example, build in examples.items():
            table.append(Row(adapter.family, example, inits, *_impulse_fidelity(build)))
    return table


def _impulse_fidelity(build: Callable[[], nn.Module] | None) -> tuple[str, str]:
    if build is None:
        return "no small example (catalogue.EXAMPLES)", "-"
    torch.manual_seed(0)
    try:
        model = build()
    except ImportError as error:
        return f"not built ({error.name} is not installed)", "-"
    try:  # at full strength: the plain ViTs' `impulse` would take the paper's solve's sharpness, a minute each
        report = initialize(model, "impulse", seed=0, target_fidelity=0.98)
    except TypeError:  # MLP-Mixer's and ConvMixer's impulse have no strength to set
        report = initialize(model, "impulse", seed=0)
    return f"{report.mean_fidelity:.3f} / {report.min_fidelity:.3f}", f"{report.measured_on} (per {report.unit})"


def markdown(table: list[Row]) -> str:
    lines = [
        "| family | example (32 px, patch 4, 2 blocks) | inits | impulse fidelity at target 0.98 (mean / worst) "
        "| measured on |",
        "|---|---|---|---|---|",
    ]
    for r in table:
        cells = (r.family, r.example, ", ".join(r.inits), r.fidelity, r.measured_on)
        lines.append("| " + " | ".join(cell.replace("*", r"\*") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def text(table: list[Row]) -> str:
    lines = [
        "families (init methods; e.g.: impulse fidelity at init with target_fidelity=0.98 where it takes one, "
        "mean / worst; the plain ViTs' `impulse` takes the paper's solve's sharpness instead):"
    ]
    for family in dict.fromkeys(r.family for r in table):
        mine = [r for r in table if r.family == family]
        lines.append(f"  {family}\n      {', '.join(mine[0].inits)}")
        lines += [f"      e.g. {r.example}: {r.fidelity}" for r in mine]
    return "\n".join(lines)
