"""Records that cannot be forged into a table (issue 60): a finished run's summary and last log line are
checked against what its checkpoint recorded of that epoch, and a refusal writes nothing."""

import json

from structinit.cli import main

SMALL = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--per-class", "5", "-b", "25", "--quiet"]


def forge(run):
    summary = json.loads((run / "summary.json").read_text())
    summary.update(test_top1=99.0, test_top5=99.5)  # a forgery that holds together: only last.pt tells
    (run / "summary.json").write_text(json.dumps(summary))
    lines = (run / "metrics.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    last.update(test_top1=99.0, test_top5=99.5)
    (run / "metrics.jsonl").write_text("\n".join([*lines[:-1], json.dumps(last)]) + "\n")


def test_a_forged_summary_and_log_line_are_refused_by_compare_and_resume_writes_nothing(tmp_path, capsys):
    grid = tmp_path / "g"
    argv = ["compare", *SMALL, "--inits", "timm", "--seeds", "0", "--epochs", "1", "--out", str(grid)]
    assert main(argv) == 0
    run = grid / "per_class_5" / "timm-seed0"
    forge(run)
    log = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(argv) == 2
    assert "summary.json and metrics.jsonl are not what its last.pt recorded of epoch 1" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(run)]) == 2
    assert "99" not in capsys.readouterr().out
    assert (run / "metrics.jsonl").read_text() == log  # nothing appended by the refusal


def test_after_the_advised_fix_resume_puts_back_the_runs_own_line_and_summary(tmp_path, capsys):
    grid = tmp_path / "g"
    argv = ["compare", *SMALL, "--inits", "timm", "--seeds", "0", "--epochs", "1", "--out", str(grid)]
    assert main(argv) == 0
    run = grid / "per_class_5" / "timm-seed0"
    truth = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])
    forge(run)
    (run / "summary.json").unlink()  # the advice
    assert main(["train", "--resume", "--out", str(run)]) == 0
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [line["test_top1"] for line in lines if line.get("epoch") == 1] == [truth["test_top1"]]
    assert json.loads((run / "summary.json").read_text())["test_top1"] == truth["test_top1"]
    assert main(argv) == 0  # the grid takes it again


def test_an_out_that_reads_as_a_number_is_recorded_as_text(tmp_path, monkeypatch):
    from structinit.training import read_config

    monkeypatch.chdir(tmp_path)
    assert main(["train", *SMALL, "--epochs", "1", "--out", "1e400"]) == 0
    assert read_config(tmp_path / "1e400" / "config.yaml").out == "1e400"
    assert main(["train", "--resume", "--out", "1e400", "--epochs", "2", "--quiet"]) == 0
