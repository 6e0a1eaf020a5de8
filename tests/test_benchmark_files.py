"""benchmarks/ keep the library's file rules: a damaged record a script reads back is one line naming the file
and what to do (never a traceback), and a file it writes is never written through a link, the refusal coming
before anything has run or changed. (The studies' own writes: test_study.py and test_regimes.py.)"""

import json
import os
import subprocess

import pytest
import torch

from conftest import load_benchmark, small_vit
from structinit.errors import RunError
from structinit.studies.grid import run_dir


def all_cases(cross_cpu, **pins):
    """Pins in cross_cpu's old format: every case, with `pins` for the first."""
    first, *rest = (cross_cpu.case_id(case) for case in cross_cpu.CASES)
    return {first: pins, **{case: {} for case in rest}}


@pytest.mark.parametrize(
    "pins, why",
    [
        (b"{", "is damaged (Expecting property name enclosed in double quotes"),
        (b"\xff\xfe", "is damaged ('utf-8' codec can't decode byte 0xff"),
        (b"[" * 100_000, "is damaged (nested too deep to read)"),
        (b"[1, 2]", "is damaged (not a JSON object)"),
        (b"{}", "is damaged (its 'vit_digits impulse seed 3' is missing)"),
        (
            lambda cross_cpu: all_cases(cross_cpu, w=[[2], [1.0, "x", 3.0]]),
            "is damaged (its 'vit_digits impulse seed 3.w' is [[2], [1.0, \"x\", 3.0]], not [shape, [sum, sum of",
        ),
    ],
)
def test_cross_cpu_refuses_damaged_pins_in_one_line_before_it_runs_a_path(tmp_path, pins, why):
    """--against was read after every path had run (minutes), its damage a traceback."""
    cross_cpu = load_benchmark("cross_cpu")
    path = tmp_path / "old.json"
    path.write_bytes(pins if isinstance(pins, bytes) else json.dumps(pins(cross_cpu)).encode())
    with pytest.raises(SystemExit) as stop:
        cross_cpu.main(["--against", str(path)])
    assert str(stop.value.code).startswith(f"cross_cpu.py: error: {path} {why}")
    assert "\n" not in str(stop.value.code)


@pytest.mark.parametrize(
    "report, why",
    [
        ("{", "is damaged (Expecting property name"),
        ('{"measured_on": "pseudo input", "mean_fidelity": 0.9}', "is damaged (its 'min_fidelity' is missing)"),
        (
            '{"measured_on": "pseudo input", "mean_fidelity": 0.9, "min_fidelity": null, "seconds": 1}',
            "is damaged (its 'min_fidelity' is null, not a number >= 0)",
        ),
    ],
)
def test_families_fidelity_table_names_a_damaged_init_report_in_one_line(tmp_path, report, why):
    families = load_benchmark("families")
    path = run_dir(tmp_path / "swin", 8, "impulse", 0) / "init_report.json"
    path.parent.mkdir(parents=True)
    path.write_text(report)
    with pytest.raises(RunError) as error:
        families.fidelity_table(tmp_path / "swin", [{"init": "impulse", "per_class": 8, "seed": 0}])
    message = str(error.value)
    assert message.startswith(f"{path} {why}")
    assert message.endswith(": restore it, or train the run again (its start writes it)")


class Hostile:
    """A pickled object whose unpickling would run code (os.system, in a real attack)."""

    def __reduce__(self):
        return (print, ("code ran",))


