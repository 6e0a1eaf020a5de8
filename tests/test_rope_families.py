"""The ViT families added by issue 52 (rotary ViTs, Hugging Face DeiT and Dinov2, timm's parallel blocks and
CaiT): the impulse init checked on the maps each model computes in its own code path, the same seed giving
the same bits in another process, and the refusals naming the block they refuse."""

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

import structinit
from structinit.adapters import get_adapter
from structinit.cli.commands import main
from structinit.inits.registry import family_of
from structinit.offsets import target_indices

SMALL = dict(img_size=32, patch_size=4, depth=2, embed_dim=96, num_heads=4, num_classes=10)


def timm_model(name, **kwargs):
    torch.manual_seed(0)
    return timm.create_model(name, **{**SMALL, **kwargs})


def hf_model(config_class, model_class):
    transformers = pytest.importorskip("transformers")
    config = getattr(transformers, config_class)(
        image_size=32, patch_size=4, hidden_size=96, num_hidden_layers=2, num_attention_heads=4, num_labels=10
    )
    config._attn_implementation = "eager"  # so that the model returns its attention maps
    torch.manual_seed(0)
    return getattr(transformers, model_class)(config)


FAMILIES = {
    "rope axial": lambda: timm_model("vit_small_patch16_rope_224"),
    "rope mixed": lambda: timm_model("vit_small_patch16_rope_mixed_224"),
    "rope + absolute": lambda: timm_model("vit_small_patch16_rope_ape_224"),
    "rope, EvaAttention, register": lambda: timm_model("vit_base_patch16_rope_reg1_gap_256"),
    "eva02 rope": lambda: timm_model("eva02_tiny_patch14_224", ref_feat_shape=(8, 8)),
    "rope grouped-query": lambda: timm_model("vit_small_patch16_rope_224", num_kv_heads=2, qkv_fused=False),
    "rope dinov3": lambda: timm_model("vit_small_patch16_dinov3"),
    "rope perception encoder": lambda: timm_model("vit_pe_core_tiny_patch16_384"),
    "parallel scaling (pwee)": lambda: timm_model("vit_pwee_patch16_reg1_gap_256"),
    "parallel things (18x2)": lambda: timm_model("vit_small_patch16_18x2_224"),
    "cait": lambda: timm_model("cait_xxs24_224"),
    "hf deit": lambda: hf_model("DeiTConfig", "DeiTForImageClassification"),
    "hf deit model": lambda: hf_model("DeiTConfig", "DeiTModel"),
    "hf dinov2": lambda: hf_model("Dinov2Config", "Dinov2Model"),
}


def own_maps(model):
    """Every attention map (1, heads, T, T) the model computes, in its own forward, when every block reads
    the pseudo tokens (what the report measures): the patch embedding replaced by zeros and each block's
    input by the first block's; the maps as its own code passes them on (timm: to attn_drop; HF: returned)."""
    hf = type(model).__module__.startswith("transformers.")
    if hf:
        backbone = model if type(model).__name__.endswith("Model") else getattr(model, "deit", None) or model.dinov2
        blocks = backbone.layers if hasattr(backbone, "layers") else backbone.encoder.layer
        patch = backbone.embeddings.patch_embeddings
    else:
        blocks, patch = model.blocks, model.patch_embed
    first, maps, hooks = [], [], [patch.register_forward_hook(lambda m, args, out: torch.zeros_like(out))]

    def same_input(module, args, kwargs):
        tokens = kwargs.get("hidden_states", args[0] if args else None)
        if not first:
            first.append(tokens)
        elif "hidden_states" in kwargs:
            return args, {**kwargs, "hidden_states": first[0]}
        return (first[0], *args[1:]), kwargs

    hooks += [block.register_forward_pre_hook(same_input, with_kwargs=True) for block in blocks]
    for module in (m for block in blocks for m in block.modules()):
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
    drops = [m for block in blocks for name, m in block.named_modules() if name.endswith("attn_drop")]
    hooks += [drop.register_forward_hook(lambda m, args, out: maps.append(args[0].detach())) for drop in drops]
    model.eval()
    with torch.no_grad():
        zeros = torch.zeros(1, 3, 32, 32)
        out = model(pixel_values=zeros, output_attentions=True) if hf else model(zeros)
    for hook in hooks:
        hook.remove()
    return list(out.attentions) if hf else maps


@pytest.mark.parametrize("name", FAMILIES)
def test_impulse_maps_the_model_computes_peak_at_the_reported_offsets_with_the_reported_mass(name):
    model = FAMILIES[name]()
    report = structinit.initialize(model, "impulse[target_fidelity=0.98]", seed=0)
    prefix = family_of(model)[1].num_prefix_tokens
    maps = own_maps(model)
    assert len(maps) == len(report.layers)
    for layer, attn in zip(report.layers, maps):
        offsets = [head.offset for head in layer.heads]
        target, valid = target_indices(offsets, (8, 8))
        rows = attn[0, :, prefix:]  # (heads, N, T): the grid queries
        assert torch.equal(rows.argmax(-1)[valid], (target + prefix)[valid]), (name, layer.index)
        mass = rows.gather(-1, (target + prefix).unsqueeze(-1)).squeeze(-1)
        measured = (mass * valid).sum(-1) / valid.sum(-1)
        for head, fidelity in zip(layer.heads, measured):
            assert head.fidelity == pytest.approx(0.98, abs=1e-3)
            assert float(fidelity) == pytest.approx(head.fidelity, abs=1e-4), (name, layer.index)


