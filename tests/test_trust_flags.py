"""timm's flags checked (issue 60): each a one-line refusal naming the flag, before anything is made."""

import pytest

from structinit.cli import main


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--opt-betas", "0.9"], "--opt-betas takes two numbers in [0, 1), e.g. 0.9,0.999, got 0.9"),
        (
            ["--opt-betas", "0.9,0.99,0.999"],
            "--opt-betas takes two numbers in [0, 1), e.g. 0.9,0.999, got 0.9,0.99,0.999",
        ),
        (["--opt-betas", "0.9,1.5"], "--opt-betas takes two numbers in [0, 1)"),
        (["--opt", "sgd", "--opt-betas", "0.9,0.99"], "--opt-betas given, but --opt sgd takes no betas: leave it out"),
        (
            ["--sched", "multistep", "--decay-milestones=-5,3"],
            "--decay-milestones takes increasing epochs >= 1, got -5,3",
        ),
        (
            ["--sched", "multistep", "--decay-milestones", "5,3"],
            "--decay-milestones takes increasing epochs >= 1, got 5,3",
        ),
        (["--warmup-lr", "10", "--lr", "0.001"], "--warmup-lr 10.0 exceeds --lr 0.001: the warm-up would fall to it"),
        (["--input-size", "0", "8", "8"], "--input-size 0 8 8: the data (digits) has 1 channel(s); give C = 1"),
        (["--input-size", "3", "8", "8"], "--input-size 3 8 8: the data (digits) has 1 channel(s); give C = 1"),
    ],
)
def test_a_bad_timm_flag_is_one_line_and_makes_nothing(tmp_path, capsys, flags, message):
    assert main(["train", *flags, "--epochs", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_the_input_size_of_the_datas_channels_is_taken(tmp_path):
    argv = ["train", "--input-size", "1", "8", "8", "--per-class", "4", "-b", "8", "--epochs", "1", "--quiet"]
    assert main([*argv, "--model-kwargs", "depth=1", "--out", str(tmp_path / "r")]) == 0


def test_a_setting_too_long_for_the_runs_record_is_refused_before_training(tmp_path, capsys):
    label = "impulse[target_fidelity=0.9,solver=" + "k" * 70_000 + "]"
    assert main(["train", "--init", label, "--epochs", "1", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err) < 400 and not (tmp_path / "r").exists()  # a value is quoted, not printed whole
    assert main(["train", "--data-root", "d" * 20_000, "--epochs", "1", "--out", str(tmp_path / "r")]) == 2
    assert "--data-root: 20,002 characters; a run's settings must fit its config.yaml (16 KiB of them)" in (
        capsys.readouterr().err
    )


def test_compare_refuses_auto_beside_the_label_it_stands_for(tmp_path, capsys):
    argv = [
        "compare",
        "--inits",
        "auto,mimetic[base=kaiming]",
        "--seeds",
        "0",
        "--epochs",
        "1",
        "--out",
        str(tmp_path / "g"),
    ]
    assert main(argv) == 2
    assert (
        "--inits lists auto and mimetic[base=kaiming], which auto stands for on vit_digits: each init once"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "g").exists()


def test_a_randaugment_string_with_a_part_timm_does_not_read_is_refused(tmp_path, capsys):
    assert main(["train", "--aa", "rand-zz", "--epochs", "1", "--out", str(tmp_path / "r")]) == 2
    assert "--randaugment rand-zz: 'zz' is none of timm's parts (m, n, p, mstd, mmax, inc" in capsys.readouterr().err
    assert main(["train", "--aa", "rand-m9-n2-mstd0.5-inc1", "--epochs", "0", "--out", str(tmp_path / "r")]) == 2
    assert "--randaugment" not in capsys.readouterr().err  # a timm string passes (the epochs are refused)
