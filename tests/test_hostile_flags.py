"""No traceback on anything a user can type (issue 60): every flag of train, compare, choose and init fed a
handful of hostile values answers in one line (or, for init, works), and leaves no run directory. The runs
point at a missing image folder, so a value the flags accept ends at the data's one-line refusal."""

import argparse

import pytest

from structinit.cli import main
from structinit.cli.parser import build_parser

HOSTILE = ["", "-1", "nan", "1e400", "x" * 5000, "[", "a=1,,b"]
SKIP = {"help", "version", "folder", "command", "model"}  # no value, or the positional under test elsewhere


def value_flags(command: str) -> list[str]:
    """The command's flags that take a value (switches have none to be hostile with)."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    flags = []
    for action in commands.choices[command]._actions:
        if action.dest in SKIP or not action.option_strings or action.nargs == 0:
            continue
        if isinstance(action, argparse.BooleanOptionalAction) or (action.const is not None and action.nargs is None):
            continue
        flags.append(max(action.option_strings, key=len))
    return flags


def call(argv, capsys):
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's refusals: one line too (parser._OneLineErrors)
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.err


@pytest.mark.parametrize("command", ["train", "compare", "choose"])
def test_every_flag_of_a_training_command_answers_hostile_values_in_one_line(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    base = [command, "--data", f"imagefolder:{tmp_path / 'missing'}", "--quiet"]
    for flag in value_flags(command):
        for value in HOSTILE:
            nargs = 3 if flag == "--input-size" else 1
            code, err = call([*base, flag, *([value] * nargs)], capsys)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1, (flag, value[:20], err[-500:])
            assert lines[0].startswith(f"structinit {command}: error: ") and len(lines[0]) < 2000, (flag, value[:20])
            assert sorted(tmp_path.iterdir()) == before, (flag, value[:20])


def test_every_flag_of_init_answers_hostile_values_in_one_line_or_works(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for flag in value_flags("init"):
        for value in HOSTILE:
            code, err = call(["init", "vit_digits", flag, value, "--overwrite"], capsys)
            lines = err.strip().splitlines()
            assert code in (0, 2), (flag, value[:20])
            if code == 2:
                assert len(lines) == 1 and lines[0].startswith("structinit init: error: "), (
                    flag,
                    value[:20],
                    err[-500:],
                )


@pytest.mark.parametrize("model", HOSTILE)
def test_a_hostile_model_name_is_one_line(model, capsys):
    code, err = call(["init", model], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err[-500:]
