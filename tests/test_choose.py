"""`structinit choose`: the verdict logic on recorded results, the sizing to a budget, and whole short
comparisons on digits and on a small image folder."""

import json
import shutil

import pytest

from conftest import make_imagefolder
from structinit.cli import main
from structinit.studies.choose import BASELINES, STRUCTURED, choose, epochs_for, fitted_batch, validation_size
from structinit.studies.verdict import verdict
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


def test_a_control_that_ties_the_structured_init_and_beats_kaiming_says_scale_helps_not_structure():
    scores = {STRUCTURED: [61.0, 62.0], CONTROL: [60.8, 61.6], "kaiming": [57.0, 57.5]}
    result = verdict(scores, STRUCTURED, CONTROL)
    assert result.scale_not_structure
    assert "what helps on this data is the scale of the Q/K weights, not the convolutional prior" in result.text()


def test_a_control_no_better_than_kaiming_claims_nothing_of_scale():
    scores = {STRUCTURED: [70.0, 71.0], CONTROL: [70.5, 70.9], "kaiming": [70.5, 70.9], "timm": [60.0, 60.5]}
    result = verdict(scores, STRUCTURED, CONTROL, chance=10.0)
    assert not result.scale_not_structure and "scale" not in result.text()


def test_runs_near_chance_are_too_short_to_tell():
    scores = {STRUCTURED: [14.0, 14.5], "kaiming": [10.0, 10.2], CONTROL: [10.0, 10.0]}
    result = verdict(scores, STRUCTURED, CONTROL, chance=10.0)
    assert result.too_short == "the best init's 14.25 is near chance (10.00)"
    assert "verdict: too short to tell (the best init's 14.25 is near chance (10.00)): train longer" in result.text()
    assert "verdict: use" not in result.text() and "scale" not in result.text()


def test_runs_all_within_the_noise_of_each_other_are_too_short_to_tell():
    scores = {STRUCTURED: [60.0, 64.0], "kaiming": [61.0, 62.0], "timm": [59.0, 60.0]}
    result = verdict(scores, STRUCTURED, chance=10.0)
    assert result.too_short == "every init is within the seeds' spread (2.83) of every other"


@pytest.mark.parametrize("scores", [{"kaiming": [60.0, 61.0]}, {"kaiming": [60.0, 61.0], STRUCTURED: [62.0]}])
def test_a_verdict_needs_two_inits_of_two_seeds(scores):
    with pytest.raises(ValueError, match="at least two inits with at least two seeds each"):
        verdict(scores, STRUCTURED)


def test_the_budget_sets_the_epochs_every_run_can_train():
    # 8 runs of 1,000 training images at 1 ms and 100 evaluation images at 0.4 ms an image: 1.04 s an epoch
    assert epochs_for(1.0, 8, 1000, 100, (1e-3, 4e-4)) == int(60 * 0.8 / (8 * (1.0 + 0.04)))
    assert epochs_for(0.001, 8, 1000, 100, (1e-3, 4e-4)) == 1  # at least one


@pytest.mark.parametrize(("batch", "images", "fitted"), [(128, 120, 8), (128, 1280, 128), (8, 20, 2), (128, 3, 1)])
def test_a_batch_that_was_not_asked_is_fitted_to_ten_steps_an_epoch(batch, images, fitted):
    assert fitted_batch(batch, images) == fitted


