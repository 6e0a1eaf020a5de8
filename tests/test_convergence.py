"""The convergence study's building blocks: validation split, time to accuracy, parallel grids,
V/proj left alone, weight snapshots, and the study script's --smoke mode."""

import copy
import csv
import json
import re

import pytest
import torch
import yaml

import structinit
from conftest import assert_same_final_weights, grid_rows, load_benchmark, make_imagefolder
from structinit.cli import main
from structinit.data.datasets import load_data
from structinit.data.subsets import stratified_split, stratified_subset
from structinit.inits.labels import BUNDLE
from structinit.measure import mean_attention
from structinit.studies.grid import run_dir
from structinit.studies.results import epochs_to_reach, time_to_accuracy
from structinit.studies.tables import results_markdown
from structinit.training import TrainConfig, train

FAST = dict(data="digits", per_class=20, model="vit_digits", model_kwargs={"depth": 1}, batch_size=50, quiet=True)


# --- the validation split ----------------------------------------------------------------------


def test_validation_split_is_stratified_disjoint_and_deterministic():
    labels = load_data("digits").train_labels
    train_idx, val_idx = stratified_split(labels, 20, None, 15, seed=0)
    assert torch.bincount(labels[train_idx]).tolist() == [20] * 10
    assert torch.bincount(labels[val_idx]).tolist() == [15] * 10
    assert not set(train_idx.tolist()) & set(val_idx.tolist())
    again = stratified_split(labels, 20, None, 15, seed=0)
    assert torch.equal(again[0], train_idx) and torch.equal(again[1], val_idx)
    other = stratified_split(labels, 20, None, 15, seed=1)
    assert not torch.equal(other[1], val_idx)
    # the training subset does not depend on whether a validation split is carved out
    assert torch.equal(train_idx, stratified_subset(labels, 20, None, seed=0))
    # without a subset, the validation images leave the training set
    everything, held = stratified_split(labels, None, None, 15, seed=0)
    assert len(everything) + len(held) == len(labels) and not set(everything.tolist()) & set(held.tolist())


@pytest.mark.parametrize(
    "per_class,val,message",
    [
        (None, 0, "--val-per-class must be >= 1"),
        (100, 100, "class '0' has 142 training images, too few for 100 training and 100 validation"),
        (None, 142, "too few for 1 training and 142 validation images"),
    ],
)
def test_impossible_validation_splits_are_refused(per_class, val, message):
    with pytest.raises(ValueError, match=message):
        load_data("digits", per_class=per_class, val_per_class=val)


