"""The regime study (benchmarks/study_regimes.py) and the GPU Table 5 script (benchmarks/gpu_table5.py) in
their --smoke modes, the calibration rule, and the re-solve of the ICLR code's impulse (iclr_impulse.py)."""

import csv
import json
import types

import pytest
import torch

from conftest import BENCHMARKS, load_benchmark, make_imagefolder


def test_gpu_table5_smoke_trains_its_inits_on_shared_batches_and_writes_its_ledger(tmp_path):
    table5 = load_benchmark("gpu_table5")
    assert table5.main(["--smoke", "--quiet", "--out", str(tmp_path / "all")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "all" / "ledger.jsonl").read_text().splitlines()]
    assert [(x["init"], x["epoch"]) for x in lines] == [(i, e) for e in (1, 2) for i in table5.INITS]
    assert all(0 <= x["test_top1"] <= 100 and x["img_per_s"] > 0 for x in lines)
    summary = json.loads((tmp_path / "all" / "summary.json").read_text())
    assert set(summary["results"]) == set(table5.INITS) and summary["epochs_done"] == 2
    assert summary["recipe"]["batch_size"] == 20 and (tmp_path / "all" / "curves.png").stat().st_size > 0
    assert set(summary["qk_norm"]) == set(table5.INITS) and summary["seed"] == 0
    # a member's training does not depend on the others: timm alone follows the same numbers
    assert table5.main(["--smoke", "--quiet", "--inits", "timm", "--out", str(tmp_path / "one")]) == 0
    alone = [json.loads(line) for line in (tmp_path / "one" / "ledger.jsonl").read_text().splitlines()]
    keys = ("epoch", "train_loss", "test_top1")
    timm = [tuple(x[k] for k in keys) for x in lines if x["init"] == "timm"]
    assert [tuple(x[k] for k in keys) for x in alone] == timm


def row(grid, init, seed, top1):
    return {"grid": grid, "init": init, "seed": seed, "top1": top1}


def test_calibration_needs_mimetic_over_kaiming_by_1_5_and_over_timm_by_1_on_both_seeds():
    study = load_benchmark("study_regimes")
    regimes = {"r": study.REGIMES[study.CANDIDATES[0]]}
    mimetic = study.CALIBRATION_INITS[2]
    rows = [row("r-val", "kaiming", s, 50.0) for s in (0, 1)] + [row("r-val", "timm", s, 50.5) for s in (0, 1)]
    rows.append(row("r-val", mimetic, 0, 51.6))
    assert "pending (5/6 runs)" in study.calibration(rows, regimes)
    assert "| - | - | pending (4/6 runs) |" in study.calibration(rows[:4], regimes)  # no mimetic yet
    met = study.calibration([*rows, row("r-val", mimetic, 1, 51.4)], regimes)  # mean 51.5: +1.5, +1.0
    assert met.strip().splitlines()[-1].endswith("| **yes** |")
    short = study.calibration([*rows, row("r-val", mimetic, 1, 51.3)], regimes)
    assert short.strip().splitlines()[-1].endswith("| no |")


