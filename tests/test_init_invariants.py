"""Every init on every family it takes, generated from the registry (inits/registry.py): what the report says it
set (`Report.set_tensors`) is what changed, from a start whose every parameter was moved off the model's own init
(so that a value written equal to a fresh model's, a zero bias, a unit gain, still shows), nothing else moved, the
same seed gives the same bits, and the init's defining property holds; an init a family does not take is refused
before any write. A new init or family is covered the day it lands: a test below fails until it has a tiny model
here and a property in PROPERTIES."""

from __future__ import annotations

import copy
import functools
import importlib.util
import math
from dataclasses import dataclass, fields
from typing import Any

import pytest
import timm
import torch
import torchvision
from timm.models.convmixer import ConvMixer
from timm.models.mlp_mixer import MlpMixer
from torch import nn
from torchvision.models import swin_transformer as tv_swin

import structinit
from structinit.adapters import ADAPTERS, OTHER_FAMILIES
from structinit.adapters.convmixer import ConvMixerAdapter, get_conv_adapter
from structinit.adapters.hf_vit import HFViTAdapter
from structinit.adapters.relpos import HFBeitAdapter
from structinit.adapters.swin_v2 import HFSwinAdapter, TimmSwinV2CrAdapter
from structinit.inits.names import FILTER_METHODS
from structinit.inits.options import MimeticOptions, QKNormOptions
from structinit.inits.registry import FAMILIES, VIT_FAMILY, family_of
from structinit.inits.rivals import MimeticVOOptions
from structinit.models import create_model
from structinit.report import Report

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None
HF_ADAPTERS = {HFViTAdapter, HFBeitAdapter, HFSwinAdapter}
SEED = 3
TINY = dict(img_size=16, patch_size=4, num_classes=5)  # a 4 x 4 token grid
pytestmark = pytest.mark.filterwarnings("ignore:.*position MLP drops")  # vit_relpos's and swinv2_cr's: warned apart


def hf(kind: str, **config) -> nn.Module:
    """A tiny Hugging Face model (random weights) of class `kind`."""
    import transformers

    family = kind.removesuffix("ForImageClassification")
    return getattr(transformers, kind)(getattr(transformers, f"{family}Config")(image_size=16, num_labels=5, **config))


def hf_vit_sizes(width: int, heads: int, depth: int) -> dict[str, int]:
    return dict(hidden_size=width, num_attention_heads=heads, num_hidden_layers=depth, intermediate_size=2 * width)


