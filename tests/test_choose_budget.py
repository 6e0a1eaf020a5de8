"""`structinit choose` in a laptop's minutes (issue 76): a one-off solve counted in the budget before it runs, a
refusal that offers what fits here, runs that stop together at the epoch every run can reach, the verdict's own
table and its saved text, and the inits far behind named."""

import csv
import dataclasses
import statistics
import time
import types
from pathlib import Path

import pytest

from structinit.cli import main
from structinit.inits import sharpness
from structinit.studies import choose as choose_module
from structinit.studies import choose_fit, choose_runs
from structinit.studies.choose import STRUCTURED, choose
from structinit.studies.choose_fit import Budget, sized_to, solve_seconds
from structinit.studies.choose_pace import Pace, Timing
from structinit.studies.choose_plan import Plan
from structinit.studies.choose_report import VERDICT_FILE
from structinit.studies.choose_runs import epochs_done, run_configs_of, train_runs
from structinit.studies.grid import run_configs
from structinit.studies.verdict import Evidence, verdict
from structinit.training import TrainConfig
from structinit.training.record import MetricsLog

TINY = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--quiet"]
DIGITS = dict(model="vit_digits", model_kwargs={"depth": 1, "embed_dim": 32, "num_heads": 2}, per_class=10)


# --- the budget first, a solve counted in it ------------------------------------------------------------------