def digest(model):
    state = model.state_dict()
    return hashlib.sha256(b"".join(state[k].detach().contiguous().numpy().tobytes() for k in sorted(state))).hexdigest()


def initialised_digests():
    """name -> sha256 of the weights each family's impulse init writes with seed 3."""
    digests = {}
    for name, build in FAMILIES.items():
        model = build()
        structinit.initialize(model, "impulse", seed=3)
        digests[name] = digest(model)
    return digests


def test_the_same_seed_gives_the_same_bits_in_another_process():
    pytest.importorskip("transformers")
    script = (
        "import sys; sys.path.insert(0, 'tests'); import torch; torch.set_num_threads(1); "
        "from test_rope_families import initialised_digests; print(repr(initialised_digests()))"
    )
    root = Path(__file__).resolve().parents[1]
    other = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    here = initialised_digests()  # meanwhile, here
    out, _ = other.communicate(timeout=600)
    assert other.returncode == 0
    assert eval(out.strip().splitlines()[-1]) == here
    other_seed = FAMILIES["rope axial"]()
    structinit.initialize(other_seed, "impulse", seed=4)
    assert digest(other_seed) != here["rope axial"]


def test_rotary_maps_hold_on_real_images(images):
    """Q reads the LayerNorm's constant and K's prefix correction avoids the patch content (49 directions,
    fewer than half the width 192): with LayerScale (the blocks barely move the stream at init) every
    layer's map on real images is the reported one."""
    model = timm_model("vit_small_patch16_rope_224", embed_dim=192, num_heads=6)
    report = structinit.initialize(model, "impulse", seed=0)
    maps = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda m, args, out: maps.append(args[0].detach()))
    model.eval()(images)
    for layer, attn in zip(report.layers, maps):
        target, valid = target_indices([head.offset for head in layer.heads], (8, 8))
        mass = attn[:, :, 1:].gather(-1, (target + 1).expand(len(images), -1, -1).unsqueeze(-1)).squeeze(-1)
        assert torch.allclose((mass * valid).sum(-1) / valid.sum(-1), torch.tensor(0.98), atol=2e-3)


def test_rotary_impulse_trains_and_the_baselines_measure_the_rotated_maps(images):
    model = FAMILIES["rope mixed"]()
    structinit.initialize(model, "impulse", seed=0)
    loss = torch.nn.functional.cross_entropy(model(images), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss) and model.rope.freqs.grad.abs().sum() > 0
    for method in ("timm", "kaiming", "mimetic"):
        report = structinit.initialize(FAMILIES["rope axial"](), method, seed=0)
        assert report.measured_on == "pseudo input, rotated" and report.max_fidelity < 0.9, method


@pytest.mark.parametrize(
    "build, method, message",
    [
        (
            lambda: timm_model("vit_small_patch16_rope_224", qk_norm=True),
            "impulse",
            "block 0 (EvaBlock) normalises q and k (qk_norm): the rotary impulse init needs them as written",
        ),
        (
            lambda: timm_model("eva02_tiny_patch14_224", use_post_norm=True),
            "impulse",
            "block 0 (EvaBlockPostNorm) is post-norm: the rotary impulse init reads the LayerNorm in front of RoPE",
        ),
        (
            FAMILIES["rope grouped-query"],
            "mimetic",
            "mimetic init sets W_q W_k^T per head, and this model's heads share keys (num_kv_heads)",
        ),
    ],
    ids=["qk-norm", "post-norm", "mimetic grouped-query"],
)
def test_rotary_refusals_name_the_reason_and_change_nothing(build, method, message):
    model = build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")):
        structinit.initialize(model, method, seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_refusals_name_the_real_block_type():
    with pytest.raises(
        TypeError, match=r"block 0 of this VisionTransformer \(DiffParallelScalingBlock\) has no `attn`"
    ):
        structinit.initialize(timm_model("vit_dpwee_patch16_reg1_gap_256"), "impulse", seed=0)
    with pytest.raises(TypeError, match=r"timm Eva with rotary position embeddings .*: `initialize` and `structinit"):
        get_adapter(FAMILIES["rope axial"]())


def test_the_families_table_is_the_one_the_code_generates(capsys):
    """docs/families.md's table and `structinit init --list-models --markdown` are generated from the
    registry: every family, its inits, the impulse init's fidelity on a small example."""
    pytest.importorskip("transformers")  # its three families' rows say "not built" without it
    assert main(["init", "--list-models", "--markdown"]) == 0
    table = capsys.readouterr().out
    docs = (Path(__file__).resolve().parents[1] / "docs" / "families.md").read_text()
    section = docs.split("<!-- families:begin -->")[1].split("<!-- families:end -->")[0]
    assert section.split("-->", 1)[1].strip() == table.strip()
    rows = [line for line in table.splitlines() if line.startswith("| timm Eva with rotary")]
    assert len(rows) == 7 and all("| timm, kaiming, mimetic, impulse | 0.980 / 0.980 |" in row for row in rows)
    for example in ("DeiTForImageClassification", "Dinov2Model", "cait_xxs24_224", "vit_small_patch16_18x2_224"):
        assert f"| {example}" in table
