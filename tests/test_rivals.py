"""The inits published since the paper (inits/rivals.py), each held to its defining property."""

import math

import pytest
import timm
import torch
from torchvision.models.vision_transformer import VisionTransformer

import structinit
from conftest import small_vit
from structinit.inits.rivals import sinusoid


def weights(model):
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def test_conditioned_gives_every_heads_query_and_key_condition_number_one_and_value_the_identity():
    model = small_vit(embed_dim=96, num_heads=3)
    before = weights(model)
    structinit.initialize(model, "conditioned", seed=0)
    for block in model.blocks:
        q, k, v = block.attn.qkv.weight.detach().double().chunk(3)
        for w in (q, k):
            for head in w.chunk(3):  # 32 rows of 96 inputs each
                singular = torch.linalg.svdvals(head)
                assert torch.allclose(singular, torch.ones_like(singular), atol=1e-6)
        assert torch.equal(v, torch.eye(96, dtype=torch.float64))
    after = weights(model)
    changed = {n for n in after if not torch.equal(after[n], before[n])}
    seeded = {"pos_embed", "cls_token"}  # drawn from the seed, as every structured init on base=keep does
    assert changed == {f"blocks.{i}.attn.qkv.weight" for i in range(2)} | seeded  # proj, biases: the base's


def test_sinusoidal_is_the_formula_at_glorots_variance_the_same_for_every_seed():
    model, other = small_vit(embed_dim=96, num_heads=3), small_vit(embed_dim=96, num_heads=3)
    other.load_state_dict(model.state_dict())
    before = weights(model)
    structinit.initialize(model, "sinusoidal", seed=0)
    structinit.initialize(other, "sinusoidal", seed=7)
    fc1 = model.blocks[0].mlp.fc1.weight.detach().double()  # (384, 96)
    rows, cols = fc1.shape
    assert fc1.var().item() == pytest.approx(2 / (rows + cols), rel=1e-5)
    i, j = torch.arange(1, rows + 1, dtype=torch.float64).unsqueeze(1), torch.arange(cols, dtype=torch.float64)
    raw = torch.sin(i * (2 * math.pi * j / cols + 2 * math.pi / rows))
    assert torch.allclose(fc1 / fc1[0].norm() * raw[0].norm(), raw, atol=1e-5)
    qkv = model.blocks[0].attn.qkv.weight.detach()
    assert all(torch.equal(part, sinusoid(96, 96)) for part in qkv.chunk(3))  # the fused qkv as three matrices
    patch = model.patch_embed.proj.weight.detach()
    assert torch.equal(patch.reshape(96, -1), sinusoid(96, 3 * 4 * 4))  # a conv: (c_out, c_in k k)
    assert all(torch.equal(t, other.state_dict()[n]) for n, t in model.state_dict().items())  # no seed reaches it
    assert not model.blocks[0].attn.qkv.bias.any() and torch.equal(model.norm.weight, before["norm.weight"])


def test_sinusoidal_keeps_the_embeddings_the_model_made_as_its_source_does():
    """The source sets Linear, Conv and attention weights only: the position embedding and class token stay
    as the model made them (0.5.0 drew them from the seed, so the report's 'no randomness' had some)."""
    model = small_vit(embed_dim=96, num_heads=3)
    before = weights(model)
    report = structinit.initialize(model, "sinusoidal", seed=0)
    assert torch.equal(model.pos_embed, before["pos_embed"]) and torch.equal(model.cls_token, before["cls_token"])
    assert not {"pos_embed", "cls_token"} & set(report.set_tensors)


def test_sinusoidal_sets_torchvisions_packed_in_proj_as_its_three_matrices():
    """nn.MultiheadAttention keeps Q, K and V in one in_proj_weight, no Linear: 0.5.0 left it as torch drew it,
    and reported the model sinusoidal."""
    model = VisionTransformer(16, 4, 2, 2, 32, 64, num_classes=5)
    with torch.no_grad():
        for block in model.encoder.layers:
            block.self_attention.in_proj_bias.uniform_(-1, 1)
    report = structinit.initialize(model, "sinusoidal", seed=0)
    for i, block in enumerate(model.encoder.layers):
        attention = block.self_attention
        assert all(torch.equal(part, sinusoid(32, 32)) for part in attention.in_proj_weight.detach().chunk(3))
        assert not attention.in_proj_bias.any() and not attention.out_proj.bias.any()
        assert f"encoder.layers.encoder_layer_{i}.self_attention.in_proj_weight" in report.set_tensors


