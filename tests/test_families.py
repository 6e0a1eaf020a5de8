"""Swin and MLP-Mixer: the impulse init through Swin's relative-position bias and through Mixer's
token-mixing MLP; fidelity, determinism, what stays untouched, training, and the errors."""

import dataclasses

import pytest
import timm
import torch
import torchvision
from timm.models.mlp_mixer import Affine, MlpMixer, ResBlock

import structinit
from conftest import SHARP
from structinit.adapters.mixer import MixerAdapter
from structinit.adapters.swin import SwinAdapter
from structinit.models import create_model
from structinit.offsets import offset_mass, target_indices
from structinit.training import TrainConfig, train


def small_swin(**kwargs):
    """16 x 16 tokens in 4 x 4 windows, then 8 x 8 after merging; shifted windows every second block."""
    return create_model("swin_d6_p2_w4", num_classes=10, in_chans=3, data_size=32, **kwargs)


def small_mixer(**kwargs):
    return create_model("mixer_d6_p4", num_classes=10, in_chans=3, data_size=32, **kwargs)


def changed(before, model):
    return {name for name, value in model.state_dict().items() if not torch.equal(before[name], value)}


def snapshot(model):
    return {name: value.clone() for name, value in model.state_dict().items()}


# --- Swin --------------------------------------------------------------------------------------


def test_swin_impulse_heads_reach_the_target_on_their_window_offsets():
    model = small_swin()
    report = structinit.initialize(model, "impulse", seed=0, target_fidelity=0.9)
    assert report.measured_on == "window pseudo input"
    assert len(report.layers) == 6 and [len(layer.heads) for layer in report.layers] == [3, 3, 6, 6, 6, 6]
    for layer in report.layers:
        for head in layer.heads:
            assert head.fidelity == pytest.approx(0.9, abs=1e-4)
        assert len({head.offset for head in layer.heads}) == len(layer.heads)  # distinct offsets per layer


def test_swin_impulse_maps_peak_at_the_offset_on_real_windows_too(images):
    """On the windows of a forward pass (content in the tokens, Q/K at timm's scale), the bias still
    decides: the unshifted blocks' maps put most of their mass on each head's offset."""
    model = small_swin()
    report = structinit.initialize(model, "impulse", seed=1)
    adapter = SwinAdapter(model)
    layers, seen = adapter.layers(), {}
    hooks = [
        block.attn.register_forward_hook(lambda m, args, out, i=i: seen.setdefault(i, args[0]))
        for i, block in enumerate(adapter.blocks())
    ]
    model.eval()(images)
    for hook in hooks:
        hook.remove()
    for i, layer in enumerate(layers):
        if layer.shifted:  # the shifted windows' mask changes which keys exist; measured without it here
            continue
        offsets = [head.offset for head in report.layers[i].heads]
        mass = offset_mass(layer.attention(seen[i]).detach(), offsets, layer.window, 0)
        assert mass.min() > 0.9, (i, mass)


def test_swin_impulse_is_seeded_and_changes_only_the_bias_table_and_v_proj():
    first, second, other = small_swin(), small_swin(), small_swin()
    second.load_state_dict(first.state_dict())
    other.load_state_dict(first.state_dict())
    before = snapshot(first)
    structinit.initialize(first, "impulse", seed=3)
    structinit.initialize(second, "impulse", seed=3)
    structinit.initialize(other, "impulse", seed=4)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert not torch.equal(
        first.layers[1].blocks[0].attn.relative_position_bias_table,
        other.layers[1].blocks[0].attn.relative_position_bias_table,
    )
    suffixes = {name.rsplit(".", 2)[-2] + "." + name.rsplit(".", 1)[-1] for name in changed(before, first)}
    assert suffixes == {"attn.relative_position_bias_table", "qkv.weight", "proj.weight"}
    for block in SwinAdapter(first).blocks():  # Q/K rows of qkv untouched, V rows rewritten
        width = block.attn.qkv.weight.shape[1]
        name = next(n for n, m in first.named_modules() if m is block)
        old = before[f"{name}.attn.qkv.weight"]
        assert torch.equal(old[: 2 * width], block.attn.qkv.weight[: 2 * width])
        assert not torch.equal(old[2 * width :], block.attn.qkv.weight[2 * width :])


