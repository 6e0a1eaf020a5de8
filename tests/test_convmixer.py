"""ConvMixer filter inits (frozen or not) and the stable rank of features: the theory experiments."""

import collections

import pytest
import torch
from timm.optim import create_optimizer_v2

import structinit
from structinit.cli import main
from structinit.inspection.rank import feature_ranks, stable_rank
from structinit.models import create_model
from structinit.offsets import kernel_offsets
from structinit.training import TrainConfig, train


def convmixer(kernel_size=3, dim=32, depth=2):
    return create_model(
        "convmixer_d6_p4", num_classes=10, in_chans=3, data_size=32, dim=dim, depth=depth, kernel_size=kernel_size
    )


def depthwise(model):
    return [block[0].fn[0] for block in model.blocks]


@pytest.mark.parametrize("kernel_size", [3, 5])
def test_impulse_filters_are_one_hot_and_cover_every_offset_before_repeating(kernel_size):
    model = convmixer(kernel_size, dim=60)
    report = structinit.initialize(model, "impulse", seed=0)
    f2 = kernel_size**2
    for layer, conv in zip(report.layers, depthwise(model)):
        taps = conv.weight.detach().flatten(1)  # (channels, f*f)
        assert torch.equal(taps.sum(1), torch.ones(60)) and torch.equal((taps != 0).sum(1), torch.ones(60).long())
        offsets = [kernel_offsets(kernel_size)[int(i)] for i in taps.argmax(1)]
        assert offsets == [h.offset for h in layer.heads]
        for start in range(0, 60 - f2 + 1, f2):  # each run of f^2 channels holds every offset once
            assert sorted(offsets[start : start + f2]) == sorted(kernel_offsets(kernel_size))
        counts = collections.Counter(offsets)
        assert len(counts) == f2 and max(counts.values()) - min(counts.values()) <= 1
    assert report.min_fidelity == 1.0 and report.options == {"kernel_size": kernel_size, "freeze": False}


def test_an_impulse_filter_shifts_the_feature_map_by_its_offset():
    model = convmixer(3, dim=9, depth=1)
    structinit.initialize(model, "impulse", seed=1)
    conv = depthwise(model)[0]
    conv.bias.data.zero_()
    x = torch.randn(1, 9, 8, 8)
    y = conv(x)
    for channel, head in enumerate(structinit.initialize(model, "impulse", seed=1).layers[0].heads):
        dy, dx = head.offset
        assert torch.equal(y[0, channel, 2:6, 2:6], x[0, channel, 2 + dy : 6 + dy, 2 + dx : 6 + dx])


def test_box_filters_are_constant_and_random_filters_follow_the_seed():
    model = convmixer(5)
    structinit.initialize(model, "box", seed=0)
    assert all(torch.equal(c.weight, torch.full_like(c.weight, 1 / 25)) for c in depthwise(model))
    first = [c.weight.clone() for c in depthwise(model)]
    structinit.initialize(model, "random", seed=3)
    again = convmixer(5)
    structinit.initialize(again, "random", seed=3)
    assert all(torch.equal(a.weight, b.weight) for a, b in zip(depthwise(model), depthwise(again)))
    assert not any(torch.equal(a.weight, b) for a, b in zip(depthwise(model), first))
    bound = 1 / 5  # kaiming_uniform(a=sqrt(5)) on fan_in 25
    assert all(c.weight.abs().max() <= bound for c in depthwise(model))


def test_frozen_filters_stay_bit_identical_and_are_not_optimised(tmp_path):
    model = convmixer()
    structinit.initialize(model, "impulse", seed=0, freeze=True)
    frozen = {id(p) for c in depthwise(model) for p in c.parameters()}
    optimised = {
        id(p) for group in create_optimizer_v2(model, "adamw", weight_decay=0.05).param_groups for p in group["params"]
    }
    assert frozen and not frozen & optimised

    run = tmp_path / "run"
    config = TrainConfig(
        data="digits",
        per_class=20,
        model="convmixer_d6_p4",
        model_kwargs={"dim": 32, "depth": 2},
        init="impulse[freeze=True]",
        epochs=2,
        batch_size=50,
        out=str(run),
        quiet=True,
    )
    train(config)
    trained = torch.load(run / "last.pt", map_location="cpu", weights_only=False)["model"]
    at_init, _ = structinit.training.recipe.model_of(config, structinit.data.datasets.load_data("digits", per_class=20))
    for name, value in at_init.state_dict().items():
        if name.startswith("blocks.") and ".fn.0." in name:
            assert torch.equal(trained[name], value), name  # the frozen depthwise filters
        elif name.endswith("weight") and "head" in name:
            assert not torch.equal(trained[name], value)  # the rest trained


