"""Figures and tables that cannot be misread (issue 51): attention panels on one colour scale with the
uniform level marked, bar charts from 0 under the evaluation size, no ±std with one seed, plain rank
ticks, titles that wrap; results.md led by init, top-1, margin ± standard error and evaluation images,
sorted by score; mimetic matched by method; a non-impulse init's report without offsets."""

import json
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
import torch

from structinit.cli import main
from structinit.inits.labels import BUNDLE
from structinit.inspection import attention, rank
from structinit.report import HeadReport, LayerReport, Report
from structinit.studies import plots
from structinit.studies.tables import results_markdown

LEDGER = Path(__file__).parent.parent / "docs" / "results-runs.jsonl"


def row(init, seed, top1, images=360, **extra):
    return {
        **dict(dataset="digits", model="vit", heads=4, per_class="", epochs=2, split="test", recipe="r", init=init),
        **dict(seed=seed, top1=top1, images=images, curve=[(1, top1 / 2), (2, top1)], loss_curve=[(1, 2.0), (2, 1.0)]),
        **extra,
    }


@pytest.fixture
def figures(monkeypatch):
    """The figures a plotting call made, kept open to be read."""
    made, close = [], plt.close
    for module in (plots, attention):
        monkeypatch.setattr(module.plt, "close", made.append)
    yield made
    for fig in made:
        close(fig)


def test_attention_figures_of_two_inits_share_one_scale_that_marks_the_uniform_level(tmp_path, figures):
    uniform = [torch.full((2, 16, 16), 1 / 16)] * 2
    impulse = [torch.eye(16).expand(2, 16, 16) * 0.9 + 0.1 / 16] * 2
    for maps in (uniform, impulse):
        attention.plot_attention(maps, (4, 4), tmp_path / "a.png", "title")
    clims = {ax.images[0].get_clim() for fig in figures for ax in fig.axes if ax.images}
    assert clims == {(0.0, 1.0)}  # every layer of both figures: a uniform map is not drawn as bright as an impulse
    bar = next(ax for ax in figures[0].axes if ax.get_ylabel() == "attention weight")
    assert [t.get_text() for t in bar.get_yticklabels()] == ["0", "uniform 1/16", "0.25", "0.5", "1"]
    assert bar.get_yticks()[1] == pytest.approx(1 / 16)


def test_attention_caption_tells_share_on_images_from_fidelity_on_the_pseudo_input(tmp_path, figures):
    maps = [torch.eye(16).expand(2, 16, 16).clone()]
    heads = [[HeadReport((0, 0), 1.0, assigned=False)] * 2]
    long = "/data/" + "a-very-long-folder-name/" * 8
    attention.plot_attention(maps, (4, 4), tmp_path / "a.png", f"model on {long}", heads=heads)
    (fig,) = figures
    caption = fig._suptitle.get_text()
    words = " ".join(caption.split())  # the caption as read, whatever its line breaks
    assert "its share on these images" in words and "share on the pseudo input" in words
    assert max(len(line) for line in caption.splitlines()) < 100  # wrapped, long path too
    assert fig.axes[0].get_title() == "h0 (+0,+0) share 1.00"


def test_summary_without_the_baseline_has_no_epochs_panel_and_wraps_long_labels(tmp_path, figures):
    label = "impulse[vproj=keep,pos_scale=None,base=kaiming]"
    plots.plot_summary([row(label, 0, 50.0), row("kaiming", 0, 48.0)], tmp_path / "summary.png", baseline="timm")
    (fig,) = figures
    assert len(fig.axes) == 1  # no "epochs to timm's final top-1" panel without timm
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert "impulse[\nvproj=keep,\npos_scale=None,\nbase=kaiming]" in ticks
    assert plots.wrapped_label("kaiming") == "kaiming"


def test_summary_bars_start_at_zero_under_the_evaluation_size_with_no_std_for_one_seed(tmp_path, figures):
    rows = [row("timm", 0, 52.0), row("impulse", 0, 52.5, val_per_class=5, split="val")]
    rows[0].update(split="val", val_per_class=5)
    plots.plot_summary(rows, tmp_path / "summary.png")
    (fig,) = figures
    final = fig.axes[0]
    assert final.get_ylim()[0] == 0
    title = final.get_title().replace("\n", " ")
    assert "on 360 validation images (one image: 0.28 points)" in title and "one seed: no error bars" in title
    assert "±" not in title and "all images" not in title
    assert "less 5 per class held out for validation" in title


def test_curves_say_no_band_with_one_seed_and_epochs_are_whole(tmp_path, figures):
    plots.plot_curves([row("timm", 0, 50.0), row("impulse", 0, 52.0)], tmp_path / "curves.png")
    (fig,) = figures
    top, bottom = fig.axes
    assert bottom.get_legend().get_title().get_text() == "one seed each: no band"
    assert "360 test images" in top.get_title()
    assert all(float(t).is_integer() for t in bottom.get_xticks())


def test_rank_ticks_are_plain_numbers(tmp_path, monkeypatch):
    made, close = [], plt.close
    monkeypatch.setattr(plt, "close", made.append)
    ranks = [rank.LayerRank("patch embedding", 1.3, 64), rank.LayerRank("block 1", 2.0, 64)]
    rank.plot_ranks(ranks, tmp_path / "rank.png", "t " * 80)
    (fig,) = made
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels(which="both") if t.get_text()]
    close(fig)
    assert "60" in labels and not any("times" in label or "^" in label for label in labels)


