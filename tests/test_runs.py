"""Runs you can trust: resume semantics, safe and durable checkpoints, locks, one-line errors and
seeds that mean it. Tiny runs on the digits."""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from structinit import files as files_module
from structinit.cli import main
from structinit.errors import RunError
from structinit.studies.grid import compare, run_dir
from structinit.studies.tables import results_markdown
from structinit.training import TrainConfig, read_config, resume_config, train
from structinit.training import checkpoint as checkpoint_module
from structinit.training.lock import RunLock
from structinit.training.record import MetricsLog
from structinit.training.run import TrainingDiverged

FAST = dict(data="digits", per_class=20, model="vit_digits", model_kwargs={"depth": 2}, batch_size=50, quiet=True)
FLAGS = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet"]
CLOCK = ("time", "img_per_s", "epoch_seconds", "eval_seconds")


def epochs_logged(run: Path) -> list[int]:
    return [r["epoch"] for r in MetricsLog(run).epochs()]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "last.pt", map_location="cpu", weights_only=True)["model"]


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


# --- resume semantics -----------------------------------------------------------------------------


def test_resume_extends_a_finished_run_with_a_new_lr_and_records_the_change(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "2", "--out", str(out)]) == 0
    assert main(["train", "--resume", "--out", str(out), "--epochs", "3", "--lr", "5e-4", "--quiet"]) == 0
    assert "finished: test top-1" in capsys.readouterr().out
    config = read_config(out / "config.yaml")
    assert (config.epochs, config.lr, config.resume) == (3, 5e-4, False)
    events = [r for r in MetricsLog(out).records() if "event" in r]
    assert events == [{"event": "resume", "after_epoch": 2, "changed": {"epochs": [2, 3], "lr": [1e-3, 5e-4]}}]
    assert epochs_logged(out) == [1, 2, 3]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["epochs_done"] == 3 and "test_top1" in summary


def test_resume_refuses_settings_that_would_make_another_run(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "1", "--out", str(out)]) == 0
    before = files(out)
    args = ["train", "--resume", "--out", str(out), "--batch-size", "32", "--init", "timm", "--data", "digits"]
    assert main([*args, "--epochs", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--resume cannot change" in err
    assert "--batch-size 32 (the run has 50)" in err and "--init 'timm' (the run has 'auto')" in err
    assert "--data" not in err  # the same data is no change
    assert main(["train", "--resume", "--out", str(out), "--epochs", "0"]) == 2
    assert main(["train", "--resume", "--out", str(out), "--quiet"]) == 0  # finished, nothing asked: no-op
    assert files(out) == before


def test_resuming_a_finished_run_keeps_every_file_and_the_grid_still_reads_it(tmp_path):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    compare(base, ["timm"], [0], [10], tmp_path)
    run = tmp_path / "per_class_10" / "timm-seed0"
    before = files(run)
    summary = train(resume_config(run))
    assert summary["finished"] and "test_top1" in summary
    assert files(run) == before
    assert len(compare(base, ["timm"], [0], [10], tmp_path)) == 1


# --- checkpoints ----------------------------------------------------------------------------------


class Planted:
    """Unpickling this runs code: what a crafted checkpoint would do."""

    def __reduce__(self):
        return (os.system, (f"touch {PLANTED_MARKER}",))


PLANTED_MARKER = Path("/tmp/structinit-planted-code-ran")


def test_a_crafted_checkpoint_is_never_unpickled(tmp_path, capsys):
    out = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=1, out=str(out)))
    state = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    torch.save({**state, "extra": Planted()}, out / "last.pt")
    PLANTED_MARKER.unlink(missing_ok=True)
    assert main(["attention", str(out), "--out", str(tmp_path / "a.png")]) == 2
    assert "structinit will not open it" in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(out), "--epochs", "2"]) == 2
    assert "upgrade-checkpoint" in capsys.readouterr().err
    assert not PLANTED_MARKER.exists()


