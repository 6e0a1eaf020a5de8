"""Every record read back is checked against its schema, and read within a bound (issue 75): metrics.jsonl
within a total as well as a line's, its lines, summary.json, a checkpoint's plain values, config.yaml's
environment, choose.json, a study's ledger and a teacher's init report. An edited field is one line naming the
file and the field, never a traceback nor a value printed as fact, and a refusal changes no file."""

import dataclasses
import json
import re
import shutil
import tracemalloc

import pytest
import torch

from structinit.cli import main
from structinit.errors import RunError
from structinit.experiment import RunResult
from structinit.schema import json_lines
from structinit.studies import ledger
from structinit.studies.choose_plan import PLAN_FILE, check_same, read_plan
from structinit.studies.results import collect
from structinit.training import record
from structinit.training.checkpoint import load_checkpoint
from structinit.training.config_file import read_config
from structinit.training.device import usable_cores
from structinit.training.record import MetricsLog

MODEL = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2"]
SMALL = [*MODEL, "--per-class", "5", "-b", "25", "--quiet"]


def files(run):
    return {
        str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".lock"
    }


def one_line(capsys, *fragments):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


@pytest.fixture(scope="module")
def finished_grid(tmp_path_factory):
    """A finished grid of one 2-epoch run (timm, seed 0, 5 images a class: 2 steps an epoch)."""
    grid = tmp_path_factory.mktemp("grid") / "g"
    assert main(["compare", *SMALL, "--inits", "timm", "--seeds", "0", "--epochs", "2", "--out", str(grid)]) == 0
    return grid


@pytest.fixture
def grid(finished_grid, tmp_path):
    shutil.copytree(finished_grid, tmp_path / "g")
    return tmp_path / "g"


def run_of(grid):
    return grid / "per_class_5" / "timm-seed0"


def edit_line(run, index, **values):
    lines = (run / "metrics.jsonl").read_text().splitlines()
    lines[index] = json.dumps({**json.loads(lines[index]), **values})
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")


# --- metrics.jsonl within a total bound, read once ---------------------------------------------------------------


def test_a_log_padded_with_short_lines_is_refused_as_it_is_read_not_kept_in_memory(grid):
    log = MetricsLog(run_of(grid))
    with open(log.path, "ab") as file:
        file.write(b"\n" * (2 << 20))  # 2 M blank lines: each within a line's bound, the log beyond any run's
    tracemalloc.start()
    try:
        with pytest.raises(RunError, match=r"metrics\.jsonl is damaged \(more than 100,000 lines"):
            log.records()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak:,} bytes to refuse a {log.path.stat().st_size:,}-byte log"


def test_a_log_larger_in_all_than_its_bound_is_refused_naming_it(grid, monkeypatch):
    monkeypatch.setattr(record, "LOG_BOUNDS", record.Bounds(line=1 << 20, lines=100_000, total=4096))
    log = MetricsLog(run_of(grid))
    with open(log.path, "ab") as file:
        file.write(b" \n" * 2048)
    with pytest.raises(RunError, match=r"metrics\.jsonl is damaged \(larger than 4,096 bytes"):
        log.records()


def test_resume_refuses_a_padded_log_in_one_line_and_changes_no_file(grid, capsys):
    run = run_of(grid)
    with open(run / "metrics.jsonl", "ab") as file:
        file.write(b"\n" * 200_000)
    before = files(run)
    assert main(["train", "--resume", "--out", str(run), "--epochs", "3", "--quiet"]) == 2
    one_line(capsys, f"{run / 'metrics.jsonl'} is damaged (more than 100,000 lines")
    assert files(run) == before


def test_a_resume_reads_the_log_once(grid, monkeypatch):
    reads = []
    monkeypatch.setattr(record, "json_lines", lambda path, *rest: reads.append(path) or json_lines(path, *rest))
    assert main(["train", "--resume", "--out", str(run_of(grid)), "--epochs", "3", "--quiet"]) == 0
    assert reads == [run_of(grid) / "metrics.jsonl"]


