"""The figures: one colour per init in every figure, never averaging across cells, labelled bands
and seed counts, summary bars, and attention panels titled with their offset and fidelity."""

import matplotlib.pyplot as plt
import pytest
import torch

from structinit.inspection import attention
from structinit.offsets import target_indices
from structinit.report import best_offsets
from structinit.studies import plots


def row(init, seed, top1, recipe="r1", per_class=200, reached=3):
    curve = [(1, top1 / 2), (2, top1)]
    return dict(
        dataset="cifar10", model="vit", heads=6, per_class=per_class, epochs=2, split="test", recipe=recipe,
        init=init, seed=seed, top1=top1, curve=curve, loss_curve=[(1, 2.0), (2, 1.0)], epochs_to_timm=reached,
    )  # fmt: skip


@pytest.fixture
def figures(monkeypatch):
    """The figures a plotting call made, kept open to be read."""
    made, close = [], plt.close
    monkeypatch.setattr(plots.plt, "close", made.append)
    yield made
    for fig in made:
        close(fig)


def test_an_init_keeps_its_colour_whatever_else_the_grid_holds():
    assert plots.init_colour("timm") == "tab:blue" and plots.init_colour("impulse") == "tab:green"
    label = "impulse[target_fidelity=0.3]"
    assert plots.init_colour(label) == plots.init_colour(label) in plots.OTHER_COLOURS


def test_curves_never_average_across_recipes_and_count_seeds(tmp_path, figures):
    rows = [row("timm", s, 40 + s) for s in range(3)] + [row("impulse", 0, 45)]
    rows += [row("timm", s, 30, recipe="r2") for s in range(2)]
    plots.plot_curves(rows, tmp_path / "curves.png")
    (fig,) = figures
    top = [ax for ax in fig.axes if ax.get_ylabel().endswith("top-1 (%)")]
    assert len(top) == 2 and "recipe r1" in top[0].get_title() and "recipe r2" in top[1].get_title()
    loss = [ax for ax in fig.axes if ax.get_ylabel() == "training loss"]
    legend = loss[0].get_legend()  # below the panels
    assert [t.get_text() for t in legend.get_texts()] == ["impulse (1 seed)", "timm (3 seeds)"]
    assert legend.get_title().get_text() == "mean; band: ±1 std over seeds"
    lines = {line.get_label(): line.get_color() for line in top[0].get_lines()}
    assert lines == {"impulse (1 seed)": "tab:green", "timm (3 seeds)": "tab:blue"}
    assert (tmp_path / "curves.png").stat().st_size > 0


def test_summary_bars_have_error_bars_and_say_who_never_reached(tmp_path, figures):
    rows = [row("timm", s, 40 + 2 * s) for s in range(3)] + [row("impulse", s, 45, reached=None) for s in range(2)]
    plots.plot_summary(rows, tmp_path / "summary.png")
    (fig,) = figures
    final, epochs = fig.axes
    heights = [bar.get_height() for bar in final.patches]
    assert heights == pytest.approx([42.0, 45.0])  # timm first, then the others
    assert len(final.collections) >= 2  # the seeds as dots
    assert [t.get_text() for t in epochs.texts] == ["3/3 reached", "never reached"]
    assert (tmp_path / "summary.png").stat().st_size > 0


def test_attention_panels_share_one_scale_and_name_offset_and_fidelity(tmp_path, figures):
    grid, heads = (4, 4), 2
    maps = []
    for offset in ((0, 1), (1, 0)):
        target, valid = target_indices([offset] * heads, grid)
        m = torch.full((heads, 16, 16), 0.1 / 15)
        rows = torch.arange(16)
        for h in range(heads):
            m[h, rows[valid[h]], target[h, valid[h]]] = 0.9 * (1 + offset[0])  # layer 2 peaks higher
        maps.append(m)
    reports = [best_offsets(m.unsqueeze(0), 3, grid, 0) for m in maps]
    attention.plot_attention(maps, grid, tmp_path / "a.png", "title", heads=reports)
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.images[0].get_clim() for ax in panels] == [(0.0, 1.0)] * 4  # one colour scale
    assert [ax.get_title() for ax in panels[:2]] == [f"h0 (+0,+1) share {reports[0][0].fidelity:.2f}", "h1 (+0,+1) "
                                                      f"share {reports[0][1].fidelity:.2f}"]  # fmt: skip
    assert panels[0].get_ylabel() == "layer 0\nquery token" and panels[-1].get_xlabel() == "key token"
    assert any(ax.get_ylabel() == "attention weight" for ax in fig.axes)  # the colourbar


def test_no_two_inits_of_a_figure_share_a_colour_and_each_keeps_its_own_where_free():
    labels = [f"impulse[target_fidelity=0.{i:02d}]" for i in range(1, 40)]
    by_colour = {}
    for label in labels:
        by_colour.setdefault(plots.init_colour(label), []).append(label)
    pair = next(sorted(same)[:2] for same in by_colour.values() if len(same) > 1)  # two labels' own colours clash
    colours = plots.figure_colours(["timm", *pair, "timm"])
    assert colours["timm"] == "tab:blue" and len(set(colours.values())) == 3
    assert colours[pair[0]] == plots.init_colour(pair[0]) != colours[pair[1]]  # the first in order keeps its own
    many = labels[: len(plots.OTHER_COLOURS)]
    assert len(set(plots.figure_colours(many).values())) == len(many)
