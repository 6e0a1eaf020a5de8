"""timm's dialect: its flag names, a config file that a run's own config.yaml can be, the environment
a run records, and the optional loggers (TensorBoard, W&B) beside metrics.jsonl."""

import dataclasses

import pytest
import torch
import yaml

from structinit.cli.commands import main
from structinit.cli.parser import build_parser
from structinit.cli.train_flags import EMA_DECAY, train_config
from structinit.training import TrainConfig, read_config
from structinit.training.record import MetricsLog

FLAGS = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet"]


def config_of(*argv: str) -> TrainConfig:
    return train_config(build_parser().parse_args(["train", *argv]))


def test_timm_flag_names_mean_the_same_as_ours():
    ours = config_of(
        "--randaugment",
        "rand-m9-n2",
        "--ema-decay",
        "0.99",
        "--compile",
        "--out",
        "o",
        "--batch-size",
        "64",
        "--workers",
        "2",
        "--data-root",
        "d",
    )
    timms = config_of(
        "--aa",
        "rand-m9-n2",
        "--model-ema",
        "--model-ema-decay",
        "0.99",
        "--torchcompile",
        "--output",
        "o",
        "-b",
        "64",
        "-j",
        "2",
        "--data-dir",
        "d",
    )
    assert ours == timms
    assert config_of("--model-ema").ema_decay == EMA_DECAY
    assert config_of("--model-ema", "--model-ema-decay", "0.9").ema_decay == 0.9


def test_config_file_sits_between_the_preset_and_the_flags(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump({"preset": "small-data", "epochs": 7, "lr": 0.002, "init": "impulse[kernel_size=5]"})
    )
    config = config_of("-c", str(path), "--lr", "0.003")
    assert (config.preset, config.epochs, config.lr, config.init) == ("small-data", 7, 0.003, "impulse[kernel_size=5]")
    assert config.mixup == 0.8  # from the preset, which the file named
    assert config_of("--config", str(path), "--preset", "cpu-quick").preset == "cpu-quick"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr: 0.1\nlearning_rate: 2\n", "unknown setting(s) learning_rate; the settings are "),
        ("- a\n- b\n", "expected a mapping of settings (a run's config.yaml), got list"),
        ("lr: [1,\n", "not valid YAML"),
        ("epochs: 0\n", ": epochs must be >= 1, got 0"),
    ],
)
def test_bad_config_files_fail_in_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["train", "-c", str(path), "--out", str(tmp_path / "run")]) == 2
    assert message in capsys.readouterr().err
    assert main(["train", "-c", str(tmp_path / "none.yaml")]) == 2
    assert f"--config {tmp_path / 'none.yaml'}: no such file" in capsys.readouterr().err


def test_a_runs_config_yaml_fed_back_repeats_the_run_bit_for_bit(tmp_path):
    first, again = tmp_path / "first", tmp_path / "again"
    assert main(["train", *FLAGS, "--epochs", "2", "--init", "impulse[target_fidelity=0.9]", "--out", str(first)]) == 0
    assert main(["train", "-c", str(first / "config.yaml"), "--output", str(again)]) == 0
    a, b = (
        torch.load(first / "last.pt", map_location="cpu", weights_only=True),
        torch.load(again / "last.pt", map_location="cpu", weights_only=True),
    )
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    clock = ("time", "img_per_s", "epoch_seconds", "eval_seconds")
    strip = lambda run: [{k: v for k, v in r.items() if k not in clock} for r in MetricsLog(run).epochs()]  # noqa: E731
    assert strip(first) == strip(again)
    assert read_config(again / "config.yaml") == dataclasses.replace(read_config(first / "config.yaml"), out=str(again))
    assert main(["train", "--resume", "-c", str(first / "config.yaml"), "--out", str(first)]) == 2


def test_config_yaml_records_what_auto_became_and_the_versions(tmp_path):
    import timm

    import structinit

    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(run)]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["device"] == "auto" and saved["amp"] == "auto"  # what was asked
    env = saved["environment"]
    assert env["device"] == "cpu" and env["amp_dtype"] in ("bfloat16", "float32")
    assert env["device_name"].endswith(f"({torch.backends.cpu.get_cpu_capability()})")
    assert (env["torch"], env["timm"], env["structinit"]) == (
        torch.__version__,
        timm.__version__,
        structinit.__version__,
    )
    assert env["world_size"] == 1


def test_config_yaml_of_structinit_0_1_still_reads_and_resumes(tmp_path):
    run = tmp_path / "old"
    assert (
        main(
            [
                "train",
                *FLAGS,
                "--epochs",
                "1",
                "--init",
                "impulse[target_fidelity=0.9,kernel_size=3]",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    saved = yaml.safe_load((run / "config.yaml").read_text())
    del saved["environment"]
    old = {**saved, "init": "impulse", "init_kwargs": {"target_fidelity": 0.9}, "kernel_size": 3}
    (run / "config.yaml").write_text(yaml.safe_dump(old, sort_keys=False))
    assert read_config(run / "config.yaml").init == "impulse[target_fidelity=0.9,kernel_size=3]"
    assert main(["train", "--resume", "--out", str(run), "--epochs", "2", "--quiet"]) == 0
    events = [r["event"] for r in MetricsLog(run).records() if "event" in r]
    assert events == ["resume", "environment"]  # a 0.1 run recorded no environment: now it has one
    assert "environment" in yaml.safe_load((run / "config.yaml").read_text())


def test_tensorboard_and_wandb_get_every_epoch_once_across_a_resume(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    wandb = pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.proto.event_pb2 import SessionLog

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    argv = ["train", *FLAGS, "--epochs", "3", "--log", "tensorboard,wandb", "--out", str(run)]
    assert main([*argv, "--stop-after", "2"]) == 0
    # a crash after epoch 2 was logged to TensorBoard but before it was checkpointed: the resume
    # from epoch 1 must drop it there too
    checkpoint = torch.load(run / "prev.pt", map_location="cpu", weights_only=True)
    torch.save(checkpoint, run / "last.pt")
    assert main(["train", "--resume", "--out", str(run), "--quiet"]) == 0
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("test_top1")}
    expected = {r["epoch"]: r["test_top1"] for r in MetricsLog(run).epochs()}
    assert sorted(logged) == [1, 2, 3] and logged == pytest.approx(expected)
    # the files themselves tell every reader to drop the orphaned epoch 2: a restart marker at step 2
    raw = [e for path in sorted((run / "tensorboard").glob("events.*")) for e in EventFileLoader(str(path)).Load()]
    assert [e.step for e in raw if e.session_log.status == SessionLog.START] == [2]
    sessions = sorted((run / "wandb").glob("offline-run-*"))
    assert len(sessions) == 2 and all(p.name.endswith((run / "wandb_id").read_text()) for p in sessions)  # one run
    assert wandb.run is None  # finished


def test_unknown_logger_fails_before_training(tmp_path, capsys):
    assert main(["train", "--log", "tensorboard,mlflow", "--out", str(tmp_path / "r")]) == 2
    assert "--log: unknown logger(s) mlflow; choose from tensorboard, wandb" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
