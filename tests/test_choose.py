"""`structinit choose`: the verdict logic on recorded results, the sizing to a budget, and whole short
comparisons on digits and on a small image folder."""

import pytest

from conftest import make_imagefolder
from structinit.cli import main
from structinit.studies.choose import BASELINES, STRUCTURED, choose, epochs_for, validation_size, verdict
from structinit.training import TrainConfig

CONTROL = "qk-norm[norm=3.5,base=kaiming]"


def test_a_margin_inside_the_seed_spread_is_a_tie():
    result = verdict({"kaiming": [60.0, 62.0], STRUCTURED: [61.5, 62.5], CONTROL: [58.0, 58.4]}, STRUCTURED, CONTROL)
    assert (result.best, result.runner_up) == (STRUCTURED, "kaiming")
    assert result.margin == pytest.approx(1.0) and result.spread == pytest.approx(2**0.5)
    assert result.tie and not result.scale_not_structure
    assert f"verdict: a tie (margin 1.00 over kaiming, seed spread 1.41): {STRUCTURED} and kaiming" in result.text()


def test_a_margin_beyond_the_spread_names_the_init_to_use():
    scores = {"kaiming": [58.0, 58.5], "mimetic[base=kaiming]": [61.0, 61.4], STRUCTURED: [59.0, 59.2]}
    result = verdict(scores, STRUCTURED)
    assert not result.tie and result.best == "mimetic[base=kaiming]"
    assert "verdict: use mimetic[base=kaiming] (margin 2.10 over " + STRUCTURED in result.text()
    assert result.text().splitlines()[1].startswith("mimetic[base=kaiming]")  # sorted by score


def test_a_control_that_ties_the_structured_init_says_scale_helps_not_structure():
    scores = {STRUCTURED: [61.0, 62.0], CONTROL: [60.8, 61.6], "kaiming": [57.0, 57.5]}
    result = verdict(scores, STRUCTURED, CONTROL)
    assert result.scale_not_structure
    assert "what helps on this data is scale, not the convolutional prior" in result.text()


@pytest.mark.parametrize("scores", [{"kaiming": [60.0, 61.0]}, {"kaiming": [60.0, 61.0], STRUCTURED: [62.0]}])
def test_a_verdict_needs_two_inits_of_two_seeds(scores):
    with pytest.raises(ValueError, match="at least two inits with at least two seeds each"):
        verdict(scores, STRUCTURED)


def test_the_budget_sets_the_epochs_every_run_can_train():
    # 8 runs of 1,000 training and 100 evaluation images at 1 ms an image: 1.033 s an epoch
    assert epochs_for(1.0, 8, 1000, 100, 1e-3) == int(60 * 0.8 / (8 * (1.0 + 0.1 / 3)))
    assert epochs_for(0.001, 8, 1000, 100, 1e-3) == 1  # at least one


def test_the_command_prints_the_regime_and_the_verdict_on_digits(tmp_path, capsys):
    small = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--per-class", "10", "-b", "8", "--quiet"]
    assert main(["choose", *small, "--val-per-class", "4", "--epochs", "1", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "regime: 1 epochs (12 steps) of vit_digits on digits, 4 validation images a class" in out
    assert "\nverdict: " in out and "kaiming" in out and "8 runs; results.md" in out


def test_the_command_refuses_two_subset_sizes(capsys):
    assert main(["choose", "--per-class", "10,20"]) == 2
    assert "choose trains at one subset size; give one K" in capsys.readouterr().err


def test_choose_sizes_the_epochs_to_the_budget_on_a_small_folder_and_gives_a_verdict(tmp_path):
    folder = make_imagefolder(tmp_path / "images", 16, per_class=12, classes=("a", "b", "c"))
    model = {"img_size": 16, "patch_size": 2, "embed_dim": 32, "depth": 1, "num_heads": 2}
    base = TrainConfig(data=f"imagefolder:{folder}", model="vit_tiny_patch16_224", model_kwargs=model)
    base = TrainConfig(**{**base.__dict__, "val_per_class": 4, "batch_size": 8, "quiet": True})
    choice = choose(base, minutes=0.05, seeds=[0, 1], out=tmp_path / "choose")
    result, rows = choice.verdict, choice.rows
    inits = [STRUCTURED, *BASELINES, result.control]
    assert sorted(result.scores) == sorted(inits) and all(len(v) == 2 for v in result.scores.values())
    assert result.control.startswith("qk-norm[norm=") and result.control.endswith(",base=kaiming]")
    assert {row["split"] for row in rows} == {"val"} and len(rows) == 8
    text = result.text()
    assert result.best in inits and all(init in text for init in inits) and "\nverdict: " in text


def test_choose_refuses_one_seed(tmp_path):
    with pytest.raises(ValueError, match="--seeds: give at least two"):
        choose(TrainConfig(data="digits", model="vit_digits", val_per_class=4), 1.0, [0], tmp_path)


def test_without_a_validation_size_choose_holds_out_a_fifth_of_the_smallest_class():
    assert validation_size(TrainConfig(data="digits", per_class=40)) == 8
    assert validation_size(TrainConfig(data="digits", per_class=5)) == 2  # at least 2


def test_choose_loads_the_data_as_its_runs_do_resizing_a_folder_of_mixed_sizes(tmp_path):
    folder = make_imagefolder(tmp_path / "images", 16, per_class=12, classes=("a", "b"))
    make_imagefolder(tmp_path / "more", 24, per_class=2, classes=("a", "b"))
    for image in (tmp_path / "more").rglob("*.png"):
        image.rename(folder / image.relative_to(tmp_path / "more").parent / f"big-{image.name}")
    model = {"patch_size": 2, "embed_dim": 32, "depth": 1, "num_heads": 2}
    base = TrainConfig(data=f"imagefolder:{folder}", model="vit_tiny_patch16_224", model_kwargs=model, img_size=16)
    base = TrainConfig(**{**base.__dict__, "val_per_class": 4, "batch_size": 8, "quiet": True})
    choice = choose(base, minutes=1.0, seeds=[0, 1], out=tmp_path / "choose", epochs=1)
    assert len(choice.rows) == 8 and choice.config.img_size == 16
