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