def test_a_run_with_a_validation_split_never_touches_the_test_set(tmp_path, monkeypatch):
    """It evaluates on the held-out training images (val_* metrics) and trains exactly what the run
    without the split trains: the same subset, the same weights."""
    seen = []
    real = structinit.training.run.evaluate

    def spy(model, batches, device, world, amp, split="test"):
        batches = list(batches)
        seen.append((split, sum(len(y) for _, y in batches)))
        return real(model, iter(batches), device, world, amp, split)

    monkeypatch.setattr(structinit.training.run, "evaluate", spy)
    summary = train(TrainConfig(**FAST, epochs=2, val_per_class=30, out=str(tmp_path / "val")))
    assert seen == [("val", 300), ("val", 300)]
    assert "val_top1" in summary and "test_top1" not in summary
    train(TrainConfig(**FAST, epochs=2, out=str(tmp_path / "test")))
    assert seen[2:] == [("test", 360), ("test", 360)]
    a = torch.load(tmp_path / "val" / "last.pt", map_location="cpu", weights_only=False)["model"]
    b = torch.load(tmp_path / "test" / "last.pt", map_location="cpu", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


# --- time to accuracy --------------------------------------------------------------------------


def test_epochs_to_reach_is_the_first_evaluated_epoch_at_or_above_the_target():
    curve = [(10, 30.0), (5, 20.0), (15, 45.0), (20, 44.0)]
    assert epochs_to_reach(curve, 30.0) == 10  # reaching counts; the curve need not be sorted
    assert epochs_to_reach(curve, 44.5) == 15
    assert epochs_to_reach(curve, 45.1) is None
    assert epochs_to_reach([], 1.0) is None


def row(init, seed, top1, curve, per_class=200, split="test"):
    return dict(
        dataset="c", model="m", heads=6, per_class=per_class, epochs=20, split=split, init=init, seed=seed,
        top1=top1, best_top1=max(t for _, t in curve), top5=90.0, train_loss=1.0, curve=curve,
    )  # fmt: skip


def test_time_to_accuracy_uses_the_mean_final_top1_of_timm_in_the_same_cell():
    rows = [
        row("timm", 0, 40.0, [(10, 35.0), (20, 40.0)]),
        row("timm", 1, 44.0, [(10, 41.0), (20, 44.0)]),  # timm's mean final: 42
        row("impulse", 0, 43.0, [(10, 42.0), (20, 43.0)]),
        row("impulse", 1, 41.0, [(10, 38.0), (20, 41.0)]),
        row("impulse", 0, 50.0, [(10, 50.0), (20, 50.0)], per_class=500),  # a cell without timm
        row("timm", 0, 10.0, [(10, 10.0), (20, 10.0)], split="val"),  # another split: another cell
    ]
    time_to_accuracy(rows)
    assert [r.get("epochs_to_timm", "absent") for r in rows] == [None, 20, 10, None, "absent", 10]
    cells = results_markdown(rows, wide=True).split("**c**")[1:]
    assert [cell.split("\n")[0] for cell in cells] == [
        ", m, 6 heads, 200 training images per class, 20 epochs",
        ", m, 6 heads, 200 training images per class, 20 epochs",
        ", m, 6 heads, 500 training images per class, 20 epochs",
    ]
    assert "| validation images |" in cells[1] and "| test images |" in cells[0]  # not averaged with the test runs
    assert "| impulse | 2 | 42.00 ± 1.41 | +0.00 ± 2.24 | - | 42.00 | 10, 1 of 2 runs |" in cells[0]
    assert "| timm | 2 | 42.00 ± 2.83 | (the best baseline) | - | 42.00 | 20, 1 of 2 runs |" in cells[0]
    assert "| timm | 1 | 10.00 |" in cells[1]
    assert "| impulse | 1 | 50.00 | - | - | 50.00 | - |" in cells[2]


def test_runs_kept_without_curves_count_in_means_but_have_no_time_to_accuracy():
    """Results recorded without their curves (curve None, no top-5): their final top-1 moves timm's
    mean and the cell's mean, but no time is guessed for them and means of what they lack say so."""
    lost = dict(row("timm", 1, 44.0, [(20, 44.0)]), curve=None, top5=None)
    rows = [
        row("timm", 0, 40.0, [(10, 35.0), (20, 40.0)]),
        lost,  # timm's mean final: 42
        row("impulse", 0, 43.0, [(10, 42.0), (20, 43.0)]),
    ]
    time_to_accuracy(rows)
    assert [r.get("epochs_to_timm", "absent") for r in rows] == [None, "absent", 10]
    table = results_markdown(rows, wide=True)
    assert (
        "| timm | 2 | 42.00 ± 2.83 | (the best baseline) | - | 42.00 | never, 0 of 1 run | 90.00 (of 1 runs) |" in table
    )
    assert "| impulse | 1 | 43.00 | +1.00 | - | 43.00 | 10, 1 of 1 run | 90.00 | 1.000 | +1.00 |" in table


# --- grids, init options, snapshots --------------------------------------------------------------


def test_a_parallel_grid_gives_the_rows_of_a_sequential_one_bit_for_bit(tmp_path, capsys):
    """--parallel 2 (one thread per run on 2 cores) against a sequential grid at one thread per run:
    the same results.csv but for the clock, and the same weights."""
    common = ["compare", "--per-class", "10", "--model-kwargs", "depth=2", "--batch-size", "50", "--epochs", "2"]
    common += ["--inits", "timm,impulse", "--seeds", "0,1"]
    assert main([*common, "--parallel", "2", "--out", str(tmp_path / "par")]) == 0
    assert main([*common, "--threads", "1", "--out", str(tmp_path / "seq")]) == 0
    out = capsys.readouterr().out
    assert "4 runs; results.csv" in out

    assert grid_rows(tmp_path / "par") == grid_rows(tmp_path / "seq") and len(grid_rows(tmp_path / "par")) == 4
    assert_same_final_weights(tmp_path / "seq", tmp_path / "par")


def test_vproj_keep_leaves_value_and_projection_as_they_were(make_vit):
    model = make_vit()
    structinit.initialize(model, "timm", seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    report = structinit.initialize(model, BUNDLE, seed=0, vproj="keep")
    dim = model.embed_dim
    for i, block in enumerate(model.blocks):
        qkv = block.attn.qkv.weight
        assert torch.equal(qkv[2 * dim :], before[f"blocks.{i}.attn.qkv.weight"][2 * dim :])
        assert torch.equal(block.attn.proj.weight, before[f"blocks.{i}.attn.proj.weight"])
        assert not torch.equal(qkv[:dim], before[f"blocks.{i}.attn.qkv.weight"][:dim])
    assert report.min_fidelity >= 0.97 and report.options["vproj"] == "keep"
    with pytest.raises(ValueError, match="vproj"):
        structinit.initialize(make_vit(), BUNDLE, seed=0, vproj="zero")


def test_scale_content_gives_the_grown_embeddings_first_layer_maps_on_images_from_small_weights(make_vit, images):
    grown = make_vit()
    shrunk = copy.deepcopy(grown)
    structinit.initialize(grown, BUNDLE, seed=0)
    report = structinit.initialize(shrunk, BUNDLE, seed=0, scale="content")
    assert report.options["scale"] == "content" and report.min_fidelity >= 0.97
    # the position embedding keeps timm's scale: the patch projection and class token carry the ratio
    factor = grown.pos_embed.detach().std() / shrunk.pos_embed.detach().std()
    assert float(factor) == pytest.approx(18, rel=0.15)
    assert torch.allclose(grown.pos_embed, shrunk.pos_embed * factor)
    for name in ("patch_embed.proj.weight", "patch_embed.proj.bias", "cls_token"):
        assert torch.allclose(shrunk.get_parameter(name) * factor, grown.get_parameter(name)), name
    # every token is the default's divided by the factor, which layer 0's norm sees only through its eps
    first_grown, *deeper_grown = mean_attention(grown, images)
    first_shrunk, *deeper_shrunk = mean_attention(shrunk, images)
    assert torch.allclose(first_shrunk, first_grown, atol=2e-3)
    assert float(first_grown.max()) > 0.3  # the impulse reaches the images in both
    # the blocks' outputs weigh more against the smaller stream: deeper layers are not the default's
    assert not torch.allclose(deeper_shrunk[0], deeper_grown[0], atol=1e-2)
    # without pos_scale there is no ratio to reach: nothing but attention changes
    plain = make_vit()
    structinit.initialize(plain, "timm", seed=0)
    before = plain.patch_embed.proj.weight.clone()
    structinit.initialize(plain, BUNDLE, seed=0, scale="content", pos_scale=None)
    assert torch.equal(plain.patch_embed.proj.weight, before)


def test_scale_content_needs_a_linear_patch_embedding(make_vit):
    model = make_vit()
    model.patch_embed.norm = torch.nn.LayerNorm(model.embed_dim)
    with pytest.raises(ValueError, match="scale=content divides the patch projection, and this model's patch"):
        structinit.initialize(model, BUNDLE, seed=0, scale="content")
    with pytest.raises(ValueError, match="scale"):
        structinit.initialize(make_vit(), BUNDLE, seed=0, scale="patch")


def test_snapshots_keep_the_weights_at_init_and_after_the_chosen_epochs(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=3, snapshot_epochs=[0, 2], out=str(out)))
    names = sorted(p.name for p in (out / "snapshots").iterdir())
    assert names == ["epoch_0000.pt", "epoch_0002.pt"]
    final = torch.load(out / "last.pt", map_location="cpu", weights_only=False)["model"]
    at_init = torch.load(out / "snapshots" / "epoch_0000.pt", map_location="cpu", weights_only=True)
    assert set(at_init) == set(final) and not torch.equal(at_init["pos_embed"], final["pos_embed"])
    with pytest.raises(ValueError, match=r"--snapshot-epochs must lie in 0..3"):
        TrainConfig(**FAST, epochs=3, snapshot_epochs=[4])


# --- the study script ----------------------------------------------------------------------------


def test_early_and_final_compare_each_init_with_timm_at_300_steps_and_at_the_end():
    study = load_benchmark("study_convergence")

    def row(init, seed, curve, per_class=200):  # 31 steps an epoch: epoch 10 is the nearest to 300 steps
        return dict(init=init, seed=seed, per_class=per_class, epochs=100, steps=3100, curve=curve, top1=curve[-1][1])

    rows = [
        row("timm", 0, [(5, 20.0), (10, 30.0), (100, 50.0)]),
        row("timm", 1, [(5, 22.0), (10, 32.0), (100, 52.0)]),
        row("impulse", 0, [(5, 30.0), (10, 36.0), (100, 47.0)]),
    ]
    assert study.early(rows[0]) == (10, 30.0)
    table = study.early_and_final(rows)
    assert "| 200 | timm | 2 | 31.00 (10) | 51.00 | - | - |" in table
    assert "| 200 | impulse | 1 | 36.00 (10) | 47.00 | +5.00 | -4.00 |" in table


def test_acceptance_checks_the_issue_goals_on_seed_means_and_says_pending_until_all_seeds_ran():
    study = load_benchmark("study_convergence")
    chosen = study.CHOSEN[0]
    grids = [
        study.Grid(
            "light",
            6,
            200,
            ["timm", "mimetic", BUNDLE, chosen, *study.CONTROL],
            [0, 1],
        ),
        study.Grid(
            "light",
            6,
            500,
            ["timm", "mimetic", BUNDLE],
            [0, 1],
        ),
    ]

    def row(init, seed, top1, per_class=200, reached=None):
        return dict(grid="light-h6", per_class=per_class, init=init, seed=seed, top1=top1, epochs=100,
                    epochs_to_timm=reached, curve=[(100, top1)])  # fmt: skip

    rows = [
        *(row("timm", s, 50.0 + s) for s in (0, 1)),  # mean 50.5
        *(row("mimetic", s, 52.0) for s in (0, 1)),
        row(BUNDLE, 0, 53.0, reached=30),
        row(BUNDLE, 1, 52.0, reached=50),  # mean 52.5: +2 over timm, above mimetic
        row(chosen, 0, 54.0, reached=60),  # one seed of two
        *(row(study.CONTROL[0], s, 53.0, reached=40) for s in (0, 1)),  # the control gets its own row
        *(row("timm", s, 60.0, per_class=500) for s in (0, 1)),
        *(row("mimetic", s, 61.0, per_class=500) for s in (0, 1)),
        *(row(BUNDLE, s, 59.0 + s, per_class=500) for s in (0, 1)),  # mean 59.5 < timm's 60
    ]
    lines = study.acceptance(rows, grids).splitlines()
    assert lines[2] == (
        "| light-h6 | 200 | 50.50 | 52.00 | impulse[target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep] "
        "| 52.50 ± 0.71 | ≥ timm +2, mimetic | yes | 30, 50 (≤ 50) | yes |"
    )
    assert lines[3].startswith(f"| light-h6 | 200 | 50.50 | 52.00 | {chosen} | 54.00 ± - |")
    assert lines[3].endswith("| yes (pending: 1/2 seeds) | 60 (≤ 50) | no (pending: 1/2 seeds) |")
    assert lines[4] == (
        f"| light-h6 | 200 | 50.50 | 52.00 | {study.CONTROL[0]} | 53.00 ± 0.00 | ≥ timm +2, mimetic | yes "
        "| 40, 40 (≤ 50) | yes |"
    )
    assert lines[5].startswith(f"| light-h6 | 500 | 60.00 | 61.00 | {BUNDLE} | 59.50 ± 0.71 | ≥ timm +0 | no |")
    assert lines[5].endswith("| never, never (≤ 50) | no |")
    assert len(lines) == 6  # the chosen setting and its control have no run at 500: no rows
    # runs whose curves were lost: the speed goal stays open while the others meet it, 'no' once one fails
    lost = {**{k: v for k, v in row(chosen, 1, 54.0).items() if k != "epochs_to_timm"}, "curve": None}
    open_line = study.acceptance([*rows[:4], row(chosen, 0, 54.0, reached=40), lost], grids).splitlines()[2]
    assert open_line.endswith("| yes | 40, lost (≤ 50) | open (curves of 1/2 runs) |")
    failed = study.acceptance([*rows[:4], row(chosen, 0, 54.0, reached=60), lost], grids).splitlines()[2]
    assert failed.endswith("| yes | 60, lost (≤ 50) | no |")
    assert study.acceptance(rows[:2], grids) == ""  # timm alone: nothing to check, no table


def test_decision_applies_the_fixed_rule_and_pairs_the_control_by_seed():
    """The chosen setting becomes the default only if it is at least timm and above the default in every
    cell; the control ties it unless it falls short by more than two standard errors of the paired
    differences."""
    study = load_benchmark("study_convergence")
    chosen, control = study.CHOSEN[0], study.CONTROL[0]
    grids = [
        study.Grid(
            "light",
            6,
            200,
            ["timm", BUNDLE, chosen, control],
            [0, 1],
        ),
        study.Grid(
            "light",
            6,
            500,
            ["timm", BUNDLE, chosen],
            [0, 1],
        ),
    ]

    def row(init, seed, top1, per_class=200):
        return dict(grid="light-h6", per_class=per_class, init=init, seed=seed, top1=top1)

    rows = [
        *(row("timm", s, 50.0) for s in (0, 1)),
        *(row(BUNDLE, s, 49.0) for s in (0, 1)),
        row(chosen, 0, 51.0),
        row(chosen, 1, 52.0),
        row(control, 0, 48.0),  # -3
        row(control, 1, 48.5),  # -3.5: mean -3.25, standard error 0.25
        *(row("timm", s, 60.0, per_class=500) for s in (0, 1)),
        *(row(BUNDLE, s, 60.5, per_class=500) for s in (0, 1)),
        *(row(chosen, s, 60.0, per_class=500) for s in (0, 1)),  # ties timm, below the default
    ]
    assert study.decision(rows, grids).splitlines() == [
        "- The chosen setting minus timm, per cell: light-h6/200 +1.50; light-h6/500 +0.00. "
        "At least timm's in every cell: yes.",
        "- The chosen setting minus the paper's form (impulse), per cell: light-h6/200 +2.50; light-h6/500 -0.50. "
        "Above it in every cell: no (light-h6/500).",
        "- **The chosen setting becomes the default: no**.",
        "- The control minus the chosen setting, paired by cell and seed (2 pairs): -3.25 ± 0.25 (standard "
        "error): the chosen setting is ahead: the impulse structure counts.",
    ]
    # the default's runs at 500 lower: the rule is met; the control one point either side: a tie
    better = [r for r in rows if not (r["init"] == BUNDLE and r["per_class"] == 500)]
    tied = [r if r["init"] != control else {**r, "top1": 52.0 - r["seed"]} for r in better]  # +1, -1
    lines = study.decision([*tied, row(BUNDLE, 0, 59.0, per_class=500)], grids).splitlines()
    assert lines[2] == "- **The chosen setting becomes the default: yes so far** (pending: 1 more run)."
    tie = "the control ties the chosen setting: what wins is the Q/K scale, not the impulse structure"
    assert lines[3].endswith(f"(2 pairs): +0.00 ± 1.00 (standard error): {tie} (pending: 1 more run).")
    assert study.decision([r for r in rows if r["init"] != chosen], grids) == ""  # nothing to decide


def test_smoke_convergence_study_runs_levers_on_validation_and_the_protocol_on_test(tmp_path):
    study = load_benchmark("study_convergence")
    data = make_imagefolder(tmp_path / "images", 32, per_class=12, classes=["a", "b", "c"])
    out = tmp_path / "conv"
    args = ["--smoke", "--data", f"imagefolder:{data}", "--out", str(out), "--jobs", "1"]
    assert study.main([*args, "--part", "levers", "--threads", "1"]) == 0
    trained = list(out.glob("*/*/*/config.yaml"))
    assert trained and all("torch_threads: 1\n" in p.read_text() for p in trained)  # beside another grid
    assert study.main([*args, "--part", "protocol"]) == 0
    with open(out / "docs" / "convergence.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0])[:14] == [
        "grid", "recipe", "dataset", "model", "heads", "per_class", "init", "seed", "epochs", "steps", "split",
        "final_top1", "best_top1", "epochs_to_timm",
    ]  # fmt: skip
    by_grid = {(r["grid"], r["init"]): r for r in rows}
    assert set(by_grid) == {
        ("light-h6-val", "timm"),
        ("light-h6-val", "impulse[target_fidelity=0.7,pos_scale=18.0,vproj=mimetic,base=keep]"),
        ("light-h6", "timm"),
        ("light-h6", BUNDLE),
        ("small-data-h6", "timm"),
        ("small-data-h6", BUNDLE),
    }
    assert {r["split"] for r in rows if r["grid"].endswith("-val")} == {"val"}
    assert {r["split"] for r in rows if not r["grid"].endswith("-val")} == {"test"}
    assert all(r["epochs"] == "2" and r["steps"] == "12" and r["heads"] == "6" for r in rows)  # 2 x 24 images / 4
    assert all(r["epochs_to_timm"] in ("", "1", "2") for r in rows) and by_grid["light-h6", "timm"]["epochs_to_timm"]
    assert {r["precision"] for r in rows} == {"float32"} and all(r["device"] for r in rows)  # fp32 on every CPU
    # the recipes differ as the protocol says: mixing, RandAugment, a warm-up of 1/6 of the run
    run = run_dir(out / "small-data-h6", 8, BUNDLE, 0)
    config = yaml.safe_load((run / "config.yaml").read_text())
    assert config["mixup"] == 0.8 and config["randaugment"] and config["warmup_epochs"] == 0.33
    assert (out / "light-h6" / "per_class_8" / "timm-seed0" / "snapshots" / "epoch_0002.pt").exists()
    text = (out / "docs" / "studies" / "convergence.md").read_text()
    assert (
        "### light-h6-val" in text
        and "| impulse[target_fidelity=0.7,pos_scale=18.0,vproj=mimetic,base=keep] | 1 |" in text
        and "| validation images |" in text
    )
    assert "Plateau" in text and (out / "docs" / "figures" / "convergence-light-h6.png").exists()
    assert "### Acceptance" in text and "| light-h6 | 8 | " in text and "| small-data-h6 | 8 | " in text
    # a rerun trains nothing new
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/*/*/summary.json")}
    assert study.main([*args, "--part", "protocol"]) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*/*/summary.json")} == before

    # the mechanism along training, from the seed-0 snapshots, into its own section of the same file
    mechanism = load_benchmark("bench_mechanism")
    docs = out / "docs"
    with pytest.raises(SystemExit, match="no weight snapshots under"):  # none there: the docs stay
        mechanism.main(["--part", "training", "--runs", str(tmp_path / "nowhere"), "--docs", str(docs)])
    assert mechanism.main(["--part", "training", "--runs", str(out), "--docs", str(docs), "--held-out", "2"]) == 0
    text = (docs / "studies" / "convergence.md").read_text()
    assert "### light-h6-val" in text  # the study's tables stay
    section = text[text.index("<!-- mechanism:begin -->") :]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| light-h6 ")]
    assert [(r[0], r[1]) for r in rows] == [(f"| light-h6 {BUNDLE}", e) for e in "02"] + [
        ("| light-h6 timm", e) for e in "02"
    ]
    impulse, timm = rows[0], rows[2]
    layer0 = float(impulse[2].split(" / ")[0])
    assert layer0 > 0.2 and timm[2] == "-"  # assigned offsets exist for the impulse init only
    assert float(impulse[5]) > 10 * float(timm[5])  # the position embedding x18 against the patches
    assert float(impulse[6]) == pytest.approx(-0.4, abs=0.02) and abs(float(timm[6])) < 0.02  # mimetic V/proj

    # the assigned offsets come from the run's own init record, not from a rebuild by today's code
    record = run_dir(out / "light-h6", 8, BUNDLE, 0) / "init_report.json"
    report = json.loads(record.read_text())
    for head in report["layers"][0]["heads"]:
        head["offset"] = [-o for o in head["offset"]]  # the mirror offset: a key the head does not attend
    record.write_text(json.dumps(report))
    assert mechanism.main(["--part", "training", "--runs", str(out), "--docs", str(docs), "--held-out", "2"]) == 0
    section = (docs / "studies" / "convergence.md").read_text().split("<!-- mechanism:begin -->")[1]
    mirrored = next(line.split(" | ") for line in section.splitlines() if line.startswith(f"| light-h6 {BUNDLE} |"))
    assert float(mirrored[2].split(" / ")[0]) < layer0 / 2

    # the results live in the committed ledger: a fresh checkout (no run directories) trains nothing
    # and makes the same docs; a ledger row from another recipe is refused, not mixed in
    ledger = docs / "convergence-runs.jsonl"
    kept = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(kept) == 6 and all(r["curve"] and r["recipe_hash"] for r in kept)
    tables = (docs / "convergence.csv").read_text()
    fresh = ["--smoke", "--data", f"imagefolder:{data}", "--out", str(tmp_path / "fresh"), "--docs", str(docs)]
    assert study.main([*fresh, "--jobs", "1", "--part", "protocol"]) == 0
    assert not list((tmp_path / "fresh").glob("*/*/*/summary.json"))
    assert (docs / "convergence.csv").read_text() == tables
    changed = next(r for r in kept if (r["grid"], r["init"]) == ("small-data-h6", BUNDLE))
    changed["recipe_hash"] = "0000000000"
    ledger.write_text("".join(json.dumps(r) + "\n" for r in kept))
    with pytest.raises(
        SystemExit,
        match=re.escape(f"holds small-data-h6 8/class {BUNDLE} seed 0 from another recipe or --data"),
    ):
        study.main([*fresh, "--jobs", "1", "--part", "protocol"])