# --- every field checked ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "edit", "message"),
    [
        (0, dict(epoch=-1), "line 1 is not an epoch or event record (its 'epoch' is -1, not an integer >= 1)"),
        (0, dict(test_top1=float("nan")), "line 1 is not an epoch or event record (its 'test_top1' is NaN, not a"),
        (0, dict(train_loss=[1.0]), "line 1 is not an epoch or event record (its 'train_loss' is [1.0], not a"),
        (1, dict(step=7), "line 2 is not an epoch or event record (its 'step' 7 is not 2 epochs of equal steps"),
    ],
    ids=["negative epoch", "NaN", "a list for a number", "steps of no whole epochs"],
)
def test_resume_refuses_an_edited_log_line_naming_its_field_and_changes_no_file(grid, capsys, line, edit, message):
    run = run_of(grid)
    edit_line(run, line, **edit)
    before = files(run)
    assert main(["train", "--resume", "--out", str(run), "--epochs", "3", "--quiet"]) == 2
    one_line(capsys, f"{run / 'metrics.jsonl'} ", message, "remove the damaged line")
    assert files(run) == before


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda run: edit_line(run, 0, test_top1=500.0),
            "line 1 is not an epoch or event record (its 'test_top1' is 500.0",
        ),
        (lambda run: edit_line(run, 0, epoch_seconds="1"), "(its 'epoch_seconds' is \"1\", not a number >= 0)"),
        (
            lambda run: edit_line(run, 0, epoch=3),
            "line 1 is not an epoch or event record (its 'step' 2 is not 3 epochs",
        ),
        (
            lambda run: edit_line(run, 0, step=4),
            "line 2 is not an epoch or event record (its 'step' 4 is not 2 epochs of line 1's 4 steps)",
        ),
        (
            lambda run: (run / "metrics.jsonl").write_text((run / "metrics.jsonl").read_text().split("\n", 1)[1]),
            "metrics.jsonl is damaged (epoch 2 is logged where epoch 1 belongs)",
        ),
        (
            lambda run: (run / "config.yaml").write_text(
                (run / "config.yaml").read_text().split("environment:")[0] + "environment: [1, 2]\n"
            ),
            "config.yaml's environment is damaged (not a mapping)",
        ),
        (
            lambda run: (run / "config.yaml").write_text(
                (run / "config.yaml").read_text().replace("  device_name: ", "  device_name: [1]\n  cpu: ")
            ),
            "config.yaml's environment is damaged (its 'device_name' is [1], not text)",
        ),
    ],
    ids=[
        "a top-1 over 100",
        "text for seconds",
        "an epoch renumbered",
        "steps an epoch changed",
        "an epoch lost",
        "environment a list",
        "a list for a name",
    ],
)
def test_a_grids_table_refuses_an_edited_record_naming_its_field(grid, damage, message):
    """Lines before the last are in no checkpoint: only their schema can tell (a top-1 of 500 became the best)."""
    damage(run_of(grid))
    before = files(grid)
    with pytest.raises(RunError) as refused:
        collect(grid)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert files(grid) == before


def test_a_summary_edited_where_no_checkpoint_tells_is_refused_naming_its_field(grid, capsys):
    run = run_of(grid)
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "init": [1]}))
    before = files(run)
    assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 2
    one_line(capsys, f"{run / 'summary.json'} is damaged (its 'init' is [1], not a mapping)")
    assert files(run) == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda state: state.update(epoch="2"), "last.pt is damaged (its 'epoch' is \"2\", not an integer >= 1)"),
        (
            lambda state: state["log"].append({**state["log"].pop(), "test_top1": float("inf")}),
            "last.pt is damaged (a log line it holds is not an epoch or event record (its 'test_top1' is Infinity",
        ),
        (
            lambda state: state["metrics"].update(epoch=1, step=1),
            "last.pt is damaged (its metrics are of epoch 1, not of its 'epoch' 2)",
        ),
    ],
    ids=["text for the epoch", "an infinite top-1", "metrics of another epoch"],
)
def test_a_checkpoint_whose_plain_values_are_edited_is_refused_before_anything_is_written(grid, capsys, edit, message):
    run = run_of(grid)
    state = torch.load(run / "last.pt", weights_only=True)
    edit(state)
    torch.save(state, run / "last.pt")
    with pytest.raises(RunError, match=r"last\.pt is damaged"):
        load_checkpoint(run / "last.pt")
    before = files(run)
    assert main(["train", "--resume", "--out", str(run), "--epochs", "3", "--quiet"]) == 2
    one_line(capsys, message, "prev.pt")
    assert files(run) == before


# --- choose.json: its steps from its data, its threads within the cores -----------------------------------------


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """A comparison of 1 epoch on digits: 100 training images at batch 8, so 12 steps an epoch."""
    out = tmp_path_factory.mktemp("choose") / "c"
    argv = ["choose", *MODEL, "--quiet", "--per-class", "10", "-b", "8", "--val-per-class", "4", "--epochs", "1"]
    assert main([*argv, "--out", str(out)]) == 0
    return argv, out