@pytest.mark.parametrize("method", ["timm", "kaiming", "mimetic"])
def test_swin_baselines_are_seeded_and_measured_near_uniform(method):
    first, second = small_swin(), small_swin()
    second.load_state_dict(first.state_dict())  # mimetic works on top of the current weights
    report = structinit.initialize(first, method, seed=5)
    structinit.initialize(second, method, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert report.max_fidelity < 0.1  # a 4 x 4 window: uniform is 1/16; position-free tokens cannot do better


def test_swin_kernel_must_fit_the_window():
    with pytest.raises(ValueError, match="does not fit the 4x4 token grid"):
        structinit.initialize(small_swin(), "impulse", kernel_size=5, seed=0)


# --- MLP-Mixer ---------------------------------------------------------------------------------


def test_mixer_token_mixing_answers_a_unit_impulse_at_its_offset_only():
    model = small_mixer()
    report = structinit.initialize(model, "impulse", seed=0)
    assert report.unit == "token mixer" and report.min_fidelity == 1.0
    adapter = MixerAdapter(model)
    for layer, mlp in zip(report.layers, adapter.token_mlps()):
        response = adapter.impulse_response(mlp)
        target, valid = target_indices([layer.heads[0].offset], adapter.grid)
        rows = torch.arange(64)[valid[0]]
        expected = torch.zeros(64, 64)
        expected[rows, target[0, valid[0]]] = 1.0
        assert torch.allclose(response, expected, atol=5e-3)  # GELU(1 + 3) - GELU(3) = 1.004


def test_mixer_token_mixing_shifts_a_normalised_feature_map():
    model = small_mixer()
    report = structinit.initialize(model, "impulse", seed=2)
    dy, dx = report.layers[0].heads[0].offset
    x = torch.randn(2, 192, 8, 8)
    out = model.blocks[0].mlp_tokens(x.flatten(2)).unflatten(2, (8, 8))
    shifted = torch.zeros_like(x)  # out[p] = x[p + offset], zero where p + offset is off the grid
    rows, cols = slice(max(0, -dy), 8 - max(0, dy)), slice(max(0, -dx), 8 - max(0, dx))
    shifted[..., rows, cols] = x[..., max(0, dy) : 8 - max(0, -dy), max(0, dx) : 8 - max(0, -dx)]
    assert torch.corrcoef(torch.stack([out.flatten(), shifted.flatten()]))[0, 1] > 0.995


def test_mixer_impulse_is_seeded_and_changes_only_the_token_mlps():
    first, second = small_mixer(), small_mixer()
    second.load_state_dict(first.state_dict())
    before = snapshot(first)
    structinit.initialize(first, "impulse", seed=7)
    structinit.initialize(second, "impulse", seed=7)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert {name.split(".", 2)[2] for name in changed(before, first)} == {
        "mlp_tokens.fc1.weight",
        "mlp_tokens.fc1.bias",
        "mlp_tokens.fc2.weight",
        "mlp_tokens.fc2.bias",
    }
    spare = first.blocks[0].mlp_tokens.fc1.weight[64:]  # hidden units beyond the 64 tokens keep their rows
    assert torch.equal(spare, before["blocks.0.mlp_tokens.fc1.weight"][64:])


def test_mixer_errors():
    with pytest.raises(ValueError, match="32 hidden units for 64 tokens"):
        structinit.initialize(small_mixer(mlp_ratio=(32 / 192, 4.0)), "impulse", seed=0)
    with pytest.raises(ValueError, match=r"unknown init method 'mimetic' for timm MlpMixer.*timm, kaiming, impulse"):
        structinit.initialize(small_mixer(), "mimetic", seed=0)
    resmlp = MlpMixer(
        img_size=32, patch_size=4, num_blocks=2, embed_dim=96, mlp_ratio=4, block_layer=ResBlock, norm_layer=Affine
    )
    with pytest.raises(TypeError, match="not ResMLP or gMLP"):
        structinit.initialize(resmlp, "impulse", seed=0)


# --- both: the trainer ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model, kwargs",
    [
        ("swin_d6_p2_w4", {"patch_size": 1, "depths": (2,), "num_heads": (3,)}),
        ("mixer_d6_p4", {"patch_size": 2, "num_blocks": 2}),
    ],
)
def test_one_epoch_trains_and_updates_the_structured_weights(tmp_path, model, kwargs):
    run = tmp_path / "run"
    config = TrainConfig(
        data="digits", per_class=10, model=model, model_kwargs=kwargs, batch_size=50, epochs=1, init="impulse"
    )
    summary = train(dataclasses.replace(config, out=str(run), quiet=True))
    assert summary["finished"] and summary["init"]["min_fidelity"] > 0.97
    assert torch.isfinite(torch.tensor(summary["train_loss"]))
    state = torch.load(run / "last.pt", map_location="cpu", weights_only=False)["model"]
    structured = [v for k, v in state.items() if k.endswith(("relative_position_bias_table", "mlp_tokens.fc2.weight"))]
    for weight in structured:  # the init writes two values (0 and the peak, or 0 and 1); training moves them
        assert len(torch.unique(weight)) > 2


