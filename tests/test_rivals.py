"""The inits published since the paper (inits/rivals.py), each held to its defining property."""

import math

import pytest
import timm
import torch

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
    unseeded = [n for n in model.state_dict() if n not in ("pos_embed", "cls_token")]
    assert all(torch.equal(model.state_dict()[n], other.state_dict()[n]) for n in unseeded)
    assert not model.blocks[0].attn.qkv.bias.any() and torch.equal(model.norm.weight, before["norm.weight"])


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
