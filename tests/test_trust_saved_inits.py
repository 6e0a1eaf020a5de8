"""Saved inits that are what they say (issue 60): load_init checks the weights against the record's sha256
and for finite values, checks the record's model against the weights before building it, rebuilds a fixed
sin-cos table fixed, and reads a damaged record as one line naming it."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import structinit
from structinit.cli import main
from structinit.inits.labels import InitSpec
from structinit.models import build_model

TINY = dict(img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=10)


@pytest.fixture
def saved(tmp_path):
    import timm

    model = timm.create_model("vit_tiny_patch16_224", **TINY)
    report = structinit.initialize(model, "impulse", seed=0, target_fidelity=0.9)
    path = tmp_path / "init.safetensors"
    structinit.save_init(model, path, report, model_kwargs=TINY)
    return path


def rewrite(path, change_weights=None, change_record=None):
    """The file with its weights and/or its record changed, as a hand could change them."""
    with safe_open(str(path), "pt") as file:
        record = dict(file.metadata())
    state = load_file(str(path))
    if change_weights:
        change_weights(state)
    if change_record:
        change_record(record)
    save_file(state, str(path), metadata=record)


def test_weights_changed_after_saving_are_refused(saved):
    rewrite(saved, lambda s: s["blocks.0.attn.qkv.weight"].zero_())
    with pytest.raises(ValueError, match=r"its weights are not those it was saved with \(the record's sha256"):
        structinit.load_init(saved)


def test_weights_stored_in_another_dtype_are_refused(saved):
    rewrite(saved, lambda s: s.update({k: v.half() for k, v in s.items()}))
    with pytest.raises(ValueError, match="its weights are not those it was saved with"):
        structinit.load_init(saved)


def test_a_head_of_nans_is_refused(saved):
    rewrite(saved, lambda s: s["head.weight"].fill_(float("nan")))
    with pytest.raises(ValueError, match=r"head.weight holds values that are not finite"):
        structinit.load_init(saved)


def test_a_sincos_preset_comes_back_with_its_table_fixed(tmp_path):
    model, report = build_model(
        "vit_d6_p4_gap_sincos", InitSpec.parse("impulse"), 0, num_classes=10, in_chans=3, data_size=None
    )
    structinit.save_init(model, tmp_path / "p.safetensors", report)
    rebuilt, record = structinit.load_init(tmp_path / "p.safetensors")
    assert record["model_kwargs"]["pos_embed"] == "sincos"
    assert not rebuilt.pos_embed.requires_grad and torch.equal(rebuilt.pos_embed, model.pos_embed)


def test_a_record_nested_too_deep_is_one_line(saved):
    rewrite(saved, change_record=lambda r: r.update(options="[" * 100_000 + "]" * 100_000))
    with pytest.raises(ValueError, match=r"has a damaged record \(nested too deep to read\)"):
        structinit.load_init(saved)


def test_a_record_asking_for_a_huge_depth_is_refused_before_anything_is_built(saved):
    rewrite(saved, change_record=lambda r: r.update(model_kwargs=json.dumps({**TINY, "depth": 100_000})))
    with pytest.raises(ValueError, match="its record asks for depth 100000 and its weights hold 2 blocks"):
        structinit.load_init(saved)


def test_a_record_asking_for_pretrained_weights_names_the_record_not_a_flag(saved):
    rewrite(saved, change_record=lambda r: r.update(model_kwargs=json.dumps({**TINY, "pretrained": True})))
    with pytest.raises(ValueError) as error:
        structinit.load_init(saved)
    assert "its record's model_kwargs pretrained: structinit does not load" in str(error.value)
    assert "--model-kwargs" not in str(error.value)


def test_a_record_of_another_width_names_the_tensors_and_shapes(saved):
    rewrite(saved, change_record=lambda r: r.update(model_kwargs=json.dumps({**TINY, "embed_dim": 64})))
    with pytest.raises(
        ValueError,
        match=r"do not fit the model its record builds \(\d+ of another shape: cls_token \(1, 1, 32\) "
        r"\(the model's \(1, 1, 64\)\)",
    ):
        structinit.load_init(saved)


def test_a_damaged_record_is_not_called_older(saved):
    rewrite(saved, change_record=lambda r: r.pop("model_kwargs"))
    with pytest.raises(ValueError, match=r"does not record how to build its model \(damaged\)"):
        structinit.load_init(saved)


def test_json_and_save_naming_one_file_through_dotdot_are_refused(tmp_path, capsys):
    (tmp_path / "sav").mkdir()
    argv = ["init", "vit_digits", "--save", str(tmp_path / "X.pt"), "--json", str(tmp_path / "sav" / ".." / "X.pt")]
    assert main(argv) == 2
    assert "--json and --save both name" in capsys.readouterr().err and not (tmp_path / "X.pt").exists()