def test_the_sinusoid_is_exact_where_a_phase_is_a_multiple_of_pi_and_refused_where_all_are():
    """sin(2 pi k / 2) is 0, which sin's rounding made 1e-16, and the scale to Glorot's variance turned that
    noise into weights: a 2 x 2 sinusoid came out of rounding alone, a 1 x 1 as NaN after the write."""
    assert sinusoid(3, 1)[2, 0] == 0 and not sinusoid(4, 2)[1::2].any() and not sinusoid(2, 3)[:, 0].any()
    for rows, cols in ((1, 1), (1, 2), (2, 1), (2, 2)):
        with pytest.raises(ValueError, match=f"the {rows} x {cols} sinusoid is all zeros"):
            sinusoid(rows, cols)
    model = small_vit(embed_dim=96, num_heads=3, num_classes=2)
    model.head = torch.nn.Sequential(torch.nn.Linear(96, 2), torch.nn.Linear(2, 2))  # a 2-unit bottleneck
    before = weights(model)
    with pytest.raises(ValueError, match=r"the 2 x 2 matrix of head\.1\.weight is all zeros in the formula"):
        structinit.initialize(model, "sinusoidal", seed=0)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())


def test_sinusoidal_refuses_before_any_write_a_parameter_it_would_leave_unset():
    """A MAP head's latent query is no Linear, Conv, bias, norm, layer scale or embedding: left as it was, the
    report would call the model sinusoidal; refused by name instead."""
    model = small_vit(embed_dim=96, num_heads=3, global_pool="map")
    before = weights(model)
    with pytest.raises(ValueError, match=r"this model's attn_pool\.latent \(AttentionPoolLatent\) is none of these"):
        structinit.initialize(model, "sinusoidal", seed=0)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())


def test_mimetic_vo_sets_the_value_path_to_minus_beta_and_leaves_query_and_key():
    model = small_vit(embed_dim=96, num_heads=3)
    before = weights(model)
    structinit.initialize(model, "mimetic-vo[beta=0.1]", seed=0)
    for i, block in enumerate(model.blocks):
        value = block.attn.qkv.weight.detach()[192:]
        path = block.attn.proj.weight.detach() @ value  # x -> x W_v^T W_proj^T
        assert torch.diagonal(path).mean().item() == pytest.approx(-0.1, abs=2e-3)
        assert (path + 0.1 * torch.eye(96)).abs().max().item() < 0.03  # the noise's products
        assert torch.equal(block.attn.qkv.weight[:192], before[f"blocks.{i}.attn.qkv.weight"][:192])


def test_the_rivals_refuse_a_family_they_do_not_apply_to_before_any_write():
    mixer = timm.create_model("mixer_s16_224", img_size=32, num_classes=10)
    before = weights(mixer)
    for label in ("conditioned", "sinusoidal", "mimetic-vo"):
        with pytest.raises(ValueError, match=label):
            structinit.initialize(mixer, label, seed=0)
    assert all(torch.equal(t, before[n]) for n, t in mixer.state_dict().items())


def test_conditioned_refuses_query_rows_beyond_the_inputs_before_any_write():
    """A layer whose Q/K has more rows than inputs (here the last block's heads widened to 64 each) cannot be
    made orthonormal: refused before the first block, which could be, is written."""
    model = small_vit(embed_dim=96, num_heads=3)
    model.blocks[-1].attn.qkv, model.blocks[-1].attn.head_dim = torch.nn.Linear(96, 3 * 192), 64
    before = weights(model)
    with pytest.raises(ValueError, match="conditioned: 192 query rows over 96 inputs cannot be orthonormal"):
        structinit.initialize(model, "conditioned", seed=0)
    assert all(torch.equal(t, before[n]) for n, t in model.state_dict().items())
