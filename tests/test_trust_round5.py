"""Runs you can trust, round five (issue 67): a write replaces only a regular file or nothing; whatever else
stands at the path (a FIFO, a socket, a directory, a device) is one line and stays as it was."""

import os
import socket
import stat

import pytest
import torch

from structinit.cli import main
from structinit.errors import RunError
from structinit.files import atomic_save, atomic_write_text, refuse_replacing

INIT = ["init", "vit_digits", "--model-kwargs", "depth=1,num_classes=10,in_chans=1,img_size=8", "--init", "timm"]


def special(path, kind):
    """A FIFO, a socket or a directory at `path` (a device needs root to make: the FIFO stands for it)."""
    if kind == "FIFO":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        return server
    else:
        path.mkdir()
    return None


KINDS = [("FIFO", stat.S_ISFIFO), ("socket", stat.S_ISSOCK), ("directory", stat.S_ISDIR)]


@pytest.mark.parametrize(("kind", "still"), KINDS)
def test_a_write_over_anything_but_a_regular_file_is_refused_and_leaves_it(tmp_path, kind, still):
    path = tmp_path / "s"  # short: a socket's path has a length limit
    held = special(path, kind)
    try:
        for write in (lambda: atomic_write_text(path, "x"), lambda: atomic_save({"a": torch.zeros(1)}, path)):
            with pytest.raises(RunError, match=f"is a {kind}, and structinit replaces only a regular file"):
                write()
            assert still(os.lstat(path).st_mode)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]  # no temporary file left
    finally:
        if held is not None:
            held.close()


def test_a_checkpoints_previous_copy_is_never_a_special_file(tmp_path):
    atomic_save({"a": torch.zeros(1)}, tmp_path / "last.pt")
    os.mkfifo(tmp_path / "prev.pt")
    with pytest.raises(RunError, match=r"prev\.pt is a FIFO"):
        atomic_save({"a": torch.ones(1)}, tmp_path / "last.pt", keep_previous=True)
    assert torch.load(tmp_path / "last.pt")["a"].item() == 0.0


def test_a_regular_file_or_nothing_may_be_replaced(tmp_path):
    refuse_replacing(tmp_path / "new")
    (tmp_path / "old").write_text("x")
    refuse_replacing(tmp_path / "old")
    atomic_write_text(tmp_path / "old", "y")
    assert (tmp_path / "old").read_text() == "y"


@pytest.mark.parametrize("flag", ["--json", "--save"])
def test_init_with_overwrite_refuses_a_fifo_where_it_writes_and_does_not_advise_overwrite(tmp_path, capsys, flag):
    fifo = tmp_path / ("out.json" if flag == "--json" else "out.safetensors")
    os.mkfifo(fifo)
    for extra in ([], ["--overwrite"]):
        assert main([*INIT, flag, str(fifo), *extra]) == 2
        err = capsys.readouterr().err
        assert f"{fifo} is a FIFO, and structinit replaces only a regular file" in err
        assert "--overwrite" not in err and len(err.strip().splitlines()) == 1
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --- every record read within a bound -------------------------------------------------------------------------


def test_a_metrics_log_with_a_huge_tail_is_damage_found_without_reading_it_whole(tmp_path):
    from structinit.training.record import MetricsLog

    line = {"epoch": 1, "step": 10, "train_loss": 1.0, "lr": 1e-3, "img_per_s": 50.0, "epoch_seconds": 1.0, "time": 1.0}
    log = MetricsLog(tmp_path)
    log.append(line)
    size = log.path.stat().st_size
    with open(log.path, "r+b") as file:
        file.truncate(size + (3 << 30))  # 3 GB of NUL bytes, sparse: read whole it would take as much memory
    with pytest.raises(RunError, match=r"metrics\.jsonl line 2 is damaged \(longer than 1,048,576 bytes"):
        log.records()
    with open(log.path, "r+b") as file:
        file.truncate(size + 100)  # a short torn tail: dropped, as a crash mid-write leaves
    assert log.records() == [line]


def test_a_json_record_larger_than_its_bound_is_refused_without_reading_it(tmp_path):
    from structinit.files import read_json_object

    path = tmp_path / "summary.json"
    path.write_text("{}")
    with open(path, "r+b") as file:
        file.truncate(3 << 30)
    with pytest.raises(RunError, match="is damaged \\(larger than 16,777,216 bytes, which no record of its kind is\\)"):
        read_json_object(path, "delete it")


# --- flags --------------------------------------------------------------------------------------------------


def test_json_dash_writes_the_report_to_standard_output_and_no_file_named_dash(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.chdir(tmp_path)
    assert main([*INIT, "--json", "-"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # standard output is the JSON alone
    assert report["method"] == "timm" and len(report["weights_sha256"]) == 64
    assert "weights sha256: " in captured.err and not (tmp_path / "-").exists()


def test_eval_final_subset_without_an_evaluation_subset_is_refused(tmp_path, capsys):
    argv = ["train", "--eval-final", "subset", "--epochs", "1", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "--eval-final subset evaluates on --eval-per-class's subset: give --eval-per-class K too" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "r").exists()


def test_a_tilde_in_the_caches_and_a_config_files_paths_is_the_home_folder(tmp_path, monkeypatch):
    from structinit.data.digests import cache_folder
    from structinit.inits.sharpness import cache_home
    from structinit.training.config_file import read_config_file

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("STRUCTINIT_CACHE", "~/solved")
    assert cache_home() == tmp_path / "solved" and cache_folder("~/decoded") == tmp_path / "decoded"
    config = tmp_path / "settings.yaml"
    config.write_text("data: imagefolder:~/photos\ncache_dir: ~/c\nout: ~/runs/r\ndata_root: ~/data\n")
    values = read_config_file(config)
    assert values["data"] == f"imagefolder:{tmp_path}/photos" and values["out"] == f"{tmp_path}/runs/r"
    assert values["cache_dir"] == f"{tmp_path}/c" and values["data_root"] == f"{tmp_path}/data"


def test_model_kwargs_given_twice_are_merged_and_a_key_given_twice_is_refused(tmp_path, capsys):
    from structinit.cli.parser import build_parser

    args = build_parser().parse_args(["train", "--model-kwargs", "depth=1", "--model-kwargs", "embed_dim=32"])
    assert args.model_kwargs == "depth=1,embed_dim=32"
    argv = ["train", "--model-kwargs", "depth=1", "--model-kwargs", "depth=2", "--out", str(tmp_path / "r")]
    assert main(argv) == 2
    assert "--model-kwargs: depth is given twice" in capsys.readouterr().err


def test_initialize_under_inference_mode_is_refused_before_the_model_changes(make_vit):
    import structinit
    from structinit.files import weights_sha256

    model = make_vit(depth=1)
    before = weights_sha256(model.state_dict())
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"called under torch\.inference_mode\(\)"):
        structinit.initialize(model, "impulse", seed=0)
    assert weights_sha256(model.state_dict()) == before
    structinit.initialize(model, "impulse", seed=0)  # outside it, as the message says


def test_save_init_under_a_file_named_as_a_folder_says_it_is_a_file(tmp_path, make_vit):
    import structinit

    (tmp_path / "notes").write_text("mine")
    with pytest.raises(ValueError, match=r"notes is a file, not a folder: .*init\.safetensors cannot be written"):
        structinit.save_init(make_vit(depth=1), tmp_path / "notes" / "init.safetensors")
    with pytest.raises(ValueError, match="does not exist: create it first"):
        structinit.save_init(make_vit(depth=1), tmp_path / "missing" / "init.safetensors")
    assert (tmp_path / "notes").read_text() == "mine"