def test_a_plan_whose_steps_are_edited_is_refused_not_taken_as_evidence(planned, tmp_path, capsys):
    argv, planned_out = planned
    out = tmp_path / "c"
    shutil.copytree(planned_out, out)
    plan = json.loads((out / PLAN_FILE).read_text())
    assert plan["steps"] == 12
    (out / PLAN_FILE).write_text(json.dumps({**plan, "steps": 500}))  # 1 epoch of it would pass the evidence gate
    before = files(out)
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 2
    one_line(
        capsys, f"{out / PLAN_FILE} is damaged (its 'steps' 500 are not the 12 steps an epoch its data gives", "--rerun"
    )
    assert files(out) == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (dict(threads=10**6), f"its 'threads' 1000000 are more than the {usable_cores()} cores this process may use"),
        (dict(data="x" * 16), "its 'data' is \"xxxxxxxxxxxxxxxx\", not a fingerprint of 16 hex digits"),
        (dict(inits=["timm", "timm"]), "its 'inits' [\"timm\", \"timm\"] are not its 'structured'"),
    ],
)
def test_a_plan_is_read_against_its_schema(planned, tmp_path, edit, message):
    out = tmp_path / "c"
    shutil.copytree(planned[1], out)
    plan = json.loads((out / PLAN_FILE).read_text())
    (out / PLAN_FILE).write_text(json.dumps({**plan, **edit}))
    with pytest.raises(RunError, match="is damaged") as refused:
        read_plan(out)
    assert message in str(refused.value)


def test_check_same_compares_the_steps_the_data_gives(planned):
    plan = read_plan(planned[1])
    with pytest.raises(RunError, match=r"its 'steps' 12 are not the 13 steps an epoch"):
        check_same(plan, dataclasses.replace(plan, steps=13), planned[1] / PLAN_FILE)


# --- a teacher's init report, a study's ledger ------------------------------------------------------------------


def test_a_teacher_whose_report_records_no_heads_is_one_line_not_a_division_by_zero(grid, capsys):
    run = run_of(grid)
    report = json.loads((run / "init_report.json").read_text())
    report["layers"][0]["heads"] = []
    (run / "init_report.json").write_text(json.dumps(report))
    student = ["init", "vit_digits", *MODEL, "--init", "select[rule=heads]", "--teacher", str(run)]
    assert main(student) == 2
    one_line(capsys, f"{run / 'init_report.json'} is damaged (its 'layers[0].heads' is [], not a non-empty list)")


ROW = {"grid": "g", "per_class": 10, "init": "timm", "seed": 0, "dataset": "digits", "model": "vit_digits"}
ROW |= {"heads": 2, "epochs": 2, "split": "test", "recipe": "r", "top1": 50.0, "steps": 4, "curve": [[1, 40.0]]}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"top1": "50"}, "line 2 is damaged (its 'top1' is \"50\", not a number in [0, 100])"),
        ({"steps": 5}, "line 2 is damaged (its 'steps' 5 are not its 2 epochs of equal steps)"),
        (
            {"curve": [[1, 400.0]]},
            "line 2 is damaged (its 'curve[0]' is [1, 400.0], not [epoch, a number in [0, 100]])",
        ),
        ({"seed": None}, "line 2 is damaged (its 'seed' is null, not an integer in [0, 4294967295])"),
        ({"grid": None, "init": None}, "line 2 is damaged (its 'grid' is null, not text)"),
    ],
)
def test_a_ledger_row_is_read_against_its_schema(tmp_path, edit, message):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    assert list(ledger.read_ledger(path)) == [("g", 10, "timm", 0)]
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "seed": 1, **edit}) + "\n")
    with pytest.raises(SystemExit) as refused:
        ledger.read_ledger(path)
    assert f"{path} {message}" in str(refused.value)


# --- what run_files reads of config.yaml, a grid's init options, init_report.json through Python -----------------


def unfinished(grid):
    """The grid's run as a run of its own directory left it stopped before its first checkpoint."""
    run = run_of(grid)
    for name in ("last.pt", "prev.pt", "summary.json", "metrics.jsonl"):
        (run / name).unlink()
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(re.sub(r"(?m)^out: .*$", f"out: {run}", config))
    return run


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("snapshot_epochs: 5", "its 'snapshot_epochs' is 5, not a list of epochs"),
        ("snapshot_epochs: [-1]", "its 'snapshot_epochs[0]' is -1, not an integer >= 0"),
        ("log: tensorboard", "its 'log' is \"tensorboard\", not a list of loggers"),
    ],
    ids=["a scalar for the epochs", "a negative epoch", "a name for the loggers"],
)
def test_a_fresh_run_refuses_a_config_whose_files_record_is_edited_and_deletes_nothing(grid, capsys, setting, message):
    """A fresh run clears what the unfinished run of its directory wrote, by config.yaml's record of it: an edited
    record is named, not a TypeError, nor files left out of (or into) what is deleted."""
    run = unfinished(grid)
    name = setting.split(":")[0]
    config = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(re.sub(rf"(?m)^{name}: .*$", setting, config))
    before = files(run)
    assert main(["train", *SMALL, "--epochs", "2", "--out", str(run)]) == 2
    one_line(capsys, f"structinit train: error: {run / 'config.yaml'} is damaged ({message}): restore it")
    assert files(run) == before