# --- other ViT families: EVA, torchvision --------------------------------------------------------


def small_eva(**kwargs):
    config = dict(img_size=32, patch_size=4, depth=2, num_heads=12, embed_dim=192, num_classes=10)
    return timm.create_model("eva02_tiny_patch14_224", **{**config, "use_rot_pos_emb": False, **kwargs})


def small_torchvision_vit():
    return torchvision.models.VisionTransformer(
        image_size=32, patch_size=4, num_layers=2, num_heads=12, hidden_dim=192, mlp_dim=768, num_classes=10
    )


# the weights the impulse init writes (Q, K, V, proj, position embedding, and the class token it
# redraws from its seed); the q/k biases it zeroes are zero in these models already
VIT_FAMILIES = {
    "eva, fused qkv": (small_eva, ("attn.qkv.weight", "attn.proj.weight", "pos_embed", "cls_token")),
    "eva, separate q/k/v": (
        lambda: small_eva(qkv_fused=False),
        ("q_proj.weight", "k_proj.weight", "v_proj.weight", "attn.proj.weight", "pos_embed", "cls_token"),
    ),
    "torchvision": (small_torchvision_vit, ("in_proj_weight", "out_proj.weight", "pos_embedding", "class_token")),
}


@pytest.mark.parametrize("name", VIT_FAMILIES)
def test_vit_families_reach_the_target_deterministically_and_train(name, images):
    build, written = VIT_FAMILIES[name]
    first, second = build(), build()
    second.load_state_dict(first.state_dict())
    before = snapshot(first)
    report = structinit.initialize(first, SHARP, seed=0)
    structinit.initialize(second, SHARP, seed=0)
    assert report.min_fidelity > 0.97, str(report)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), second.state_dict().values()))
    assert changed(before, first) == {n for n in before if n.endswith(written)}
    loss = torch.nn.functional.cross_entropy(first(images), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in first.parameters() if p.requires_grad)


def test_torchvision_attention_maps_are_those_of_its_multihead_attention(images):
    model = small_torchvision_vit()
    structinit.initialize(model, SHARP, seed=0)
    from structinit.adapters import get_adapter

    adapter = get_adapter(model)
    layer = adapter.layers()[0]
    x = layer.norm(adapter.embed(images))
    _, expected = model.encoder.layers[0].self_attention(x, x, x, need_weights=True, average_attn_weights=False)
    assert torch.allclose(layer.attention(x), expected, atol=1e-5)


def test_eva_with_rotary_position_embedding_is_initialised_through_its_rotation():
    report = structinit.initialize(
        small_eva(use_rot_pos_emb=True, ref_feat_shape=(8, 8)),
        "impulse",
        seed=0,
    )
    assert report.measured_on == "pseudo input, rotated" and report.min_fidelity > 0.97  # tests/test_rope_families.py


def test_hugging_face_vit_when_installed(images):
    transformers = pytest.importorskip("transformers")
    config = transformers.ViTConfig(
        image_size=32, patch_size=4, hidden_size=192, num_hidden_layers=2, num_attention_heads=12, num_labels=10
    )
    config._attn_implementation = "eager"  # so that the model can return its attention maps
    model = transformers.ViTForImageClassification(config)
    before = snapshot(model)
    report = structinit.initialize(model, SHARP, seed=0)
    assert report.min_fidelity > 0.97, str(report)
    # the class token and position embeddings are redrawn from the seed (what the solve reads repeats)
    written = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "position_embeddings", "cls_token")
    assert changed(before, model) == {n for n in before if n.endswith(written)} | {
        n for n in before if n.endswith(("q_proj.bias", "k_proj.bias")) and before[n].any()
    }
    from structinit.adapters import get_adapter

    adapter = get_adapter(model)
    expected = model(pixel_values=images, output_attentions=True).attentions[0]
    layer = adapter.layers()[0]
    assert torch.allclose(layer.attention(layer.norm(adapter.embed(images))), expected, atol=1e-5)
    loss = model(pixel_values=images, labels=torch.tensor([0, 1, 2, 3])).loss
    loss.backward()
    assert torch.isfinite(loss) and model.vit.layers[1].attention.q_proj.weight.grad.abs().sum() > 0
