"""Grids as cluster jobs through submitit: local jobs give a sequential grid's rows, a requeued job
resumes its run, the SLURM settings reach the job script, and bad settings fail in one line."""

import os
import sys

import pytest
import torch

from conftest import assert_same_final_weights, grid_rows
from structinit.cli import main
from structinit.errors import RunError
from structinit.studies.launch import Cluster, TrainJob
from structinit.training import TrainConfig, train

pytest.importorskip("submitit")

FAST = dict(data="digits", per_class=10, model="vit_digits", model_kwargs={"depth": 1}, batch_size=50, quiet=True)
GRID = ["compare", "--per-class", "10", "--model-kwargs", "depth=1", "--batch-size", "50", "--epochs", "2"]
GRID += ["--inits", "timm,impulse", "--seeds", "0", "--quiet"]


def test_a_grid_of_local_jobs_gives_the_rows_and_weights_of_a_sequential_grid(tmp_path):
    assert main([*GRID, "--cluster", "local", "--cpus-per-run", "1", "--out", str(tmp_path / "jobs")]) == 0
    assert main([*GRID, "--threads", "1", "--out", str(tmp_path / "seq")]) == 0
    assert grid_rows(tmp_path / "jobs") == grid_rows(tmp_path / "seq") and len(grid_rows(tmp_path / "seq")) == 2
    assert_same_final_weights(tmp_path / "seq", tmp_path / "jobs")
    logs = list((tmp_path / "jobs" / "jobs").glob("*_log.out"))
    assert len(logs) == 2  # submitit's job logs, beside the runs
    # a second call finds every run finished and submits nothing
    assert main([*GRID, "--cluster", "local", "--cpus-per-run", "1", "--out", str(tmp_path / "jobs")]) == 0
    assert len(list((tmp_path / "jobs" / "jobs").glob("*_log.out"))) == 2


def test_a_requeued_job_resumes_its_run_where_it_stopped(tmp_path):
    """What SLURM does on a timeout or preemption: submitit asks the job for its checkpoint (a new
    submission) and runs that; the run continues from its last epoch and ends as an uninterrupted one."""
    whole = TrainConfig(**FAST, epochs=3, out=str(tmp_path / "whole"))
    train(whole)
    config = TrainConfig(**FAST, epochs=3, out=str(tmp_path / "requeued"))
    job = TrainJob(threads=torch.get_num_threads())
    job(TrainConfig(**{**FAST, "epochs": 3, "stop_after": 1, "out": config.out}))  # the job stopped after epoch 1
    requeued = job.checkpoint(config)
    summary = requeued.function(*requeued.args, **requeued.kwargs)
    assert summary["epochs_done"] == 3
    a = torch.load(tmp_path / "whole" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "requeued" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_slurm_settings_reach_the_job_script(tmp_path, monkeypatch):
    srun = tmp_path / "bin" / "srun"  # submitit's sign of a SLURM machine
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{srun.parent}:{os.environ['PATH']}")
    cluster = Cluster(
        "slurm", partition="gpu", timeout_min=90, gpus_per_run=1, cpus_per_run=6, mem_gb=32, parallel=4,
        slurm_args={"account": "abc", "qos": "high"},
    )  # fmt: skip
    script = cluster.executor(tmp_path)._executor._make_submission_file_text("python -m job", "uid")
    for line in ("--partition=gpu", "--time=90", "--gpus-per-node=1", "--cpus-per-task=6", "--mem=32GB"):
        assert f"#SBATCH {line}" in script, line
    assert "#SBATCH --account=abc" in script and "#SBATCH --qos=high" in script


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--partition", "gpu"], "--partition only apply to cluster jobs: add --cluster slurm"),
        (["--cluster", "local", "--cpus-per-run", "0"], "cpus_per_run must be at least 1, got 0"),
        (["--cluster", "slurm", "--slurm-args", "account"], "--slurm-args: expected key=value, got 'account'"),
    ],
)
def test_bad_cluster_settings_fail_in_one_line_before_any_run(tmp_path, capsys, flags, message):
    assert main([*GRID, *flags, "--out", str(tmp_path / "grid")]) != 0
    assert message in capsys.readouterr().err
    assert not (tmp_path / "grid" / "per_class_10").exists()
    with pytest.raises(SystemExit):
        main([*GRID, "--cluster", "pbs", "--out", str(tmp_path / "grid")])
    assert "invalid choice: 'pbs'" in capsys.readouterr().err


def test_cluster_jobs_without_submitit_name_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "submitit", None)
    assert main([*GRID, "--cluster", "local", "--out", str(tmp_path / "grid")]) != 0
    assert "pip install 'structinit-vit[cluster]'" in capsys.readouterr().err
    with pytest.raises(RunError, match="needs submitit"):
        Cluster("local").executor(tmp_path)