@pytest.fixture(scope="module")
def mimetic_grid(tmp_path_factory):
    """A finished grid of one 1-epoch mimetic run: an init with options, which a grid checks again."""
    grid = tmp_path_factory.mktemp("mimetic") / "g"
    argv = ["compare", *SMALL, "--inits", "mimetic", "--seeds", "0", "--epochs", "1", "--out", str(grid)]
    assert main(argv) == 0
    return argv[:-1], grid


@pytest.mark.parametrize(
    ("options", "rerun", "message"),
    [
        ({"qk_alpha": float("nan")}, [], "its 'options.qk_alpha' is NaN, not text, a finite number, true, false, null"),
        ({"qk_alpha": float("nan")}, ["--rerun"], "its 'options.qk_alpha' is NaN, not text, a finite number"),
        ({"qk_alpha": "0.7"}, [], "its 'options.qk_alpha' is not of the option's type: option qk_alpha of the mimetic"),
        ({"distribution": {"uniform": 1}}, [], "its 'options.distribution' is {\"uniform\": 1}, not text, a finite"),
        ({"kernel_size": -3}, [], "its 'options.kernel_size' is -3, not an integer >= 1"),
        ([0.7], [], "its 'options' is [0.7], not a mapping of options"),
    ],
    ids=["NaN", "NaN, --rerun", "text for a number", "a mapping for a name", "a negative kernel", "a list"],
)
def test_a_grid_refuses_an_init_report_whose_options_are_edited(
    mimetic_grid, tmp_path, capsys, options, rerun, message
):
    """Not taken for a change of the init's defaults (which --rerun trains again, deleting the run): damage."""
    argv, finished = mimetic_grid
    grid = tmp_path / "g"
    shutil.copytree(finished, grid)
    path = grid / "per_class_5" / "mimetic-seed0" / "init_report.json"
    report = json.loads(path.read_text())
    report["options"] = {**report["options"], **options} if isinstance(options, dict) else options
    path.write_text(json.dumps(report))
    before = files(grid)
    capsys.readouterr()
    assert main([*argv, str(grid), *rerun]) == 2
    one_line(capsys, f"structinit compare: error: {path} is damaged ({message}", "): delete it")
    assert files(grid) == before


def run_result(run):
    config = dataclasses.replace(read_config(run / "config.yaml"), out=str(run))
    return RunResult(config, json.loads((run / "summary.json").read_text()))


def test_run_init_report_is_the_runs_record(grid):
    run = run_of(grid)
    assert run_result(run).init_report == json.loads((run / "init_report.json").read_text())


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda report: report["layers"][0]["heads"][0].update(fidelity=float("nan")),
            "its 'layers[0].heads[0].fidelity' is NaN, not a number in [0, 1] or null",
        ),
        (lambda report: report.update(layers={"0": []}), "its 'layers' is {\"0\": []}, not a list"),
        (
            lambda report: report["layers"][0]["heads"][1].update(offset=1),
            "its 'layers[0].heads[1].offset' is 1, not [dy, dx] or null",
        ),
        (lambda report: report.update(seed=-1), "its 'seed' is -1, not an integer >= 0 or null"),
        (lambda report: report.update(options=[3]), "its 'options' is [3], not a mapping of options"),
        (
            lambda report: report.update(mean_fidelity=0.99),
            "its 'mean_fidelity' and 'min_fidelity' are not those of its layers' heads",
        ),
    ],
    ids=["NaN", "a mapping for the layers", "a scalar for an offset", "a negative seed", "a list", "a mean edited"],
)
def test_run_init_report_refuses_an_edited_field_naming_it(grid, edit, message):
    """Python's `RunResult.init_report` returns no edited value as the init's."""
    path = run_of(grid) / "init_report.json"
    report = json.loads(path.read_text())
    edit(report)
    path.write_text(json.dumps(report))
    before, result = files(grid), run_result(run_of(grid))
    with pytest.raises(RunError) as refused:
        result.init_report  # noqa: B018 (the property reads the file)
    assert str(refused.value).startswith(f"{path} is damaged ({message}): train the run again")
    assert "\n" not in str(refused.value) and files(grid) == before
