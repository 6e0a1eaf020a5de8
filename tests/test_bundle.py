"""The impulse forms by name, the base under a structured init, and the qk-norm control: the paper's
bundle taken apart, each part changing only what it names."""

import pytest
import torch

import structinit


def changed(before, after):
    """The names of the state-dict entries that differ."""
    return {k for k in before if not torch.equal(before[k], after[k])}


def snapshot(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


QK, V = slice(0, 2 * 192), slice(2 * 192, 3 * 192)  # rows of the packed qkv weight (width 192)


def test_impulse_is_the_papers_text_q_and_k_alone_on_pytorchs_defaults(make_vit):
    """Issue 53: `impulse` writes Q and K (and zeroes their biases) and nothing else: every other tensor equals
    `kaiming` (PyTorch's defaults) of the same seed; its sharpness is the paper's solve's, recorded."""
    model, plain = make_vit(num_heads=3), make_vit(num_heads=3)
    report = structinit.initialize(model, "impulse", seed=5)
    structinit.initialize(plain, "kaiming", seed=5)
    ours, theirs = model.state_dict(), plain.state_dict()
    for name, value in theirs.items():
        if name.endswith("attn.qkv.weight"):
            assert torch.equal(ours[name][V], value[V]) and not torch.equal(ours[name][QK], value[QK]), name
        elif name.endswith("attn.qkv.bias"):
            assert torch.equal(ours[name][V], value[V]) and not ours[name][QK].any(), name
        else:
            assert torch.equal(ours[name], value), name
    sharpness = float(report.source["target_fidelity"].split()[0])
    assert 0.01 <= sharpness <= 0.99 and report.options["target_fidelity"] is None
    assert report.min_fidelity == pytest.approx(sharpness, abs=0.01)
    again = make_vit(num_heads=3)  # the recorded value reproduces the weights without the solve
    structinit.initialize(again, f"impulse[target_fidelity={sharpness}]", seed=5)
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(), ours.values()))


def test_impulse_neurips_is_the_official_codes_bundle(make_vit):
    """The NeurIPS code (structured_initialization@7cd02f1, weight_init=skip, impulse_18_7_1): position
    embedding x18, the least-squares Q/K at x7, offsets in the order k = [4,1,5,3,7,0,2,6,8] (head i takes
    k[i mod 9] of the 3 x 3 kernel read row by row), V/proj 0.4 Z - 0.4 I, PyTorch's defaults elsewhere."""
    model, plain = make_vit(num_heads=3), make_vit(num_heads=3)
    report = structinit.initialize(model, "impulse-neurips", seed=2)
    structinit.initialize(plain, "kaiming", seed=2)
    assert float(model.pos_embed.detach().std()) == pytest.approx(18 * 0.02, rel=1e-5)  # x18 timm's std
    kernel = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
    assert [h.offset for h in report.layers[0].heads] == [kernel[k] for k in (4, 1, 5)]
    o = report.options
    assert (o["solver"], o["qk_scale"], o["vproj"], o["vproj_alpha"], o["vproj_beta"]) == (
        "authors",
        7.0,
        "mimetic",
        0.4,
        0.4,
    )
    for name in ("blocks.0.mlp.fc1.weight", "blocks.1.norm2.weight", "patch_embed.proj.weight", "head.weight"):
        assert torch.equal(model.state_dict()[name], plain.state_dict()[name]), name


def test_an_old_name_resolves_with_a_note(make_vit):
    with pytest.warns(FutureWarning, match="'impulse-authors' is called 'impulse-neurips' since structinit 0.3.0"):
        old = structinit.initialize(make_vit(num_heads=3), "impulse-authors[qk_scale=2]", seed=0)
    new = structinit.initialize(make_vit(num_heads=3), "impulse-neurips[qk_scale=2]", seed=0)
    assert old.options == new.options


def test_impulse_soft_and_impulse_authors_resolve_to_their_settings(make_vit):
    soft = structinit.initialize(make_vit(num_heads=3), "impulse-soft", seed=0)
    assert (soft.options["target_fidelity"], soft.options["pos_scale"], soft.options["vproj"]) == (0.3, None, "keep")
    assert soft.min_fidelity == pytest.approx(0.3, abs=0.01)
    authors = structinit.initialize(make_vit(num_heads=3), "impulse-neurips", seed=0).options
    assert (authors["solver"], authors["assignment"], authors["blind_to_content"]) == ("authors", "ordered", False)
    assert (authors["pos_scale"], authors["vproj"], authors["base"]) == (18.0, "mimetic", "kaiming")