def test_a_checkpoint_of_the_old_format_is_upgraded_on_request(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=2, stop_after=1, out=str(out)))
    state = torch.load(out / "last.pt", map_location="cpu", weights_only=True)
    import numpy as np

    old_rng = {"torch": state["rng"]["torch"], "numpy": np.random.get_state(), "python": random.getstate()}
    torch.save({**state, "rng": old_rng, "scheduler": {"t_initial": 8}}, out / "last.pt")
    with pytest.raises(RunError, match="upgrade-checkpoint"):
        train(resume_config(out))
    assert main(["upgrade-checkpoint", str(out / "last.pt")]) == 0
    assert train(resume_config(out))["finished"]


def test_a_diverging_run_keeps_only_good_checkpoints_and_names_files_that_exist(tmp_path, capsys):
    out = tmp_path / "run"
    # one step per epoch: the first step with lr 1e6 already ruins the weights
    args = ["train", "--per-class", "5", "--batch-size", "50", "--epochs", "3", "--quiet", "--out", str(out)]
    assert main([*args, "--lr", "1e6", "--warmup-epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint was kept (it diverged in its first epoch): start again with a lower --lr" in err
    assert not (out / "last.pt").exists() and epochs_logged(out) == []
    # the same directory starts again (it holds no checkpoint), rather than asking for --resume
    assert main(["train", "--resume", "--out", str(out)]) == 2
    assert "has no checkpoint yet (it stopped before its first epoch ended): run it again without --resume" in (
        capsys.readouterr().err
    )
    assert main([*args, "--lr", "1e-3", "--stop-after", "1"]) == 0


def test_divergence_after_a_good_epoch_points_at_it_and_resume_with_a_lower_lr_goes_on(tmp_path, monkeypatch):
    out = tmp_path / "run"
    train(TrainConfig(**FAST, epochs=3, stop_after=1, out=str(out)))
    good = weights(out)
    real = torch.optim.AdamW.step

    def explode(self, *a, **k):
        result = real(self, *a, **k)
        for group in self.param_groups:
            for p in group["params"]:
                p.data.fill_(float("inf"))
        return result

    monkeypatch.setattr(torch.optim.AdamW, "step", explode)
    with pytest.raises(TrainingDiverged) as caught:
        train(resume_config(out))
    message = str(caught.value)
    assert f"the last good checkpoint is {out / 'last.pt'} (epoch 1)" in message and "--resume --lr" in message
    assert all(torch.equal(good[k], v) for k, v in weights(out).items())
    monkeypatch.undo()
    assert train(resume_config(out, lr=5e-4))["finished"]
    assert epochs_logged(out) == [1, 2, 3]


def test_a_full_disk_during_a_save_is_one_line_leaves_no_temporary_file_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real, calls = torch.save, {"n": 0}

    def full(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 2:  # the checkpoint of epoch 2
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(obj, f, *a, **k)

    monkeypatch.setattr(checkpoint_module.torch, "save", full)
    with pytest.raises(RunError, match=r"no space left on the device holding .*last.pt: free some and --resume"):
        train(TrainConfig(**FAST, epochs=3, out=str(out)))
    monkeypatch.undo()
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
    assert epochs_logged(out) == [1]
    train(resume_config(out))
    assert epochs_logged(out) == [1, 2, 3]


@pytest.mark.parametrize("crash_in", ["rename", "log"])
def test_a_crash_between_checkpoint_and_log_neither_loses_nor_repeats_an_epoch(tmp_path, monkeypatch, crash_in):
    """A crash just before the checkpoint's rename (the epoch is redone) or just after it, before the
    epoch is logged (the checkpoint's copy of the line is put back): each epoch is logged once, and
    the weights equal an uninterrupted run's."""
    full = tmp_path / "full"
    train(TrainConfig(**FAST, epochs=3, out=str(full)))
    out = tmp_path / "run"
    if crash_in == "rename":
        real, calls = os.replace, {"n": 0}

        def crash(src, dst):
            calls["n"] += str(dst).endswith("last.pt")
            if calls["n"] == 3:  # the checkpoint of epoch 3
                raise KeyboardInterrupt
            return real(src, dst)

        monkeypatch.setattr(files_module.os, "replace", crash)
    else:
        real_append = MetricsLog.append

        def crash(self, record):
            if record.get("epoch") == 2:
                raise KeyboardInterrupt
            return real_append(self, record)

        monkeypatch.setattr(MetricsLog, "append", crash)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**FAST, epochs=3, out=str(out)))
    monkeypatch.undo()
    train(resume_config(out))
    assert epochs_logged(out) == [1, 2, 3]
    assert_same_weights(full, out)
    strip = lambda run: [{k: v for k, v in r.items() if k not in CLOCK} for r in MetricsLog(run).epochs()]  # noqa: E731
    assert strip(full) == strip(out)


def test_kill_minus_nine_at_random_moments_then_resume_equals_an_uninterrupted_run(tmp_path):
    """Both runs in subprocesses with one thread each, so that they round alike."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "structinit", "train", *FLAGS, "--epochs", "5"]
    full, out = tmp_path / "full", tmp_path / "run"
    subprocess.run([*command, "--out", str(full)], env=env, check=True, capture_output=True)
    rng, kills = random.Random(0), 0
    for attempt in range(4):
        resume = ["--resume"] if (out / "config.yaml").exists() else []
        process = subprocess.Popen([*command, "--out", str(out), *resume], env=env, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 120  # past start-up and into epoch attempt + 1, then anywhere in it
        while time.monotonic() < deadline and process.poll() is None and len(epochs_logged(out)) < attempt + 1:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.5))
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            kills += 1
        process.wait()
    if not (out / "summary.json").exists():
        subprocess.run([*command, "--out", str(out), "--resume"], env=env, check=True, capture_output=True)
    assert kills >= 2
    assert epochs_logged(out) == [1, 2, 3, 4, 5]
    assert_same_weights(full, out)


# --- locks and grids ------------------------------------------------------------------------------


def test_a_second_process_on_a_run_or_a_grid_is_refused(tmp_path):
    out = tmp_path / "run"
    with RunLock(out), pytest.raises(RunError, match=rf"{out} is in use by pid {os.getpid()} \(run\): wait for it"):
        train(TrainConfig(**FAST, epochs=1, out=str(out)))
    train(TrainConfig(**FAST, epochs=1, out=str(out)))  # free again once the holder is gone
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    with RunLock(tmp_path / "grid", "grid"), pytest.raises(RunError, match="is in use by"):
        compare(base, ["timm"], [0], [10], tmp_path / "grid")


def test_compare_refuses_a_run_made_with_another_recipe_and_reruns_it_on_request(tmp_path, capsys):
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    compare(base, ["timm"], [0], [10], tmp_path)
    other = TrainConfig(**{**FAST, "per_class": None, "lr": 5e-4}, epochs=1)
    with pytest.raises(RunError, match=r"was made with --lr 0.001 \(now 0.0005\): use another --out, or --rerun"):
        compare(other, ["timm"], [0], [10], tmp_path)
    rows = compare(other, ["timm"], [0], [10], tmp_path, rerun=True)
    assert len(rows) == 1 and rows[0]["recipe"] != ""
    config = yaml.safe_load((tmp_path / "per_class_10" / "timm-seed0" / "config.yaml").read_text())
    assert config["lr"] == 5e-4


def test_compare_refuses_a_run_whose_init_label_now_resolves_to_other_options(tmp_path):
    """A run made before a default changed has the same label and config: its recorded options tell
    it apart, so a grid does not count it as a run of the new default."""
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    compare(base, ["impulse"], [0], [10], tmp_path)
    record = tmp_path / "per_class_10" / "impulse-seed0" / "init_report.json"
    report = json.loads(record.read_text())
    report["options"].update(target_fidelity=0.3, pos_scale=None)  # what the soft default of 144326c recorded
    del report["options"]["base"]  # an option it did not have yet
    record.write_text(json.dumps(report))
    with pytest.raises(RunError, match=r"was made with init 'impulse' with target_fidelity=0.3 \(now None\), "
                       r"base='keep' \(now 'kaiming'\): use another --out, or --rerun"):  # fmt: skip
        compare(base, ["impulse"], [0], [10], tmp_path)
    rows = compare(base, ["impulse"], [0], [10], tmp_path, rerun=True)
    assert len(rows) == 1 and json.loads(record.read_text())["options"]["target_fidelity"] is None
    compare(base, ["impulse"], [0], [10], tmp_path)  # recorded and resolved agree: nothing is refused


def test_a_run_older_than_an_option_counts_as_its_default(tmp_path):
    """impulse-neurips now takes the authors' base (base=kaiming); a run that recorded no base ran on the
    model's own (keep): refused under the new label, accepted under impulse-neurips[base=keep]."""
    base = TrainConfig(**{**FAST, "per_class": None}, epochs=1)
    label = "impulse-neurips[base=keep]"
    compare(base, [label], [0], [10], tmp_path)
    record = run_dir(tmp_path, 10, label, 0) / "init_report.json"
    report = json.loads(record.read_text())
    del report["options"]["base"]
    record.write_text(json.dumps(report))
    compare(base, [label], [0], [10], tmp_path)  # base missing = keep: the same init
    moved = tmp_path / "per_class_10" / "impulse-neurips-seed0"
    run_dir(tmp_path, 10, label, 0).rename(moved)
    config = yaml.safe_load((moved / "config.yaml").read_text())
    (moved / "config.yaml").write_text(yaml.safe_dump({**config, "init": "impulse-neurips", "out": str(moved)}))
    with pytest.raises(RunError, match=r"init 'impulse-neurips' with base='keep' \(now 'kaiming'\)"):
        compare(base, ["impulse-neurips"], [0], [10], tmp_path)


def test_results_never_average_rows_of_different_recipes():
    row = dict(dataset="d", model="m", heads=4, per_class=10, epochs=1, split="test", init="timm", best_top1=50.0)
    row.update(top5=90.0, train_loss=1.0)
    rows = [{**row, "recipe": "aaa", "top1": 40.0}, {**row, "recipe": "bbb", "top1": 60.0}]
    table = results_markdown(rows)
    first, second = table.split("**d**")[1:]
    assert "recipe aaa" in first and "| timm | 1 | 40.00 |" in first
    assert "recipe bbb" in second and "| timm | 1 | 60.00 |" in second
    assert "recipe" not in results_markdown(rows[:1])


# --- errors ---------------------------------------------------------------------------------------


def _tiny_run(tmp_path: Path) -> Path:
    run = tmp_path / "tiny"
    if not (run / "summary.json").exists():
        train(TrainConfig(**FAST, epochs=1, out=str(run)))
    return run


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--epochs", "0"], "--epochs must be >= 1, got 0"),
        (["train", "--smoothing", "1.5"], "--smoothing must be >= 0 and < 1, got 1.5"),
        (["train", "--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["train", "--stop-after", "0"], "--stop-after must be >= 1, got 0"),
        (["train", "--lr", "-1"], "--lr must be > 0, got -1.0"),
        (["train", "--device", "nonsense"], "--device 'nonsense': expected auto, cpu, cuda, cuda:N or mps"),
        (["train", "--out", "{file}/run", "--epochs", "1"], "Not a directory"),
        (["init", "vit_w96_d4_p4", "--model-kwargs", "img_size=32", "--json", "{dir}"], "is a directory"),
        (
            ["init", "vit_w96_d4_p4", "--model-kwargs", "img_size=32", "--init", "impulse[target_fidelity=abc]"],
            "option target_fidelity of the impulse init takes a number, got 'abc'",
        ),
        (["compare", "--seeds", ","], "--seeds needs at least one integer, got ','"),
        (["attention", "runs/nope"], "runs/nope is neither a run directory nor a timm model name or preset"),
        (["attention", "{run}", "--images", "0"], "--images must be >= 1, got 0"),
        (["attention", "{run}", "--images", "-5"], "--images must be >= 1, got -5"),
        (["attention", "{truncated}"], "is truncated or damaged"),
        (
            ["attention", "vit_tiny_patch16_224", "--model-kwargs", "img_size=32,patch_size=4"],
            "img_size=32 does not fit the 8 px images of the data: leave img_size out",
        ),
        (["train", "--resume", "--out", "{dir}/none"], "--resume: there is no run in"),
    ],
)
def test_bad_input_ends_in_one_line_that_names_the_fix(tmp_path, capsys, argv, message):
    (tmp_path / "file").write_text("")
    run = _tiny_run(tmp_path) if any("{run}" in a or "{truncated}" in a for a in argv) else None
    if any("{truncated}" in a for a in argv):
        data = (run / "last.pt").read_bytes()
        (run / "last.pt").write_bytes(data[: len(data) // 2])
    fill = dict(file=tmp_path / "file", dir=tmp_path, run=run, truncated=run)
    argv = [a.format(**fill) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_a_gpu_that_is_not_there_is_one_line(capsys):
    assert main(["train", "--device", "cuda", "--epochs", "1"]) == 2
    assert "--device cuda: PyTorch sees no CUDA GPU here; use --device cpu (or auto)" in capsys.readouterr().err


def test_empty_class_folders_and_classes_in_one_split_only_are_errors(tmp_path):
    from PIL import Image

    from structinit.data.datasets import load_data

    root = tmp_path / "data"
    for split, classes in (("train", "abc"), ("test", "abc")):
        for cls in classes:
            (root / split / cls).mkdir(parents=True)
            Image.new("RGB", (8, 8)).save(root / split / cls / "0.png")
    (root / "train" / "d").mkdir()
    with pytest.raises(ValueError, match=r"class folder\(s\) without images in .*train: d"):
        load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")
    (root / "train" / "d").rmdir()
    (root / "test" / "e").mkdir()
    Image.new("RGB", (8, 8)).save(root / "test" / "e" / "0.png")
    with pytest.raises(ValueError, match=r"class\(es\) e in .*test but not in .*train"):
        load_data(f"imagefolder:{root}", cache_dir=tmp_path / "cache")


# --- seeds ----------------------------------------------------------------------------------------


def test_the_init_gives_the_same_weights_however_the_model_was_constructed():
    """Built under two global seeds, the models differ in everything; the impulse init reads only the
    patch embedding (whose span it keeps the maps blind to) among the weights it leaves, so with that
    equal, every weight it writes or reads is the same."""
    from structinit import initialize
    from structinit.models import create_model

    states, patch_embed = [], None
    for construction_seed in (1, 2):
        torch.manual_seed(construction_seed)
        model = create_model("vit_w96_d4_p4", num_classes=10, in_chans=3, data_size=32)
        if patch_embed is not None:
            model.patch_embed.load_state_dict(patch_embed)
        patch_embed = model.patch_embed.state_dict()
        initialize(model, "impulse", seed=0)
        states.append({k: v for k, v in model.state_dict().items() if "attn" in k or k in ("pos_embed", "cls_token")})
    assert states[0].keys() == states[1].keys() and all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_structinit_init_is_the_same_in_two_fresh_processes(tmp_path):
    """`structinit init --seed` seeds the model's construction too: its whole report and every
    weight repeat (the digest covers the whole state dict), and another seed changes them."""
    reports = []
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        path = tmp_path / f"{name}.json"
        command = [sys.executable, "-m", "structinit", "init", "vit_w96_d4_p4", "--model-kwargs", "img_size=32"]
        subprocess.run([*command, "--seed", str(seed), "--json", str(path)], capture_output=True, check=True)
        report = json.loads(path.read_text())
        report.pop("seconds")
        for layer in report["layers"]:
            layer.pop("seconds", None)
        reports.append(report)
    assert reports[0] == reports[1]
    assert len(reports[0]["weights_sha256"]) == 64
    assert reports[2]["weights_sha256"] != reports[0]["weights_sha256"]


def test_weights_sha256_tells_weights_apart_by_one_bit_name_dtype_or_shape():
    state = {"a": torch.randn(3, 4), "b": torch.arange(5)}
    digest = files_module.weights_sha256(state)
    assert files_module.weights_sha256({k: v.clone() for k, v in state.items()}) == digest
    one_ulp = state["a"].clone()
    one_ulp[1, 2] = torch.nextafter(one_ulp[1, 2], torch.tensor(float("inf")))
    for changed in (
        {**state, "a": one_ulp},
        {"A": state["a"], "b": state["b"]},
        {**state, "a": state["a"].double()},
        {**state, "a": state["a"].reshape(4, 3)},
    ):
        assert files_module.weights_sha256(changed) != digest
