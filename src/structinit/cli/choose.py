"""`structinit choose`: which init for my data (studies/choose.py), its flags and its output."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ..training.setting import int_list
from .train_flags import add_train_arguments, file_values, train_config, train_values


def add_choose_command(commands: argparse._SubParsersAction) -> None:
    choose = commands.add_parser(
        "choose",
        help="which init for my data: a short comparison on a validation split, and a verdict",
        description="Train the structured init, mimetic and kaiming on PyTorch's base and the structured init's "
        "norm-matched control on a validation split carved from the training images, at least two seeds each, "
        "sized to --minutes, and say which init to use, by how much, and whether the margin exceeds the seeds' "
        "spread.",
        usage="structinit choose [DIR] [--data SPEC] [--model NAME] [--minutes M] [--seeds S,S] [options]",
        add_help=False,
    )
    groups = add_train_arguments(choose, grid=True)
    common = groups["common"].add_argument
    common(
        "--minutes",
        type=float,
        default=10.0,
        help="the time the comparison may take, about: it sets the epochs unless --epochs does (default: 10)",
    )
    common("--seeds", default="0,1", help="comma-separated seeds, at least two (default: 0,1)")
    common(
        "--structured",
        help="the structured init to test (default: the paper's form, the Q/K alone on PyTorch's base)",
    )
    common("--parallel", "--jobs", type=int, default=1, metavar="K", help="K runs at once (default: 1)")
    groups["run"].add_argument(
        "--rerun", action="store_true", help="train again (from scratch) run directories made with another recipe"
    )
    choose.set_defaults(out="runs/choose")


def run_choose(args: argparse.Namespace) -> int:
    from ..studies.choose import STRUCTURED, check_minutes, check_structured, choose

    check_minutes(args.minutes)
    if args.parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
    base = train_config(args)
    if args.per_class:
        sizes = int_list(args.per_class, "--per-class")
        if len(sizes) > 1:
            raise ValueError("--per-class: choose trains at one subset size; give one K")
        base = dataclasses.replace(base, per_class=sizes[0])
    seeds = int_list(args.seeds, "--seeds")
    structured = check_structured(args.structured or STRUCTURED)
    asked = {**file_values(args), **train_values(args)}
    choice = choose(
        base,
        args.minutes,
        seeds,
        args.out,
        structured,
        args.parallel,
        epochs=args.epochs,
        fit_batch="batch_size" not in asked,
        rerun=args.rerun,
    )
    row, config, plan = choice.rows[0], choice.config, choice.plan
    images = f"{config.per_class} images a class" if config.per_class else "every training image"
    sized = f", sized to --minutes {plan.minutes:g}" if plan.minutes is not None else ""
    print(
        f"compared: {len(plan.inits)} inits x seeds {','.join(map(str, plan.seeds))} on {row['dataset']} "
        f"({images}, {config.val_per_class} a class held out for validation), {config.epochs} epochs "
        f"({row['steps']} steps at batch {config.batch_size}{sized}) of {config.model}, "
        f"{row['device'] or 'this machine'}"
    )
    print(choice.verdict.text())
    print(f"{len(choice.rows)} runs; results.md, curves.png and summary.png in {Path(args.out)}")
    return 0