def test_a_one_off_solve_is_counted_in_the_budget_before_it_runs(tmp_path, capsys, monkeypatch):
    """The tiny model's shape is in no table nor cache: its solve, timed at 3 hours here, is refused before it
    runs, in seconds, though the runs alone would fit the 3 minutes."""
    monkeypatch.setenv("STRUCTINIT_CACHE", str(tmp_path / "cache"))
    timed = []
    monkeypatch.setattr(choose_fit, "solve_seconds", lambda *shape: timed.append(shape) or 3 * 3600.0)
    monkeypatch.setattr(sharpness, "_solve", lambda *a: pytest.fail("the solve ran before the budget was checked"))
    started = time.monotonic()
    argv = ["choose", *TINY, "--per-class", "10", "-b", "8", "--val-per-class", "4", "--minutes", "3"]
    assert main([*argv, "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert len(timed) == 1 and time.monotonic() - started < 90
    assert err.startswith("structinit choose: error: too short to compare here: a verdict needs every run to train")
    assert "after a one-off solve of the structured init's sharpness for this model (about 10800 s here; kept" in err
    assert "give --minutes 18" in err and err.count("\n") == 1 and not (tmp_path / "c").exists()


def test_the_solve_is_timed_on_its_first_steps():
    pseudo = sharpness.standard_pseudo("learned", (4, 4), 32, 1e-6)
    started = time.perf_counter()
    seconds = solve_seconds(pseudo, (4, 4), 2, 3)
    assert seconds > 0 and time.perf_counter() - started < 5  # 16 of its 10,000 steps


# --- a refusal offers what fits, from the pace measured here ---------------------------------------------------

# 1 s to start; a step of 1.2 s at batch 128 and 0.1 s at batch 8 (timed here, on the same batches cut)
TIMING = Timing(1.0, 128, 1.2, (8, 0.1), 0.0, 0.0, 0.0)


def _budget(minutes, seeds=(0, 1)):
    base = TrainConfig(batch_size=128, val_per_class=6)
    return Budget(minutes, time.monotonic(), 5, list(seeds), 1, base, [128] * 10, 0)  # 1,280 images, 10 classes


def test_a_refusal_offers_the_smaller_batch_and_the_images_a_class_that_fit_the_minutes():
    with pytest.raises(ValueError) as refused:
        sized_to(_budget(4.0), TIMING)
    message = str(refused.value)
    # batch 128: 10 epochs of 10 steps, 121 s a run, 10 runs in 85 % of the time, and the reserve: 24 minutes
    assert "at least 10 epochs (100 steps: 100 at least, past the warm-up), about 121 s a run" in message
    assert "give --minutes 23.9 or more; or, in 4 minutes here: " in message
    # batch 8: one epoch of 160 steps of 0.1 s, 17 s a run; batch 16 (a step of 0.17 s: the line through the two
    # batches timed) with 80 images a class: 50 steps an epoch, 2 epochs, 18 s a run
    assert message.endswith("-b 8 (about 3.5 minutes), or -b 16 --per-class 80 --val-per-class 6 (about 3.7 minutes)")
    assert "--seeds" not in message  # never fewer than two


def test_a_refusal_of_more_than_two_seeds_offers_two():
    timing = dataclasses.replace(TIMING, step=0.3, small=(8, 0.05))
    with pytest.raises(
        ValueError, match=r"in 9 minutes here: --seeds 0,1 \(about 6\.2 minutes\), or -b 64 \(about 5\.3 minutes\)$"
    ):
        sized_to(_budget(9.0, seeds=(0, 1, 2)), timing)


# --- runs stop together ----------------------------------------------------------------------------------------


def test_no_run_trains_past_the_epoch_every_run_can_reach_and_time_left_brings_them_on_together(tmp_path, monkeypatch):
    """Four runs of 2 epochs, planned at 1 s an epoch, 21 s: the first slows to 4 s an epoch, so the second can
    reach only epoch 1. The others stop there (before, they went on to 2 while the verdict read epoch 1), and the
    time left then brought every run to 2 together."""
    clock, calls = [0.0], []

    def fake_runs(configs, parallel, root, threads=None, lock=True):
        for config in configs:
            index, done = run_index[config.out], len(epochs_done(config))
            Path(config.out).mkdir(parents=True, exist_ok=True)
            for epoch in range(done + 1, (config.stop_after or config.epochs) + 1):
                seconds = 4.0 if index == 0 else 1.0
                clock[0] += seconds
                line = {"epoch": epoch, "step": 12 * epoch, "train_loss": 1.0, "lr": 1e-3, "img_per_s": 1.0}
                line.update(epoch_seconds=seconds, time=clock[0], val_top1=50.0, val_top5=90.0)
                MetricsLog(Path(config.out)).append(line)
            calls.append((index, len(epochs_done(config))))

    plan = Plan([STRUCTURED, "kaiming"], [0, 1], 2, None, STRUCTURED, "kaiming", 10, 4, 8, {}, "0" * 16, 12,
                [0.0, 1.0, 0.0], "m", 1)  # fmt: skip
    configs = run_configs_of(plan, TrainConfig(**DIGITS, batch_size=8, epochs=2), tmp_path / "c")
    run_index = {c.out: i for i, c in enumerate(configs)}
    monkeypatch.setattr(choose_runs, "run_configs", fake_runs)
    monkeypatch.setattr(choose_runs, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    assert train_runs(plan, configs, tmp_path / "c", 1, 21.0, Pace(0.0, 1.0), show=False) == 2
    assert calls == [(0, 2), (1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (3, 2)]


# --- the verdict's table, saved --------------------------------------------------------------------------------


def test_results_md_is_the_verdicts_table_at_its_epoch_and_the_verdict_is_saved(tmp_path, monkeypatch):
    """One run cut at epoch 1 of 2: the verdict reads every run there, and so does results.md (not the finished
    runs at epoch 2); verdict.md keeps what the command said."""

    def one_cut_short(plan, configs, out, parallel, deadline, pace, show):
        run_configs([dataclasses.replace(configs[0], stop_after=1), *configs[1:]], 1, out, threads=1, lock=False)
        return min(len(epochs_done(c)) for c in configs)

    monkeypatch.setattr(choose_module, "train_runs", one_cut_short)
    base = TrainConfig(**DIGITS, batch_size=8, val_per_class=4, quiet=True)
    choice = choose(base, 1.0, [0, 1], tmp_path / "c", epochs=2, show=False, say=lambda line: None)
    assert choice.epoch == 1 and choice.verdict.evidence.steps == 12
    table = (tmp_path / "c" / "results.md").read_text()
    assert table.startswith("`structinit choose`'s table: every run at epoch 1 of the 2 planned, 12 steps, as the")
    rows = list(csv.DictReader((tmp_path / "c" / "results.csv").read_text().splitlines()))
    assert len(rows) == 10 and {(r["epochs"], r["steps"]) for r in rows} == {("1", "12")}
    for init, scores in choice.verdict.scores.items():
        assert statistics.mean(float(r["top1"]) for r in rows if r["init"] == init) == pytest.approx(
            statistics.mean(scores), abs=1e-3
        )
    said = (tmp_path / "c" / VERDICT_FILE).read_text()
    assert "epoch 1 of 2 (12 steps at batch 8; --epochs 2)" in said and "verdict: too short to tell after 12" in said
    assert said.count("\n") > len(choice.verdict.scores) + 2  # the verdict's own table of every init


# --- the inits far behind --------------------------------------------------------------------------------------

ENOUGH = Evidence(steps=500, warmup_steps=50, images=1000)


def test_the_verdict_names_the_inits_behind_the_best_beyond_the_seeds_spread():
    scores = {STRUCTURED: [80.0, 82.0], "kaiming": [79.5, 81.5], "timm": [66.0, 68.0]}
    result = verdict(scores, STRUCTURED, ENOUGH, chance=10.0)
    assert result.tie and result.behind == [("timm", 14.0)]
    text = result.text()
    assert f"verdict: no winner after 500 steps: {STRUCTURED} led kaiming by 0.50" in text
    assert text.endswith(f"behind {STRUCTURED} beyond the seeds' spread: timm 14.00 points under")
    winner = verdict({**scores, "kaiming": [77.0, 78.0]}, STRUCTURED, ENOUGH, chance=10.0)
    assert winner.behind == [("timm", 14.0), ("kaiming", 3.5)] and "timm 14.00 points under, kaiming 3.50" in (
        winner.text()
    )


def test_no_init_is_named_behind_where_the_runs_are_no_evidence():
    scores = {STRUCTURED: [80.0, 82.0], "timm": [66.0, 68.0]}
    assert verdict(scores, STRUCTURED, Evidence(steps=12, images=1000)).behind == []
    few_images = verdict(scores, STRUCTURED, Evidence(steps=500, images=20))  # 14 points: under 3 images of 5
    assert few_images.behind == [] and "behind" not in few_images.text()


def test_a_cool_down_is_refused_in_one_line(tmp_path, capsys):
    """timm's --cooldown-epochs trains K epochs after --epochs: runs sized to the budget would overrun it."""
    argv = ["choose", *TINY, "--per-class", "10", "-b", "8", "--cooldown-epochs", "2", "--out", str(tmp_path / "c")]
    assert main(argv) == 2
    assert "--cooldown-epochs: choose sizes every run's epochs to its budget" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
