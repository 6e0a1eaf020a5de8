"""What a run says before it trains: data, model, the init as resolved, steps and warm-up, and the init's
fidelity on the pseudo input and on the run's own images (kept in init_report.json)."""

import json

import timm
import torch

from structinit import initialize, measure_on_images
from structinit.cli import main

TINY = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2"]


def test_train_says_what_it_is_about_to_do_and_records_it(tmp_path, capsys):
    argv = ["train", "--per-class", "10", "--epochs", "2", "-b", "64", *TINY, "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    lines = out[: out.index(next(line for line in out if line.startswith("steps:"))) + 2]
    assert (
        lines[0] == "data: digits, 100 training images (10 a class) of 10 classes, 8 px; evaluated on test (360 images)"
    )
    assert lines[1].startswith("model: vit_digits, 0.0") and lines[1].endswith("65 tokens (8x8 + 1 prefix)")
    assert lines[2].startswith("init: auto -> mimetic[base=kaiming], fidelity 0.")
    assert lines[3].startswith("  fidelity on 16 images: mean ") and "(a uniform map: 0.015)" in lines[3]
    assert "steps: 1 an epoch at batch 64, 2 in 2 epochs; warm-up 3 steps (3 epochs)" in out
    assert "  few steps: an epoch is 1 step(s) and the warm-up 3: a smaller --batch-size gives more" in "\n".join(out)
    record = json.loads((tmp_path / "r" / "init_report.json").read_text())
    assert record["startup"][0] == lines[0] and record["on_images"]["images"] == 16
    assert 0 < record["on_images"]["mean"] < record["mean_fidelity"]


def test_a_quiet_run_says_nothing_and_still_records_it(tmp_path, capsys):
    argv = ["train", "--per-class", "10", "--epochs", "1", "-b", "16", *TINY, "--init", "impulse", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert capsys.readouterr().out.startswith("finished: ")  # only the result
    record = json.loads((tmp_path / "r" / "init_report.json").read_text())
    assert record["startup"][2].startswith("init: impulse, fidelity 0.")


def test_the_report_says_where_impulse_structure_lives_on_a_learned_embedding_vit():
    model = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=4, num_classes=10)
    report = initialize(model, "impulse", seed=0)
    images = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    measure_on_images(report, model, images)
    assert report.mean_fidelity > 0.98 and report.on_images["mean"] < 0.1
    assert report.on_images["uniform"] == 1 / 65 and report.to_dict()["on_images"] == report.on_images
    text = str(report)
    assert "fidelity on pseudo input: mean 0.990" in text and "fidelity on 8 images: mean 0.0" in text
    assert "the structure is on the pseudo input (the position embedding alone), not yet on images" in text