def test_regime_study_smoke_calibrates_on_validation_and_resumes_from_its_ledger(tmp_path, capsys):
    study = load_benchmark("study_regimes")
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=["a", "b", "c"])
    args = ["--smoke", "--data", f"imagefolder:{data}", "--out", str(tmp_path / "out"), "--jobs", "1"]
    assert study.main(args) == 0
    docs = tmp_path / "out" / "docs"
    with open(docs / "regimes.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == study.CSV_COLUMNS
    assert sorted((r["init"], r["seed"]) for r in rows) == sorted(
        (i, str(s)) for i in study.CALIBRATION_INITS for s in study.CALIBRATION_SEEDS
    )
    assert {(r["regime"], r["split"], r["tokens"], r["per_class"]) for r in rows} == {("smoke", "val", "256", "4")}
    text = (docs / "studies" / "regimes.md").read_text()
    assert "### Calibration" in text and "### Attention at init\n\nSeed 0, on the smoke model" in text
    assert "(seed 0 / seed 1):\n\n| regime |" in text  # the calibration's own table under its heading
    norm = study.matched_norm(study.SMOKE_REGIME, f"imagefolder:{data}")
    section = text.split("### Attention at init")[1].split("\n### ")[0]  # results tables also start rows with an init
    at_init = {
        line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in section.splitlines() if line.startswith("| ")
    }
    assert {*study.main_inits(norm), *study.ablation_inits(norm), *study.SEARCH_INITS} <= set(at_init)  # run or not
    assert float(at_init[study.BUNDLE][1]) >= 0.97 and float(at_init["kaiming"][0]) > 0.95  # solved on the pseudo input
    qk_alone = at_init[study.on_base("impulse[pos_scale=None,vproj=keep]", "timm")]
    assert float(at_init["kaiming"][1]) < 0.01 and float(qk_alone[3]) > 0.5
    fresh = ["--smoke", "--data", f"imagefolder:{data}", "--out", str(tmp_path / "fresh"), "--docs", str(docs)]
    capsys.readouterr()
    assert study.main(fresh) == 0  # a checkout without run directories trains nothing the ledger holds
    assert "calibrate: 0 of 6 runs to train" in capsys.readouterr().out
    assert study.main([*args, "--part", "compare", "--only", "timm", "--threads", "1"]) == 0  # one init's runs, first
    timm_run = next((tmp_path / "out").glob("smoke/*/timm-seed0/config.yaml")).read_text()
    assert "torch_threads: 1\n" in timm_run  # beside another grid on a 2-core CPU, as every run so far
    compared, searches = len(study.main_inits(norm)), len(study.SEARCH_INITS)  # one smoke seed each
    assert f"compare: 1 of {compared} runs to train" in capsys.readouterr().out
    for part, todo in (
        ("compare", f"{compared - 1} of {compared}"),
        ("ablate", "8 of 8"),  # x18 is a no-op on a sin-cos table: not trained; the close pair's second seed
        ("search", f"{searches} of {searches}"),
    ):
        assert study.main([*args, "--part", part]) == 0
        assert f"{part}: {todo} runs to train" in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        study.main([*args, "--part", "compare", "--only", "xavier"])
    assert stop.value.code == 2 and "--only: xavier is not an init of --part compare (" in capsys.readouterr().err
    with open(docs / "regimes.csv") as f:
        rows = list(csv.DictReader(f))
    tested = {r["init"] for r in rows if r["split"] == "test"}
    second = {r["init"] for r in rows if r["seed"] == "1" and r["split"] == "test"}
    assert second == set(study.close_parts(norm))  # the ablation's second seed where close
    searched = {(r["init"], r["seed"]) for r in rows if r["init"] in study.SEARCH_INITS and r["split"] == "val"}
    assert searched == {(i, "0") for i in study.SEARCH_INITS}  # chosen among on the validation split
    # of the search's candidates only the choice goes to the test set, with its norm-matched control
    assert tested & set(study.SEARCH_INITS) == {*study.SEARCH_CHOICE, study.SOFT_CONTROLS[0]}
    assert set(study.SOFT_CONTROLS) <= tested
    repeats = {f"qk-norm[norm=None,pos_scale=18,base={base}]" for base in ("timm", "kaiming")}
    assert study.repeats_its_base(study.SMOKE_REGIME, f"imagefolder:{data}", norm) == repeats
    assert tested == {*study.main_inits(norm), *study.ablation_inits(norm)} - repeats
    assert "qk-norm[norm=None,vproj=mimetic,base=kaiming]" in tested  # V/proj alone, on the authors' base
    assert "### The bundle, one part at a time" in (docs / "studies" / "regimes.md").read_text()


def test_bundle_table_sets_each_part_against_the_plain_init_of_its_base():
    study = load_benchmark("study_regimes")
    parts = study.bundle_parts(7.0)
    rows = [row("g", "timm", 0, 50.0), row("g", "kaiming", 0, 52.0), row("g", "timm", 1, 99.0)]
    rows += [row("g", study.on_base(parts["the V/proj form (mimetic)"], "kaiming"), 0, 53.5)]
    rows += [row("g", study.on_base(parts["the impulse Q/K"], "timm"), 0, 49.0)]
    rows += [row("other", study.on_base(parts["the Q/K norm (7.0)"], "timm"), 0, 60.0)]  # another grid
    lines = study.bundle_table(rows, "g", 7.0).strip().splitlines()
    assert lines[2:] == [
        "| the impulse Q/K | 49.00 | -1.00 | - | - |",
        "| the V/proj form (mimetic) | - | - | 53.50 | +1.50 |",
    ]
    assert study.bundle_table(rows[:3], "g", 7.0) == ""
    repeats = {study.on_base(parts["the position-embedding scale (x18)"], "kaiming")}  # its init is kaiming's
    line = study.bundle_table(rows[:3], "g", 7.0, repeats).strip().splitlines()[-1]
    assert line == "| the position-embedding scale (x18) | - | - | 52.00 (its base's init: its run) | +0.00 |"


def test_sizing_prints_a_row_per_size(capsys, monkeypatch):
    study = load_benchmark("study_regimes")
    monkeypatch.setattr(study, "SIZES", [(32, 1, 2, 8)])
    study.sizing(steps=1)
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| 32 | 1 | 2 | 8 | 16 | ") and float(row.split("|")[6]) > 0


def test_gpu_table5_refuses_an_unknown_init_in_one_line(tmp_path, capsys):
    table5 = load_benchmark("gpu_table5")
    with pytest.raises(SystemExit) as stop:
        table5.main(["--smoke", "--inits", "timm,xavier", "--out", str(tmp_path)])
    assert stop.value.code == 2
    assert "--inits: unknown init 'xavier'; choose from" in capsys.readouterr().err
    assert not (tmp_path / "ledger.jsonl").exists()


def fake_table5_run(path, seed, device, tops, epochs=4):
    """An OUT of gpu_table5 with the given last-epoch top-1 per init (evaluated at epochs 2 and 4)."""
    path.mkdir()
    recipe = {"epochs": epochs, "batch_size": 512}
    summary = {"recipe": recipe, "device": device, "seed": seed, "precision": "bfloat16"}
    (path / "summary.json").write_text(json.dumps(summary))
    lines = [
        {"init": init, "epoch": e, "step": 10 * e, "train_loss": 2.0 / e}
        | ({"test_top1": top * e / epochs} if e % 2 == 0 else {})
        for e in range(1, epochs + 1)
        for init, top in tops.items()
    ]
    (path / "ledger.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_gpu_table5_collect_averages_each_init_over_its_seeds_and_lists_repeats_apart(tmp_path):
    table5 = load_benchmark("gpu_table5")
    a = fake_table5_run(tmp_path / "a", 0, "H200", {"kaiming": 74.0, "mimetic": 79.0})
    b = fake_table5_run(tmp_path / "b", 0, "H100", {"kaiming": 75.0, "impulse": 80.0})
    c = fake_table5_run(tmp_path / "c", 1, "H100", {"mimetic": 80.0, "impulse": 78.0})
    # given out of seed order: each init's seeds are listed in order
    assert table5.main(["--collect", str(c), str(a), str(b), "--out", str(tmp_path / "all")]) == 0
    lines = (tmp_path / "all" / "table.md").read_text().splitlines()
    assert lines[2] == "| `mimetic` | 2 | 79.50 ± 0.71 | 0: 79.00 (H200), 1: 80.00 (H100) | 0.500 |"
    assert lines[3] == "| `impulse` | 2 | 79.00 ± 1.41 | 0: 80.00 (H100), 1: 78.00 (H100) | 0.500 |"
    assert lines[4] == "| `kaiming` | 1 | 74.00 | 0: 74.00 (H200) | 0.500 |"  # the first run's seed 0 is kept
    assert lines[-1] == "- `kaiming` seed 0: 74.00 on H200, 75.00 on H100"
    assert (tmp_path / "all" / "curves.png").stat().st_size > 0
    longer = fake_table5_run(tmp_path / "d", 2, "H100", {"kaiming": 76.0}, epochs=6)
    with pytest.raises(SystemExit, match="the runs' recipes differ"):
        table5.collect([a, longer], tmp_path / "all")
    with pytest.raises(SystemExit, match=r"has no summary.json and ledger.jsonl \(not an OUT of this script\)"):
        table5.collect([a, tmp_path], tmp_path / "all")


def test_regimes_csv_has_a_row_per_gpu_table5_run_and_init_with_its_device(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # study_regimes reads the runs with gpu_table5's reader
    study = load_benchmark("study_regimes")
    assert study.table5_rows(tmp_path / "none") == []
    fake_table5_run(tmp_path / "a", 0, "H200", {"kaiming": 74.0, "timm": 72.0, "impulse": 76.0})
    fake_table5_run(tmp_path / "b", 1, "H100", {"impulse": 70.0, "kaiming": 74.0, "mimetic": 73.1})
    fake_table5_run(tmp_path / "c", 0, "H100", {"kaiming": 71.0})  # seed 0 again: one seed, 72.5
    rows = {(r["init"], r["seed"], r["device"]): r for r in study.csv_rows(study.table5_rows(tmp_path), study.REGIMES)}
    assert len(rows) == 7 and rows[("kaiming", 0, "H100")]["final_top1"] == 71.0  # a row per run and init
    fast, slow = rows[("impulse", 0, "H200")], rows[("impulse", 1, "H100")]
    assert (fast["regime"], fast["tokens"], fast["per_class"], fast["split"], fast["device"]) == (
        "table5",
        256,
        5000,
        "test",
        "H200",
    )
    assert (fast["final_top1"], fast["epochs"], fast["steps"], fast["precision"]) == (76.0, 4, 40, "bfloat16")
    assert fast["epochs_to_baseline"] == 4 and slow["epochs_to_baseline"] == ""  # kaiming's 73.25: at 4, never
    assert rows[("mimetic", 1, "H100")]["epochs_to_baseline"] == ""  # 73.1: over the 3 runs' 73.0, under the seeds'


def test_gpu_table5_at_init_reports_each_inits_attention_and_head_qk_norm_untrained(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it measures as study_regimes does
    table5 = load_benchmark("gpu_table5")
    inits = "qk-norm[norm=2.5,base=kaiming],impulse[vproj=keep,base=kaiming,target_fidelity=0.41]"
    assert table5.main(["--smoke", "--at-init", "--inits", inits, "--out", str(tmp_path)]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert rows[0][0] == "| `qk-norm[norm=2.5,base=kaiming]`" and rows[0][5] == "2.5 |"  # the control's norm
    assert float(rows[0][2]) < 0.1 and float(rows[0][1]) > 0.9  # no structure: chance is 1/16 at 16 tokens
    assert rows[1][2] == "0.410" and float(rows[1][1]) < float(rows[0][1])  # the impulse: sharper maps
    assert not (tmp_path / "ledger.jsonl").exists()  # nothing trained


def test_gpu_table5_minutes_fits_the_epochs_to_the_budget_and_stretches_the_schedules_past_warm_up():
    table5 = load_benchmark("gpu_table5")
    from structinit.training import TrainConfig
    from structinit.training.optimizer import create_optimizer, create_schedule

    config = TrainConfig(**table5.RECIPE, data="digits", model="vit_w256_d8_p2_gap_sincos", init="timm")
    member = types.SimpleNamespace(optimizer=create_optimizer(torch.nn.Linear(2, 2), config, torch.device("cpu")))
    member.scheduler = create_schedule(member.optimizer, config, 10)
    warm_up = [member.scheduler._get_lr(t)[0] for t in range(0, 50, 7)]
    fitted = table5.fit_epochs(config, [member], budget_s=600, first_epoch_s=20, steps=10)
    assert fitted.epochs == 28 and fitted.lr == config.lr  # 600 / (20 x 1.05) = 28.6
    assert [member.scheduler._get_lr(t)[0] for t in range(0, 50, 7)] == warm_up  # 5 warm-up epochs: 50 steps
    assert member.scheduler._get_lr(280)[0] == pytest.approx(config.min_lr)  # the cosine ends at the new total
    assert member.scheduler._get_lr(140)[0] == pytest.approx((config.lr + config.min_lr) / 2, rel=0.02)
    assert table5.fit_epochs(config, [member], budget_s=5, first_epoch_s=20, steps=10).epochs == 1


def test_iclr_impulse_solve_resets_columns_to_qs_initial_norm_and_moves_mass_onto_each_offset(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # it reads the regime from study_regimes
    iclr = load_benchmark("iclr_impulse")
    pseudo = iclr.pseudo_input(64, 4)
    q0, k0, offsets = iclr.solve(pseudo, 4, 0, seed=0)
    column = q0.norm(dim=1).mean()
    q, k, again = iclr.solve(pseudo, 4, 101, seed=0)  # reset at step 100, then one Adam step of 1e-4
    assert again == offsets and len(set(offsets)) == 4
    for w in (q, k):
        assert torch.allclose(w.norm(dim=1), column.expand_as(w.norm(dim=1)), atol=1e-3)
    chance = 1 / 256
    assert abs(iclr.pseudo_mass(pseudo, q0, k0, offsets) - chance) < 0.3 * chance
    assert iclr.pseudo_mass(pseudo, *iclr.solve(pseudo, 4, 400, seed=0)[:2], offsets) > 3 * chance


def test_the_search_choice_joins_the_comparison_right_after_the_papers_form(monkeypatch):
    study = load_benchmark("study_regimes")
    assert study.main_inits(7.0)[1 : 1 + len(study.SEARCH_CHOICE)] == study.SEARCH_CHOICE
    monkeypatch.setattr(study, "SEARCH_CHOICE", ["impulse[vproj=keep]"])
    assert study.main_inits(7.0)[:3] == [study.BUNDLE, "impulse[vproj=keep]", study.MIMETIC]


def test_attention_table_measures_an_init_again_only_when_its_weights_change(tmp_path, monkeypatch):
    study = load_benchmark("study_regimes")
    data = f"imagefolder:{make_imagefolder(tmp_path / 'images', 32, per_class=2, classes=['a', 'b'])}"
    cache, measured = tmp_path / "attention.json", []
    measure = study.attention_at_init
    monkeypatch.setattr(study, "attention_at_init", lambda *a: measured.append(1) or measure(*a))
    table = study.init_attention(["timm", "impulse"], study.SMOKE_REGIME, data, True, cache)
    assert len(measured) == 2 and len(json.loads(cache.read_text())) == 2
    assert study.init_attention(["impulse", "timm"], study.SMOKE_REGIME, data, True, cache).splitlines()[2:] == [
        table.splitlines()[3],
        table.splitlines()[2],
    ]
    assert len(measured) == 2  # both read from the cache, rows unchanged
    study.init_attention(["impulse[target_fidelity=0.5]"], study.SMOKE_REGIME, data, True, cache)
    assert len(measured) == 3  # other weights: measured; the cache keeps this table's entries only
    assert len(json.loads(cache.read_text())) == 1


def test_gpu_table5_refuses_a_link_at_its_ledger_before_it_trains(tmp_path):
    """Its ledger was emptied and appended to through a link (the link's target truncated): refused in one line."""
    table5 = load_benchmark("gpu_table5")
    target = tmp_path / "elsewhere.jsonl"
    target.write_text("not the cell's\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "ledger.jsonl").symlink_to(target)
    with pytest.raises(SystemExit, match=rf"^gpu_table5.py: error: {tmp_path}/out/ledger.jsonl is a link, and struc"):
        table5.main(["--smoke", "--quiet", "--inits", "timm", "--out", str(tmp_path / "out")])
    assert target.read_text() == "not the cell's\n" and sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "ledger.jsonl"
    ]


@pytest.mark.parametrize(
    "damage, message",
    [
        (("summary.json", "{"), r"a/summary.json is damaged \(Expecting property name"),
        (("summary.json", '{"seed": "0"}'), r"a/summary.json is damaged \(its 'device' is missing\)"),
        (("ledger.jsonl", '{"init": "timm"'), r"a/ledger.jsonl line 1 is damaged \(not JSON\)"),
        (("ledger.jsonl", '{"init": "timm", "epoch": 1}\n'), r"a/ledger.jsonl line 1 is damaged \(its 'step' is miss"),
        (
            ("ledger.jsonl", '{"init": "timm", "epoch": 1, "step": 5, "train_loss": 2}\n'),
            "a/ledger.jsonl holds no evaluated epoch of timm",
        ),
    ],
)
def test_gpu_table5_collect_names_a_damaged_run_in_one_line_and_writes_nothing(tmp_path, damage, message):
    table5 = load_benchmark("gpu_table5")
    run = fake_table5_run(tmp_path / "a", 0, "H200", {"kaiming": 74.0})
    (run / damage[0]).write_text(damage[1])
    with pytest.raises(SystemExit, match=rf"^gpu_table5.py: error: {tmp_path}/{message}"):
        table5.main(["--collect", str(run), "--out", str(tmp_path / "all")])
    assert not (tmp_path / "all").exists()


def test_attention_table_measures_again_what_a_damaged_cache_holds_and_says_so(tmp_path, monkeypatch, capsys):
    study = load_benchmark("study_regimes")
    data = f"imagefolder:{make_imagefolder(tmp_path / 'images', 32, per_class=2, classes=['a', 'b'])}"
    cache, measured = tmp_path / "attention.json", []
    measure = study.attention_at_init
    monkeypatch.setattr(study, "attention_at_init", lambda *a: measured.append(1) or measure(*a))
    table = study.init_attention(["timm"], study.SMOKE_REGIME, data, True, cache)
    kept = json.loads(cache.read_text())
    key = next(iter(kept))
    for damaged in ("[", "[]", json.dumps({key: {**kept[key], "entropy": "high"}})):
        cache.write_text(damaged)
        assert study.init_attention(["timm"], study.SMOKE_REGIME, data, True, cache) == table  # measured again
        assert json.loads(cache.read_text()) == kept
    assert len(measured) == 4
    notes = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[-1] for line in notes] == ["the attention at init is measured again"] * 2
    assert f"{cache} is not JSON (Expecting value" in notes[0] and f"{cache} is not a JSON object" in notes[1]