def test_filter_init_errors():
    model = convmixer(3)
    with pytest.raises(ValueError, match="'mimetic' does not apply to ConvMixer's depthwise filters"):
        structinit.initialize(model, "mimetic")
    with pytest.raises(ValueError, match="kernel_size 5 does not match this ConvMixer's 3 x 3 depthwise filters"):
        structinit.initialize(model, "impulse", kernel_size=5)
    with pytest.raises(TypeError, match=r"unknown option.*target_fidelity.*options are: freeze"):
        structinit.initialize(model, "impulse", target_fidelity=0.9)
    with pytest.raises(TypeError, match="option freeze of the filter inits takes True or False, got 'yes'"):
        structinit.initialize(model, "box", freeze="yes")
    with pytest.raises(TypeError, match="a ConvMixer has no attention"):
        structinit.fidelity(model)
    with pytest.raises(ValueError, match=r"'box' \(a ConvMixer filter init\)"):
        structinit.initialize(create_model("vit_d6_p4", num_classes=10, in_chans=3, data_size=32), "box")


def test_stable_rank_of_known_matrices():
    u, v = torch.randn(20, 1), torch.randn(1, 7)
    assert stable_rank(u @ v).item() == pytest.approx(1.0)
    assert stable_rank(torch.eye(6)).item() == pytest.approx(6.0)
    assert stable_rank(torch.diag(torch.tensor([2.0, 1.0, 1.0]))).item() == pytest.approx(1.5)
    batched = stable_rank(torch.stack([torch.eye(4), torch.zeros(4, 4)]))
    assert batched.tolist() == [pytest.approx(4.0), 0.0]
    with pytest.raises(ValueError, match="needs a matrix"):
        stable_rank(torch.ones(3))


@pytest.mark.parametrize("name", ["vit_d6_p4", "convmixer_d6_p4"])
def test_feature_ranks_cover_the_patch_embedding_and_every_block(name):
    model = create_model(name, num_classes=10, in_chans=3, data_size=32, depth=3)
    ranks = feature_ranks(model, torch.randn(4, 3, 32, 32))
    assert [r.name for r in ranks] == ["patch embedding", "block 1", "block 2", "block 3"]
    assert all(r.bound == 64 and 1.0 <= r.stable_rank <= 64 for r in ranks)  # 8 x 8 tokens, 192 channels
    with pytest.raises(ValueError, match="images must be a non-empty"):
        feature_ranks(model, torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match="images must be a non-empty"):
        feature_ranks(model, torch.randn(0, 3, 32, 32))


def test_rank_and_filters_on_the_command_line(tmp_path, capsys):
    out = tmp_path / "rank.png"
    assert (
        main(
            [
                "rank",
                "convmixer_d6_p4",
                "--init",
                "impulse",
                "--images",
                "16",
                "--out",
                str(out),
                "--model-kwargs",
                "dim=32,depth=2",
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "| patch embedding |" in printed and "| block 2 |" in printed and out.stat().st_size > 10_000
    run = tmp_path / "box"
    assert (
        main(
            [
                "train",
                "--model",
                "convmixer_d6_p4",
                "--model-kwargs",
                "dim=32,depth=2",
                "--filters",
                "box",
                "--per-class",
                "20",
                "--epochs",
                "1",
                "--batch-size",
                "50",
                "--quiet",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    assert "init: box[freeze=True]" in (run / "config.yaml").read_text()
    assert main(["train", "--filters", "box", "--init", "timm", "--out", str(tmp_path / "x")]) == 2
    assert "--filters and --init both set the init" in capsys.readouterr().err