def test_the_command_prints_the_regime_and_the_verdict_on_digits(tmp_path, capsys):
    small = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--per-class", "10", "-b", "8", "--quiet"]
    assert main(["choose", *small, "--val-per-class", "4", "--epochs", "1", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert (
        "compared: 5 inits x seeds 0,1 on digits (10 images a class, 4 a class held out for validation), 1 epochs "
        "(12 steps at batch 8) of vit_digits" in out
    )
    assert "\nverdict: " in out and "kaiming" in out and "timm" in out and "10 runs; results.md" in out


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
    assert {row["split"] for row in rows} == {"val"} and len(rows) == 10
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
    assert len(choice.rows) == 10 and choice.config.img_size == 16


# --- choose on any folder, resumed as planned, never pooled --------------------------------------------------

TINY = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--quiet"]


def test_choose_sized_by_minutes_answers_on_a_folder_of_80_px_images(tmp_path, capsys):
    """Images over 64 px stream from their files: the sizing times the trainer's own batches of them."""
    folder = make_imagefolder(tmp_path / "photos", 80, per_class=10, classes=("a", "b", "c"))
    assert main(["choose", str(folder), *TINY, "--minutes", "0.1", "--out", str(tmp_path / "c")]) == 0
    out = capsys.readouterr().out
    assert "sized to --minutes 0.1) of vit_digits" in out and "\nverdict: " in out


def test_choose_with_its_defaults_fits_the_batch_to_a_150_image_folder(tmp_path, capsys):
    folder = make_imagefolder(tmp_path / "photos", 16, per_class=50, classes=("a", "b", "c"), splits=("train",))
    for image in sorted(folder.glob("train/*/*.png"))[::5]:  # 150 photos: 120 to train on, 30 to test
        (folder / "test" / image.parent.name).mkdir(parents=True, exist_ok=True)
        image.rename(folder / "test" / image.parent.name / image.name)
    argv = ["choose", str(folder), *TINY, "--epochs", "1", "--out", str(tmp_path / "c")]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "batch size 8 (not 128): 96 training images, 12 steps an epoch" in out  # 8 a class held out
    assert "(12 steps at batch 8) of vit_digits" in out and "\nverdict: " in out


def test_a_batch_asked_that_exceeds_the_images_is_refused_before_anything_trains(tmp_path, capsys):
    folder = make_imagefolder(tmp_path / "photos", 16, per_class=10, classes=("a", "b"))
    argv = ["choose", str(folder), *TINY, "-b", "64", "--epochs", "1", "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    assert (
        "--batch-size 64 exceeds the 16 training images: give -b 16 or less, or leave -b out" in capsys.readouterr().err
    )
    assert not (tmp_path / "c").exists()


def _choose_digits(tmp_path, *more):
    argv = ["choose", *TINY, "--per-class", "10", "-b", "8", "--val-per-class", "4", "--out", str(tmp_path / "c")]
    return main([*argv, *more])


def test_choose_again_resumes_as_planned_without_timing_again(tmp_path, capsys, monkeypatch):
    import structinit.studies.choose as module

    monkeypatch.setattr(module, "seconds_per_image", lambda config, data: (2e-3, 1e-3))
    assert _choose_digits(tmp_path, "--minutes", "0.5") == 0
    epochs = json.loads((tmp_path / "c" / "choose.json").read_text())["epochs"]
    assert epochs == module.epochs_for(0.5, 10, 100, 40, (2e-3, 1e-3))  # 10 a class to train, 4 held out
    shutil.rmtree(tmp_path / "c" / "per_class_10" / "timm-seed1")  # as if interrupted before its run
    monkeypatch.setattr(module, "seconds_per_image", lambda config, data: pytest.fail("timed again"))
    capsys.readouterr()
    assert _choose_digits(tmp_path, "--minutes", "3") == 0
    out = capsys.readouterr().out
    assert f"resuming the comparison planned in {tmp_path / 'c' / 'choose.json'}: {epochs} epochs a run" in out
    assert f"{epochs} epochs (" in out and "10 runs" in out


def test_choose_into_a_comparison_of_another_size_is_refused_up_front_and_pools_nothing(tmp_path, capsys):
    assert _choose_digits(tmp_path, "--epochs", "1") == 0
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "c").rglob("*"))
    capsys.readouterr()
    argv = ["choose", *TINY, "--per-class", "20", "-b", "8", "--val-per-class", "4", "--epochs", "1"]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 2
    assert (
        f"--out {tmp_path / 'c'} holds another comparison, made with --per-class 10 (now 20): give another --out, "
        "or the same flags to resume it" in capsys.readouterr().err
    )
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "c").rglob("*")) == before


def test_choose_into_another_grid_is_refused(tmp_path, capsys):
    small = ["--per-class", "10", "-b", "8", "--epochs", "1", "--model-kwargs", "depth=1,embed_dim=32,num_heads=2"]
    assert main(["compare", *small, "--inits", "timm", "--seeds", "0", "--quiet", "--out", str(tmp_path / "g")]) == 0
    assert _choose_digits(tmp_path / "g", "--epochs", "1") == 0  # its own folder, c, inside: allowed
    assert main(["choose", *small, "--quiet", "--out", str(tmp_path / "g")]) == 2
    assert "holds runs of another grid" in capsys.readouterr().err


@pytest.mark.parametrize("minutes", ["nan", "inf", "-1", "0"])
def test_minutes_that_are_not_a_finite_positive_number_are_refused_in_one_line(tmp_path, capsys, minutes):
    assert _choose_digits(tmp_path, f"--minutes={minutes}") == 2
    assert f"--minutes must be a finite number > 0, got {float(minutes)}" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("label", ["timm", "default", "auto", "kaiming", "mimetic[base=kaiming]", "qk-norm[norm=2]"])
def test_structured_must_be_a_structured_init(tmp_path, capsys, label):
    assert _choose_digits(tmp_path, "--structured", label) == 2
    assert f"--structured {label}: " in capsys.readouterr().err and not (tmp_path / "c").exists()


def test_every_flag_a_choose_message_suggests_exists(capsys):
    with pytest.raises(SystemExit):
        main(["choose", "--help"])
    text = capsys.readouterr().out
    for suggested in ("--rerun", "--minutes", "--epochs", "--out", "--batch-size"):
        assert suggested in text