def swin_sizes(width: int, heads: int, depth: int, sequence: type = tuple) -> dict[str, Any]:
    """A Swin of `depth` stages of one block each, `width` channels at the last (half at the first)."""
    return dict(embed_dim=width // 2, depths=sequence([1] * depth), num_heads=sequence([heads] * depth))


# one tiny member of every family, by (width, heads, depth): a plain ViT's builds `select`'s teacher too
MODELS = {
    "timm ViT": lambda w, h, d: timm.create_model("vit_tiny_patch16_224", embed_dim=w, num_heads=h, depth=d, **TINY),
    "timm DeiT, distilled": lambda w, h, d: timm.create_model(
        "deit_tiny_distilled_patch16_224", embed_dim=w, num_heads=h, depth=d, **TINY
    ),
    "timm Eva": lambda w, h, d: timm.create_model(
        "eva02_tiny_patch14_224", embed_dim=w, num_heads=h, depth=d, use_rot_pos_emb=False, **TINY
    ),
    "torchvision ViT": lambda w, h, d: torchvision.models.VisionTransformer(16, 4, d, h, w, 2 * w, num_classes=5),
    "Hugging Face ViT": lambda w, h, d: hf("ViTForImageClassification", patch_size=4, **hf_vit_sizes(w, h, d)),
    "timm RoPE ViT": lambda w, h, d: timm.create_model(
        "vit_small_patch16_rope_224", embed_dim=w, num_heads=h, depth=d, **TINY
    ),
    "timm CaiT": lambda w, h, d: timm.create_model("cait_xxs24_224", embed_dim=w, num_heads=h, depth=d, **TINY),
    "timm Swin": lambda w, h, d: timm.create_model(
        "swin_tiny_patch4_window7_224", img_size=16, patch_size=2, window_size=4, num_classes=5, **swin_sizes(w, h, d)
    ),
    "timm BEiT": lambda w, h, d: timm.create_model("beit_base_patch16_224", embed_dim=w, num_heads=h, depth=d, **TINY),
    "timm vit_relpos": lambda w, h, d: timm.create_model(
        "vit_relpos_small_patch16_224", embed_dim=w, num_heads=h, depth=d, **TINY
    ),
    "timm Swin v2": lambda w, h, d: timm.create_model(
        "swinv2_tiny_window8_256", img_size=16, patch_size=2, window_size=4, num_classes=5, **swin_sizes(w, h, d)
    ),
    "timm Swin v2 cr": lambda w, h, d: timm.create_model(
        "swinv2_cr_tiny_ns_224", img_size=16, patch_size=2, window_size=4, num_classes=5, **swin_sizes(w, h, d)
    ),
    "torchvision Swin": lambda w, h, d: tv_swin.SwinTransformer(
        patch_size=[2, 2], embed_dim=w // 2, depths=[1] * d, num_heads=[h] * d, window_size=[4, 4], num_classes=5
    ),
    "Hugging Face BEiT": lambda w, h, d: hf(
        "BeitForImageClassification", patch_size=4, use_relative_position_bias=True, **hf_vit_sizes(w, h, d)
    ),
    "Hugging Face Swin": lambda w, h, d: hf(
        "SwinForImageClassification", patch_size=2, window_size=4, **swin_sizes(w, h, d, list)
    ),
    "timm MLP-Mixer": lambda w, h, d: MlpMixer(num_blocks=d, embed_dim=w, **TINY),
    "timm ConvMixer": lambda w, h, d: ConvMixer(dim=w // 2, depth=d, kernel_size=3, patch_size=4, num_classes=5),
}
STUDENT, TEACHER = (32, 2, 2), (64, 4, 3)
METHOD_NAMES = sorted({name for family in (VIT_FAMILY, *FAMILIES) for name in family.methods} | set(FILTER_METHODS))


def needs_transformers(name: str) -> bool:
    return name.startswith("Hugging Face")


@functools.cache
def built(name: str, sizes: tuple[int, int, int] = STUDENT) -> nn.Module:
    """The family's tiny model, every floating-point parameter moved by N(0, 0.05^2) off its own init."""
    if needs_transformers(name) and not HAS_TRANSFORMERS:
        pytest.skip("transformers is not installed")
    torch.manual_seed(0)
    model = MODELS[name](*sizes)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point():
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
    return model


def adapter_of(model: nn.Module) -> Any:
    conv = get_conv_adapter(model)
    return conv if conv is not None else family_of(model)[1]


def methods_of(model: nn.Module) -> tuple[str, ...]:
    """The inits the registry says the model's family takes."""
    return FILTER_METHODS if get_conv_adapter(model) is not None else tuple(family_of(model)[0].methods)


def options_for(name: str, method: str) -> dict[str, Any]:
    """select's teacher (the family's larger model); impulse a target where its default is the paper's solve of
    the sharpness, seconds a shape (tests/test_sharpness.py has that)."""
    if method == "select":
        return {"teacher": built(name, TEACHER)}
    model = built(name)
    if method == "impulse" and get_conv_adapter(model) is None:
        defaults = {f.name: f.default for f in fields(family_of(model)[0].methods["impulse"].options)}
        if "target_fidelity" in defaults and defaults["target_fidelity"] is None:
            return {"target_fidelity": 0.9}
    return {}


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


@dataclass
class Initialised:
    """A model after its init, with what the property checks read."""

    model: nn.Module
    adapter: Any
    report: Report
    before: dict[str, torch.Tensor]
    options: dict[str, Any]


# --- the invariants ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", METHOD_NAMES)
@pytest.mark.parametrize("name", MODELS)
def test_an_init_changes_what_its_report_says_repeats_bit_for_bit_and_holds_its_property(name, method):
    model = copy.deepcopy(built(name))
    before = state(model)
    if method not in methods_of(model):
        with pytest.raises(ValueError, match=f"{method}|unknown init method"):
            structinit.initialize(model, method, seed=SEED)
        assert all(torch.equal(tensor, before[key]) for key, tensor in model.state_dict().items())
        return
    options = options_for(name, method)
    twin = copy.deepcopy(model)
    report = structinit.initialize(model, method, seed=SEED, **options)
    after = state(model)
    changed = {key for key in before if not torch.equal(before[key], after[key])}
    listed = set(report.set_tensors)
    assert listed == changed, {
        "listed, unchanged": sorted(listed - changed),
        "changed, unlisted": sorted(changed - listed),
    }
    structinit.initialize(twin, method, seed=SEED, **options)
    assert all(torch.equal(tensor, after[key]) for key, tensor in twin.state_dict().items()), "the same seed differs"
    PROPERTIES[method](Initialised(model, adapter_of(model), report, before, options))


@pytest.mark.parametrize("method", sorted(set(VIT_FAMILY.methods) - {"select"}))  # select copies the teacher's
def test_a_fixed_position_table_is_the_architectures_neither_written_nor_listed(method):
    """A sin-cos table is part of the model, as its grid is: every init keeps it, and no report lists it (timm's
    init drew into it and the table was copied back, so the report would have said it was set)."""
    sizes = dict(depth=1, embed_dim=32, num_heads=2)
    model = create_model("vit_d6_p4_gap_sincos", num_classes=5, in_chans=3, data_size=32, **sizes)
    table = model.pos_embed.detach().clone()
    report = structinit.initialize(
        model, method, seed=SEED, **({"target_fidelity": 0.9} if method == "impulse" else {})
    )
    assert torch.equal(model.pos_embed, table) and "pos_embed" not in report.set_tensors


def test_a_model_built_under_inference_mode_is_refused_by_name_before_any_write():
    """Its inference tensors keep no version counter (what set_tensors reads) and take no write outside that
    mode: one line that says so, where torch's own error named neither the tensor nor the way out."""
    with torch.inference_mode():
        model = MODELS["timm ViT"](*STUDENT)
    with pytest.raises(RuntimeError, match=r"the model's cls_token is an inference tensor .* build the model outside"):
        structinit.initialize(model, "timm", seed=SEED)


def test_every_family_in_the_registry_has_a_model_here():
    """A family added to the adapters without a model above would go unchecked."""
    names = [name for name in MODELS if HAS_TRANSFORMERS or not needs_transformers(name)]
    covered = {type(adapter_of(built(name))) for name in names}
    expected = ({*ADAPTERS, *OTHER_FAMILIES}) - (set() if HAS_TRANSFORMERS else HF_ADAPTERS)
    assert not expected - covered, f"no tiny model here for {sorted(a.__name__ for a in expected - covered)}"


def test_every_init_in_the_registry_has_its_property_here():
    assert not set(METHOD_NAMES) - set(PROPERTIES), "add the property of each new init to PROPERTIES"


# --- each init's defining property ---------------------------------------------------------------------------


def timm_property(case: Initialised) -> None:
    """timm's init, the model's own: a ViT's Q/K trunc-normal(0.02), swinv2_cr's uniform over q, k and v apart,
    and PyTorch's default draw where the model's weight_init_mode is 'reset' (timm >= 1.0.2x's vit_relpos and
    swinv2_cr); Mixer's token MLPs xavier-uniform."""
    if hasattr(case.adapter, "token_mlps"):
        for mlp in case.adapter.token_mlps():
            for fc in (mlp.fc1, mlp.fc2):
                assert_uniform(fc.weight, math.sqrt(6 / sum(fc.weight.shape)))
        return
    for layer in case.adapter.layers():
        qk = torch.cat(layer.qk_weights()).detach()
        if getattr(case.model, "weight_init_mode", "") == "reset":
            assert_uniform(qk, qk.shape[1] ** -0.5)
        elif isinstance(case.adapter, TimmSwinV2CrAdapter):
            assert_uniform(qk, math.sqrt(6 / (2 * qk.shape[1])))
        else:
            assert qk.std().item() == pytest.approx(0.02, rel=0.2)


def kaiming_property(case: Initialised) -> None:
    """PyTorch's defaults: Linear and Conv weights and biases U(+-1/sqrt(fan_in)) (kaiming_uniform, a=sqrt(5));
    nn.MultiheadAttention's in_proj xavier-uniform and both its biases 0 (its own reset); LayerNorm 1 and 0."""
    for module in case.model.modules():
        if isinstance(module, nn.MultiheadAttention):
            assert_uniform(module.in_proj_weight, math.sqrt(6 / sum(module.in_proj_weight.shape)))
            assert not module.in_proj_bias.any() and not module.out_proj.bias.any()
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            bound = module.weight[0].numel() ** -0.5
            assert_uniform(module.weight, bound)
            assert module.bias is None or module.bias.abs().max() <= bound
        elif isinstance(module, nn.LayerNorm) and module.elementwise_affine:
            assert torch.equal(module.weight, torch.ones_like(module.weight))


def assert_uniform(weight: torch.Tensor, bound: float) -> None:
    """`weight` within +-bound, spread as U(-bound, bound) is (std bound / sqrt(3)) where it has the entries to say."""
    weight = weight.detach()
    assert weight.abs().max() <= bound * (1 + 1e-6)
    if weight.numel() >= 256:
        assert weight.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.2)


def heads_of(weight: torch.Tensor, layer: Any) -> torch.Tensor:
    """(heads, head_dim, D) of a layer's (heads * head_dim, D) query or key weight."""
    return weight.detach().double().reshape(layer.num_heads, layer.head_dim, -1)


def mimetic_property(case: Initialised) -> None:
    """Every head's W_q^T W_k mostly alpha Z + beta I's identity part: its trace over 0.7 of beta d (the
    trace of beta I's best rank-d part); the value path W_v^T W_proj^T's trace under 0.7 of -beta D."""
    defaults = MimeticOptions()
    for layer in case.adapter.layers():
        q, k = (heads_of(w, layer) for w in layer.qk_weights())
        traces = torch.diagonal(q.transpose(1, 2) @ k, dim1=1, dim2=2).sum(-1)
        assert (traces > 0.7 * defaults.qk_beta * layer.head_dim).all(), traces
        wv, wproj = (w.detach().double() for w in layer.value_weights())
        assert torch.trace(wv.T @ wproj.T) < -0.7 * defaults.vproj_beta * min(wv.shape)


def impulse_property(case: Initialised) -> None:
    """Each head (token mixer) measured anew on the written model peaks on the offset its report assigns, with
    the mass its report says, at its target (Mixer's: 1); ConvMixer's filters are one-hot there."""
    if isinstance(case.adapter, ConvMixerAdapter):
        for conv, layer in zip(case.adapter.depthwise(), case.report.layers, strict=True):
            taps = conv.weight.detach().flatten(1)
            centre = conv.kernel_size[0] // 2
            for tap, head in zip(taps, layer.heads, strict=True):
                index = (centre + head.offset[0]) * conv.kernel_size[0] + centre + head.offset[1]
                assert tap[index] == 1 and tap.count_nonzero() == 1
        return
    target = case.report.options.get("target_fidelity", 1.0)
    with torch.no_grad():
        measured = case.adapter.measured_layers(3)
    for reported, found in zip(case.report.layers, measured, strict=True):
        for head, seen in zip(reported.heads, found.heads, strict=True):
            assert seen.offset == head.offset and seen.fidelity == pytest.approx(head.fidelity, abs=1e-4), seen
            assert seen.fidelity > target - 0.01, (reported.index, seen)


def qk_norm_property(case: Initialised) -> None:
    """Every head's W_q and W_k at Frobenius norm `norm` (7)."""
    for layer in case.adapter.layers():
        for weight in layer.qk_weights():
            norms = torch.linalg.vector_norm(heads_of(weight, layer), dim=(1, 2))
            assert torch.allclose(norms, torch.full_like(norms, QKNormOptions().norm), rtol=1e-5)


def select_property(case: Initialised) -> None:
    """Every tensor it set is the teacher's at evenly spaced indices (first-N blocks), written here anew;
    what it left is the classifier's alone."""
    teacher = case.options["teacher"].state_dict()
    for key in case.report.set_tensors:
        source = teacher[key]
        for dim, size in enumerate(case.model.state_dict()[key].shape):
            step = source.shape[dim] // size
            rows = (
                torch.arange(size) * step
                if source.shape[dim] % size == 0
                else torch.linspace(0, source.shape[dim] - 1, size).round().long()
            )
            source = source.index_select(dim, rows)
        assert torch.equal(case.model.state_dict()[key], source), key
    left = {key.rsplit(".", 1)[0] for key in set(case.before) - set(case.report.set_tensors)}
    assert left <= {"head", "head_dist", "heads.head", "classifier"}, left  # timm's, DeiT's, torchvision's, HF's


def conditioned_property(case: Initialised) -> None:
    """Every head's W_q and W_k rows orthonormal (singular values 1); W_v the identity."""
    for layer in case.adapter.layers():
        for weight in layer.qk_weights():
            singular = torch.linalg.svdvals(heads_of(weight, layer))
            assert torch.allclose(singular, torch.ones_like(singular), atol=1e-5)
        wv = layer.value_weights()[0].detach()
        assert torch.equal(wv, torch.eye(*wv.shape))


def sinusoidal_property(case: Initialised) -> None:
    """Every Linear, Conv and attention projection weight the source's formula (a fused qkv as three), every
    bias 0, and nothing else set: embeddings, norms and layer scales as the model made them."""
    expected = set()
    for prefix, module in case.model.named_modules():
        for name, param in module.named_parameters(prefix=prefix, recurse=False):
            if isinstance(module, (nn.Linear, nn.Conv2d, nn.MultiheadAttention)) and name.endswith("weight"):
                fused = name.endswith(("qkv.weight", "in_proj_weight"))
                matrix = param.detach().reshape(param.shape[0], -1).double()
                for part in matrix.chunk(3 if fused else 1):
                    assert torch.allclose(part, formula(*part.shape), atol=1e-6), name
            elif name.endswith("bias") and "Norm" not in type(module).__name__:
                assert not param.any(), name
            else:
                continue
            expected.add(name)
    assert set(case.report.set_tensors) == expected


def formula(rows: int, cols: int) -> torch.Tensor:
    """arXiv 2505.12909's matrix: row i sin((i + 1)(2 pi j / cols + 2 pi / rows)), at Glorot's variance."""
    i = torch.arange(1, rows + 1, dtype=torch.float64)[:, None]
    j = torch.arange(cols, dtype=torch.float64)
    raw = torch.sin(i * (2 * math.pi * j / cols + 2 * math.pi / rows))
    return raw * math.sqrt(2 / (rows + cols) / raw.var())


def mimetic_vo_property(case: Initialised) -> None:
    """The value path W_proj W_v about -beta I (beta 0.05), within its noise's products."""
    beta = MimeticVOOptions().beta
    for layer in case.adapter.layers():
        wv, wproj = (w.detach().double() for w in layer.value_weights())
        path = wproj @ wv
        assert torch.diagonal(path).mean().item() == pytest.approx(-beta, abs=0.1 * beta)
        assert (path + beta * torch.eye(*path.shape, dtype=path.dtype)).abs().max() < beta


def random_filters_property(case: Initialised) -> None:
    """ConvMixer's depthwise filters PyTorch's default draw, U(+-1/sqrt(f^2))."""
    for conv in case.adapter.depthwise():
        assert_uniform(conv.weight, conv.weight[0].numel() ** -0.5)


def box_property(case: Initialised) -> None:
    """ConvMixer's depthwise filters all 1 / f^2."""
    for conv in case.adapter.depthwise():
        assert torch.equal(conv.weight, torch.full_like(conv.weight, 1 / conv.weight[0].numel()))


PROPERTIES = {
    "timm": timm_property,
    "kaiming": kaiming_property,
    "mimetic": mimetic_property,
    "impulse": impulse_property,
    "qk-norm": qk_norm_property,
    "select": select_property,
    "conditioned": conditioned_property,
    "sinusoidal": sinusoidal_property,
    "mimetic-vo": mimetic_vo_property,
    "random": random_filters_property,
    "box": box_property,
}
