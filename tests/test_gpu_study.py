"""benchmarks/gpu_study.sh: a study started in the background on a device machine, its results to $OUT."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_study.sh"
# a study: one run (with a checkpoint) under --out, one ledger line (the data it was given) under --docs
FAKE_STUDY = """
import argparse, pathlib
parser = argparse.ArgumentParser()
for name in ("--data", "--out", "--docs"):
    parser.add_argument(name)
parser.add_argument("--fail", action="store_true")
args = parser.parse_args()
run = pathlib.Path(args.out) / "grid" / "run-seed0"
run.mkdir(parents=True, exist_ok=True)
(run / "summary.json").write_text("{}")
(run / "last.pt").write_text("weights")
ledger = pathlib.Path(args.docs) / "study-runs.jsonl"
ledger.write_text(ledger.read_text() + args.data + "\\n")
raise SystemExit(3 if args.fail else 0)
"""


def gpu_study(repo: Path, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "STUDY_WORK": str(tmp / "work"),
        "STUDY_DATA": str(tmp / "data"),
        "PYTHON": sys.executable,
        "OUT": str(tmp / "out"),
    }
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, env=env, capture_output=True, text=True, timeout=120)


def test_a_study_runs_in_the_background_and_its_ledger_and_small_files_come_back(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    (repo / "docs" / "study-runs.jsonl").write_text("committed\n")
    (repo / "docs" / "zz-runs.jsonl").write_text("another study's\n")  # unchanged: stays there
    (repo / "study.py").write_text(FAKE_STUDY)
    (tmp_path / "data" / "train").mkdir(parents=True)  # unpacked already: no .gpu-data needed
    data = f"cifar10:{tmp_path / 'data'}"

    first = gpu_study(repo, tmp_path, "start", "study.py")
    assert first.returncode == 0 and "ended (exit 0)" in first.stdout
    assert (tmp_path / "out" / "docs" / "study-runs.jsonl").read_text() == f"committed\n{data}\n"
    with tarfile.open(tmp_path / "out" / "runs.tar.gz") as runs:
        names = runs.getnames()
    assert sorted(p.name for p in (tmp_path / "out" / "docs").iterdir()) == ["study-runs.jsonl"]
    assert "./grid/run-seed0/summary.json" in names and not any(n.endswith(".pt") for n in names)

    second = gpu_study(repo, tmp_path, "start", "study.py", "--fail")  # goes on from the first's ledger
    assert "ended (exit 3)" in second.stdout
    assert (tmp_path / "out" / "docs" / "study-runs.jsonl").read_text() == f"committed\n{data}\n{data}\n"
    assert "ended (exit 3)" in gpu_study(repo, tmp_path, "poll", "5").stdout


def test_a_second_start_while_a_study_runs_is_refused_and_a_bad_verb_is_a_usage_error(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    with subprocess.Popen(["sleep", "60"]) as running:
        (tmp_path / "work" / "pid").write_text(f"{running.pid}\n")
        refused = gpu_study(tmp_path, tmp_path, "start", "study.py")
        running.kill()
    assert refused.returncode == 1
    assert f"gpu_study.sh: a study is still running (pid {running.pid}): poll it first" in refused.stderr
    usage = gpu_study(tmp_path, tmp_path, "stop")
    assert usage.returncode == 2 and usage.stderr.startswith("usage: gpu_study.sh start")


def test_the_data_go_where_the_studies_default_data_spec_reads_them():
    """A committed ledger row counts only under the --data spec it was trained with (it is part of the
    recipe), so on the device machine the data must lie where the studies look by default."""
    import re

    unpacked = re.search(r"data=\$\{STUDY_DATA:-([^}]+)\}", SCRIPT.read_text()).group(1)
    for study in ("study_regimes", "study_selection", "study_convergence"):
        text = (SCRIPT.parent / f"{study}.py").read_text()
        assert f'"--data", default="cifar10:{unpacked}"' in text, study


def test_a_link_where_the_study_writes_is_refused_and_its_target_stays(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "work").mkdir()
    (tmp_path / "theirs.log").write_text("someone else's\n")
    (tmp_path / "work" / "study.log").symlink_to(tmp_path / "theirs.log")
    (tmp_path / "study.py").write_text(FAKE_STUDY)
    (tmp_path / "docs").mkdir()
    refused = gpu_study(tmp_path, tmp_path, "start", "study.py")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert f"gpu_study.sh: {tmp_path / 'work' / 'study.log'} is a link, and the study writes nothing" in refused.stderr
    assert (tmp_path / "theirs.log").read_text() == "someone else's\n"
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["study.log"]  # nothing started


def test_a_damaged_pid_file_is_one_line_and_a_ledger_that_is_a_link_is_not_copied(tmp_path):
    (tmp_path / "data" / "train").mkdir(parents=True)
    work = tmp_path / "work"
    (work / "docs").mkdir(parents=True)
    (work / "pid").write_text("0\n")  # kill -0 0 succeeds: it signals the script's own group
    refused = gpu_study(tmp_path, tmp_path, "poll", "1")
    assert refused.returncode == 1
    assert (
        refused.stderr == f"gpu_study.sh: {work / 'pid'} is damaged (not a process id): remove it once no study runs\n"
    )
    with subprocess.Popen(["true"]) as ended:
        pass
    (work / "pid").write_text(f"{ended.pid}\n")
    (work / "rc").write_text("0\n")
    (work / "study.log").write_text("log\n")
    (tmp_path / "secret.jsonl").write_text("not the study's\n")
    (work / "docs" / "study-runs.jsonl").symlink_to(tmp_path / "secret.jsonl")
    polled = gpu_study(tmp_path, tmp_path, "poll", "1")
    assert polled.returncode == 0 and "ended (exit 0)" in polled.stdout
    assert list((tmp_path / "out" / "docs").iterdir()) == []