def test_results_lead_with_init_top1_margin_and_images_sorted_by_score():
    """On the committed ledger of docs/studies/small-data.md: best first, the margin over the best baseline with
    its standard error over seeds, the number of test images; the other columns only when wide."""
    rows = [json.loads(line) for line in LEDGER.read_text().splitlines()]
    cell = [{**r, "images": 10000} for r in rows if r["grid"] == "vit-h12" and r["per_class"] == 200]
    table = results_markdown(cell)
    header, _, *lines = table.split("\n\n")[1].splitlines()
    assert header == "| init | seeds | top-1 (%) | margin over mimetic ± s.e. | test images |"  # the best baseline
    means = [float(line.split(" | ")[2].split(" ± ")[0]) for line in lines]
    assert means == sorted(means, reverse=True)
    by_init = {line.split(" | ")[0][2:]: line for line in lines}
    impulse = [r["top1"] for r in cell if r["init"] == BUNDLE]
    mimetic = [r["top1"] for r in cell if r["init"] == "mimetic"]
    se = torch.tensor(impulse, dtype=torch.float64).var() / 3 + torch.tensor(mimetic, dtype=torch.float64).var() / 3
    margin = sum(impulse) / 3 - sum(mimetic) / 3
    spread = torch.tensor(impulse, dtype=torch.float64).std()
    expected = f"| {BUNDLE} | 3 | {sum(impulse) / 3:.2f} ± {spread:.2f} | {margin:+.2f} ± {se.sqrt():.2f} | 10000 |"
    assert by_init[BUNDLE] == expected == f"| {BUNDLE} | 3 | 46.15 ± 0.28 | +3.55 ± 0.62 | 10000 |"
    assert "(the best baseline)" in by_init["mimetic"] and "best top-1" not in table
    assert "best top-1" in results_markdown(cell, wide=True)


def test_a_single_run_margin_takes_the_binomial_error_of_its_images():
    table = results_markdown([row("timm", 0, 50.0, images=100), row("impulse", 0, 51.0, images=100)])
    assert "| impulse | 1 | 51.00 | +1.00 ± 7.07 | 100 |" in table  # √(2 × 0.25 / 100) = 7.07 points


def test_gain_over_mimetic_matches_any_mimetic_label():
    rows = [row("timm", 0, 40.0), row("mimetic[base=kaiming]", 0, 45.0), row("impulse", 0, 47.0)]
    table = results_markdown(rows, wide=True)
    assert "| gain over timm | gain over mimetic[base=kaiming] |" in table
    assert table.splitlines()[4].startswith("| impulse |") and table.splitlines()[4].endswith("| +7.00 | +2.00 |")
    assert "margin over mimetic[base=kaiming] ± s.e." in table  # the best baseline, whatever its options


def test_per_class_tells_the_truth_under_a_validation_split():
    table = results_markdown([row("timm", 0, 40.0, split="val", val_per_class=50)])
    assert "the training images less 50 per class held out for validation" in table
    assert "| validation images |" in table and "all" not in table.split("\n")[0]


def test_a_non_impulse_init_report_prints_no_offset_column(capsys):
    assert main(["init", "vit_digits", "--model-kwargs", "depth=2", "--init", "mimetic[base=kaiming]"]) == 0
    text = capsys.readouterr().out
    assert "(+0,+0)" not in text and "largest share on one offset (no offsets assigned)" in text
    assert main(["init", "vit_digits", "--model-kwargs", "depth=2", "--init", "impulse"]) == 0
    assert "offset (dy,dx) fidelity" in capsys.readouterr().out
    measured = Report("measured", "m", [LayerReport(0, [HeadReport((1, 0), 0.5, assigned=False)])])
    assert "(+1,+0) 0.500" in str(measured)  # a measurement's best offset is its finding


def test_the_attention_command_draws_the_pseudo_input_maps_whose_shares_are_the_inits_fidelity(tmp_path, figures):
    """`attention --pseudo-input` of an impulse init: each panel's share is the head's fidelity that the
    init reported (impulse's maps on the pseudo input), far above the same heads' share on images."""
    import structinit
    from structinit.models import create_model

    args = ["attention", "vit_digits", "--init", "impulse", "--data", "digits", "--images", "16"]
    assert main([*args, "--pseudo-input", "--out", str(tmp_path / "pseudo.png")]) == 0
    assert main([*args, "--out", str(tmp_path / "images.png")]) == 0
    pseudo, images = figures
    model = create_model("vit_digits", num_classes=10, in_chans=1, data_size=8)
    report = structinit.initialize(model, "impulse", seed=0)
    shares = [float(ax.get_title().rsplit(" ", 1)[1]) for ax in pseudo.axes if ax.get_title().startswith("h")]
    assert shares == pytest.approx([h.fidelity for layer in report.layers for h in layer.heads], abs=0.006)
    on_images = [float(ax.get_title().rsplit(" ", 1)[1]) for ax in images.axes if ax.get_title().startswith("h")]
    assert min(shares) > 0.5 > 0.05 > max(on_images)  # 0.64 (the paper's solve on this model) and 0.02
    assert "attention on the pseudo input (no image)" in " ".join(pseudo._suptitle.get_text().split())