def test_mechanism_names_a_damaged_init_report_or_snapshot_in_one_line_and_runs_no_code(tmp_path, capsys):
    mechanism = load_benchmark("bench_mechanism")
    report = tmp_path / "init_report.json"
    for damaged, why in (
        ("{", "is damaged (Expecting property name"),
        ('{"layers": [{"heads": [{"offset": [1]}]}]}', "is damaged (its 'layers[0].heads[0].offset' is [1], not [row,"),
        ('{"layers": []}', "is damaged (its 'layers' is [], not a non-empty list)"),
    ):
        report.write_text(damaged)
        with pytest.raises(RunError) as error:
            mechanism.assigned_offsets(tmp_path)
        assert str(error.value).startswith(f"{report} {why}")
    model, snapshot = small_vit(depth=1), tmp_path / "epoch_1.pt"
    snapshot.write_bytes(b"half a checkpoint")
    with pytest.raises(RunError, match=rf"^snapshot {snapshot} is not a torch.save archive .*: train the run again"):
        mechanism.snapshot_weights(snapshot, model)
    torch.save({"w": Hostile()}, snapshot)
    with pytest.raises(RunError, match=rf"^snapshot {snapshot} holds Python objects beyond tensors"):
        mechanism.snapshot_weights(snapshot, model)
    torch.save(small_vit(depth=1, embed_dim=96).state_dict(), snapshot)
    with pytest.raises(RunError, match=rf"^snapshot {snapshot} does not fit the model"):
        mechanism.snapshot_weights(snapshot, model)
    assert "code ran" not in capsys.readouterr().out


@pytest.fixture
def choose_rows(tmp_path, monkeypatch):
    """bench_choose with its photographs and its `structinit choose` runs faked: (the module, its arguments, the
    rows run)."""
    choose = load_benchmark("bench_choose")
    ran = []
    monkeypatch.setattr(choose, "photo_folder", lambda name, root: tmp_path / name)
    monkeypatch.setattr(
        choose.subprocess,
        "run",
        lambda command, **kwargs: ran.append(command) or subprocess.CompletedProcess([], 0, "", ""),
    )
    args = ["--rows", "textures-fit-idle", "--out", str(tmp_path / "out"), "--ledger", str(tmp_path / "rows.jsonl")]
    return choose, args, ran


def test_bench_choose_names_a_damaged_plan_in_one_line_and_records_no_row(tmp_path, choose_rows):
    choose, args, _ = choose_rows
    plan = tmp_path / "out" / "textures-fit-idle" / "choose.json"
    plan.parent.mkdir(parents=True)
    plan.write_text('{"model": ')
    with pytest.raises(SystemExit, match=rf"^bench_choose.py: error: {plan} is damaged \(Expecting value.*new --out$"):
        choose.main(args)
    assert not (tmp_path / "rows.jsonl").exists()


def test_bench_choose_refuses_a_link_at_its_ledger_before_a_row_runs(tmp_path, choose_rows):
    choose, args, ran = choose_rows
    (tmp_path / "elsewhere").write_text("kept\n")
    (tmp_path / "rows.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SystemExit, match=rf"^bench_choose.py: error: {tmp_path}/rows.jsonl is a link"):
        choose.main(args)
    assert ran == [] and (tmp_path / "elsewhere").read_text() == "kept\n"


def test_selection_teacher_table_names_a_damaged_summary_in_one_line(tmp_path):
    selection = load_benchmark("study_selection")
    summary = tmp_path / "teachers" / "timm" / "summary.json"
    summary.parent.mkdir(parents=True)
    summary.write_text('{"finished": true, "epochs_done": 2')
    with pytest.raises(RunError, match=rf"^{summary} is damaged \(Expecting ',' delimiter.*\): structinit train --res"):
        selection.teacher_table(tmp_path)


def test_a_docs_page_that_is_no_regular_file_is_one_line_not_a_hang(tmp_path):
    """write_generated_section read the page whole: a FIFO there waited for a writer for ever."""
    from structinit.studies.ledger import write_generated_section

    page = tmp_path / "page.md"
    os.mkfifo(page)
    with pytest.raises(RunError, match=r"page.md is a FIFO, not a regular file"):
        write_generated_section(page, "| a |", "test")
    huge = tmp_path / "huge.md"
    with open(huge, "wb") as f:
        f.truncate(64 << 20)
    with pytest.raises(RunError, match=r"huge.md is over 4 MiB: not a docs page"):
        write_generated_section(huge, "| a |", "test")


def test_bench_init_refuses_a_fifo_among_the_images(tmp_path, monkeypatch):
    bench = load_benchmark("bench_init")
    folder = tmp_path / "test" / "cat"
    folder.mkdir(parents=True)
    os.mkfifo(folder / "0.jpg")
    monkeypatch.setattr(bench, "CIFAR", tmp_path)
    with pytest.raises(SystemExit, match=r"^bench_init.py: error: .*0.jpg is a FIFO, not a regular file"):
        bench.load_images(1)
