"""`structinit choose`: which init for my data (studies/choose.py), its flags and its output."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..training.setting import int_list
from .train_flags import add_train_arguments, file_values, train_config, train_values

# train's flags that choose sets itself: every run evaluates after every epoch, on the whole validation split
SET_BY_CHOOSE = ("--eval-every", "--eval-per-class", "--eval-final", "--snapshot-epochs")
CANDIDATES = "impulse (or --structured), mimetic[base=kaiming], kaiming, timm and qk-norm[...]"


def add_choose_command(commands: argparse._SubParsersAction) -> None:
    choose = commands.add_parser(
        "choose",
        help="which init for my data: a short comparison on a validation split, and a verdict",
        description=f"Train {CANDIDATES} (the structured init's Q/K norm on PyTorch's base, no structure) on a "
        "validation split carved from the training images, at least two seeds each, within --minutes, and say "
        "which init to use, by how much after how many steps, and whether the margin exceeds the seeds' spread; "
        "too short to tell where the runs are not evidence.",
        usage="structinit choose [DIR] [--data SPEC] [--model NAME] [--minutes M] [--seeds S,S] [options]",
        add_help=False,
    )
    groups = add_train_arguments(choose, grid=True)
    common = groups["common"].add_argument
    common(
        "--minutes",
        type=float,
        default=10.0,
        help="the most the comparison may take, start to verdict: it sets the epochs unless --epochs does "
        "(default: 10)",
    )
    common("--seeds", default="0,1", help="comma-separated seeds, at least two (default: 0,1)")
    common(
        "--structured",
        help="the structured init to test (default: impulse, the paper's form: the Q/K alone on PyTorch's base)",
    )
    common("--parallel", "--jobs", type=int, default=1, metavar="K", help="K runs at once (default: 1)")
    groups["run"].add_argument(
        "--rerun", action="store_true", help="compare again from scratch: the comparison in --out is deleted first"
    )
    flags = choose._option_string_actions
    flags["--model"].help = (
        "timm model or preset (structinit init --list-models) (default: vit_digits on digits; other data: "
        "vit_tiny_fit, timm's ViT-Ti at the images' size with an 8x8 grid of tokens or more)"
    )
    flags["--epochs"].help = "epochs a run, instead of what --minutes allows (default: sized to --minutes)"
    for name in SET_BY_CHOOSE:
        flags[name].help = argparse.SUPPRESS
    choose.set_defaults(out="runs/choose")


def run_choose(args: argparse.Namespace) -> int:
    from ..studies.choose import STRUCTURED, check_minutes, check_structured, choose, default_model

    check_minutes(args.minutes)
    given = [f for f in SET_BY_CHOOSE if getattr(args, f[2:].replace("-", "_"), None) not in (None, [])]
    if given:
        raise ValueError(f"{given[0]}: choose sets it itself (every run is evaluated after every epoch)")
    asked = {**file_values(args), **train_values(args)}
    base = train_config(args, **({} if "model" in asked else {"model": default_model(asked.get("data", "digits"))}))
    if args.per_class:
        sizes = int_list(args.per_class, "--per-class")
        if len(sizes) > 1:
            raise ValueError("--per-class: choose trains at one subset size; give one K")
        base = dataclasses.replace(base, per_class=sizes[0])
    choice = choose(
        base,
        args.minutes,
        int_list(args.seeds, "--seeds"),
        args.out,
        check_structured(args.structured or STRUCTURED),
        args.parallel,
        epochs=args.epochs,
        fit_batch="batch_size" not in asked,
        rerun=args.rerun,
        started=getattr(args, "started", None),
        show=not base.quiet,
    )
    print_choice(choice, args)
    return 0


def print_choice(choice, args: argparse.Namespace) -> None:
    """What was compared, the verdict, what is left to do (as verdict.md keeps them) and where the files are."""
    print("\n".join(choice.lines()))
    kept = "results.md (the verdict's table), verdict.md and curves.png" if choice.verdict is not None else "runs"
    print(f"{kept} in {Path(args.out)}")