@pytest.mark.parametrize("base", ["timm", "kaiming"])
@pytest.mark.parametrize("method", ["mimetic", "impulse", "qk-norm"])
def test_the_base_is_the_plain_init_of_that_name_under_the_layers_a_method_does_not_set(make_vit, method, base):
    """With base=B, every weight the method does not write is bit-identical to `initialize(model, B)` with
    the same seed: the base is drawn first, from the same generator."""
    plain = make_vit()
    structinit.initialize(plain, base, seed=3)
    model = make_vit()
    structinit.initialize(model, method, seed=3, base=base)
    ours, theirs = model.state_dict(), plain.state_dict()
    for name in ("blocks.0.mlp.fc1.weight", "blocks.1.mlp.fc2.bias", "patch_embed.proj.weight", "head.weight"):
        assert torch.equal(ours[name], theirs[name]), name
    assert not torch.equal(ours["blocks.0.attn.qkv.weight"][QK], theirs["blocks.0.attn.qkv.weight"][QK])


def test_base_keep_leaves_what_the_model_has(make_vit):
    model = make_vit()
    structinit.initialize(model, "kaiming", seed=1)
    before = snapshot(model)
    structinit.initialize(model, "mimetic", seed=0)
    written = {f"blocks.{i}.attn.{w}.weight" for i in (0, 1) for w in ("qkv", "proj")}
    assert changed(before, model.state_dict()) == written | {"pos_embed", "cls_token"}  # drawn from its seed


@pytest.mark.parametrize("norm", [2.0, 7.0, 15.5])
def test_qk_norm_sets_every_heads_norm_and_keeps_its_direction(make_vit, norm):
    model = make_vit(num_heads=6)
    structinit.initialize(model, "kaiming", seed=1)
    before = snapshot(model)
    structinit.initialize(model, "qk-norm", seed=0, norm=norm)
    after = model.state_dict()
    assert changed(before, after) == {"blocks.0.attn.qkv.weight", "blocks.1.attn.qkv.weight", "pos_embed", "cls_token"}
    for i in (0, 1):
        old, new = before[f"blocks.{i}.attn.qkv.weight"], after[f"blocks.{i}.attn.qkv.weight"]
        heads = new[QK].view(12, 32, 192)  # q and k of 6 heads of dimension 32
        assert torch.allclose(heads.norm(dim=(1, 2)), torch.full((12,), norm), rtol=1e-5)
        ratio = new[QK].view(12, -1) / old[QK].view(12, -1)  # one positive factor per head
        assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-4) and bool((ratio > 0).all())
        assert torch.equal(new[V], old[V])


def test_qk_norm_refuses_a_model_that_normalises_q_and_k(make_vit):
    with pytest.raises(ValueError, match=r"normalises each head's q and k \(qk_norm\).*use norm=None"):
        structinit.initialize(make_vit(qk_norm=True), "qk-norm", seed=0)


# The bundle, one part at a time: each label changes only its part of the model (beside the learned
# position embedding and class token, which the structured inits draw from their seed and read).
PARTS = {
    "impulse[target_fidelity=0.98,base=keep]": ("qk", "qk bias"),  # the impulse Q/K alone
    "qk-norm[norm=None,pos_scale=18]": ("pos",),  # the position-embedding scale alone
    "qk-norm[norm=None,vproj=mimetic]": ("v", "proj"),  # the V/proj form alone
    "qk-norm": ("qk",),  # the Q/K norm alone
}


@pytest.mark.parametrize("label", list(PARTS))
def test_each_part_of_the_bundle_changes_only_its_part(make_vit, label):
    from structinit.inits.labels import InitSpec

    spec = InitSpec.parse(label)
    method, options = spec.method, spec.options
    model = make_vit()
    structinit.initialize(model, "kaiming", seed=1)  # random biases, so that zeroing them shows
    reference = make_vit()
    reference.load_state_dict(model.state_dict())
    structinit.initialize(reference, "qk-norm", seed=0, norm=None)  # draws the embeddings, writes nothing
    before = snapshot(reference)
    structinit.initialize(model, method, seed=0, **options)
    after = model.state_dict()
    parts = PARTS[label]
    for name, value in before.items():
        new = after[name]
        if name.endswith("attn.qkv.weight"):
            assert torch.equal(value[QK], new[QK]) != ("qk" in parts), name
            assert torch.equal(value[V], new[V]) != ("v" in parts), name
        elif name.endswith("attn.qkv.bias"):
            assert torch.equal(value[QK], new[QK]) != ("qk bias" in parts), name
            assert torch.equal(value[V], new[V]), name
        elif name.endswith("attn.proj.weight"):
            assert torch.equal(value, new) != ("proj" in parts), name
        elif name == "pos_embed":
            assert torch.equal(value, new) != ("pos" in parts), name
            if "pos" in parts:
                assert float(new.detach().std()) == pytest.approx(0.36, rel=1e-5)
        else:
            assert torch.equal(value, new), name
