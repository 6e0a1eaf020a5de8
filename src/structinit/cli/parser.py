"""The `structinit` command's parser: its commands and their flags (train's, compare's and choose's
from train_flags.py, generated from the settings' declarations)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import __version__
from ..errors import one_line
from ..inits.labels import VARIANTS
from ..inits.names import METHOD_NAMES
from ..studies.launch import CLUSTERS
from ..version import DISTRIBUTION
from .choose import add_choose_command
from .model_flags import ASSIGNMENTS
from .train_flags import add_removed_flags, add_train_arguments

INIT_HELP = (
    f"init label: a method ({', '.join(sorted(METHOD_NAMES))}), a variant ({', '.join(VARIANTS)}), "
    "'default' (the model as constructed), or any of them with options in brackets, e.g. "
    "impulse[target_fidelity=0.9,kernel_size=5] (structinit init --list-options)"
)


class _Formatter(argparse.HelpFormatter):
    """argparse's help, each flag that takes a value with its default at the end unless it says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        help = action.help or ""
        if action.option_strings and action.nargs != 0 and "default" not in help:
            help += " (default: none)" if action.default is None else " (default: %(default)s)"
        return help


# the common flags: a usage line that fits (argparse's own lists every flag)
USAGE = "structinit train [DIR] [--data SPEC] [--model NAME] [--init LABEL] [--out DIR] [options]"


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(prog="structinit", description="The `structinit` command.")
    parser.add_argument("--version", action="version", version=f"structinit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_subparser)
    add_init_command(commands)

    train = commands.add_parser(
        "train",
        help="train one model (timm recipe); torchrun for several processes",
        usage=USAGE,
        add_help=False,
    )
    add_train_arguments(train)

    add_compare_command(commands)
    add_choose_command(commands)

    attention = commands.add_parser("attention", help="PNG of the attention maps per layer and head")
    add_target_arguments(attention, images=64, out="attention.png")
    attention.add_argument(
        "--pseudo-input",
        action="store_true",
        help="the maps on the pseudo input (the position embedding, no image: where an init's fidelity is "
        "measured) instead of on --images test images",
    )
    rank = commands.add_parser("rank", help="stable rank of the patch embeddings and every block's output")
    add_target_arguments(rank, images=256, out="rank.png")

    upgrade = commands.add_parser(
        "upgrade-checkpoint",
        help="rewrite checkpoints of structinit < 0.2 in the safe format (unpickles them: only files you trust)",
    )
    upgrade.add_argument("checkpoints", nargs="+", help="last.pt files")

    demo = commands.add_parser(
        "demo",
        help="the main job: timm vs mimetic vs impulse vs impulse-soft init on the embedded digits",
        description="Train the default ViT on the embedded 8x8 digits from four inits (timm, mimetic, impulse, "
        "impulse-soft), tabulate them and draw their attention maps at init and trained.",
    )
    demo.add_argument("--out", default="runs/demo", help="directory of the runs, tables and figures")
    demo.add_argument("--epochs", type=int, help="epochs of every run (default: sized to this CPU, at most 30)")
    demo.add_argument("--seeds", default="0", help="comma-separated seeds: each init trained once per seed")
    demo.add_argument("--quiet", action="store_true", help="no progress bars or lines")
    return parser


class _OneLineErrors(argparse.ArgumentParser):
    """A command's parser whose errors are one line naming the command, as every other error is (argparse's
    own prints its usage first, the whole flag list for train)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {one_line(message)} ({self.prog} --help lists the flags)\n")


def _subparser(**kwargs: Any) -> argparse.ArgumentParser:
    # no abbreviations: a mistyped flag (timm's --grad-accum-step) is refused, not read as the flag it begins
    return _OneLineErrors(formatter_class=_Formatter, allow_abbrev=False, **kwargs)


def add_init_command(commands: argparse._SubParsersAction) -> None:
    init = commands.add_parser("init", help="build a timm model, initialise it and print the report")
    init.add_argument("model", nargs="?", help="a preset or timm model name, e.g. vit_tiny_patch16_224")
    init.add_argument(
        "--list-models",
        action="store_true",
        help="print the supported families, their inits and the impulse init's fidelity on a small example each",
    )
    init.add_argument("--markdown", action="store_true", help="with --list-models: as docs/families.md's table")
    init.add_argument(
        "--list-options", action="store_true", help="print every init method's options: type, default, meaning"
    )
    init.add_argument("--init", "--method", default="impulse", help=INIT_HELP)
    init.add_argument("--seed", type=int, default=0, help="seed of the weights the init draws and timm's")
    init.add_argument("--teacher", help="the larger model of --init select: a timm name, a weights file or a run")
    init.add_argument(
        "--model-kwargs",
        help="timm.create_model keywords, e.g. img_size=32,patch_size=4 (or timm's a=1 b=2)",
        **ASSIGNMENTS,
    )
    init.add_argument("--num-classes", type=int, help="classes of the model's head (default: timm's, 1000)")
    init.add_argument("--img-size", type=int, help="the model's input size (default: the model's own)")
    add_removed_flags(init)
    init.add_argument("--json", metavar="PATH", help="also write the report as JSON (-: to standard output)")
    init.add_argument(
        "--save",
        metavar="PATH",
        help="write the initialised weights (.safetensors, .pth or .pt) for timm's --initial-checkpoint, "
        "load_state_dict or any trainer",
    )
    init.add_argument("--overwrite", action="store_true", help="replace an existing --save or --json file")


def add_compare_command(commands: argparse._SubParsersAction) -> None:
    grid = commands.add_parser(
        "compare",
        help="train a grid of inits x seeds (x subset sizes) and tabulate it",
        description="Train the same model and recipe from several inits and seeds (and subset sizes), "
        "each run in OUT/, then tabulate and plot them.",
        usage="structinit compare [DIR] [--data SPEC] [--model NAME] [--inits LABELS] [--seeds S,S] [options]",
        add_help=False,
    )
    groups = add_train_arguments(grid, grid=True)
    common, run = groups["common"].add_argument, groups["run"].add_argument
    common("--inits", default="timm,mimetic,impulse", help="comma-separated init labels (see train --help)")
    common("--seeds", default="0,1,2", help="comma-separated seeds")
    common(
        "--parallel",
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="K runs at once, each in its own process (on several GPUs: spread over them)",
    )
    run(
        "--threads",
        type=int,
        metavar="T",
        help="torch threads per run (default: the cores / K); a CPU grid repeats bit for bit at the same T",
    )
    run("--rerun", action="store_true", help="train again (from scratch) run directories made with another recipe")
    run(
        "--wide",
        action="store_true",
        help="results.md with every column: best top-1, epochs to timm's final, top-5, train loss, gains over timm "
        "and mimetic (default: init, top-1, margin over the best baseline, evaluation images)",
    )
    jobs = grid.add_argument_group(f"cluster jobs (through submitit: pip install '{DISTRIBUTION}[cluster]')")
    jobs.add_argument(
        "--cluster",
        choices=CLUSTERS,
        help="each run a job: a SLURM job array (resumed from its checkpoint when requeued), or local processes "
        "to try the set-up; this command waits for them (job scripts and logs in OUT/jobs); --parallel K: at "
        "most K jobs at once",
    )
    jobs.add_argument("--partition", help="SLURM partition")
    jobs.add_argument("--timeout-min", type=int, default=24 * 60, metavar="M", help="time limit per run (minutes)")
    jobs.add_argument("--gpus-per-run", type=int, metavar="G", help="GPUs per job (default: 1 on slurm, 0 local)")
    jobs.add_argument(
        "--cpus-per-run", type=int, metavar="C", help="CPUs per job, its torch threads (default: 8 on slurm, 1 local)"
    )
    jobs.add_argument("--mem-gb", type=float, help="memory per job (GB)")
    jobs.add_argument("--slurm-args", metavar="K=V,...", help="more #SBATCH settings, e.g. account=abc,qos=high")


def add_target_arguments(parser: argparse.ArgumentParser, images: int, out: str) -> None:
    """Flags of the inspection commands, which look at a run directory or a model name."""
    add = parser.add_argument
    add("target", help="a run directory (its last.pt) or a timm model name / preset")
    add("--data", default=None, help="test images to use (default: the run's data, or digits)")
    add("--images", type=int, default=images, help=f"number of test images (default {images})")
    add("--at-init", action="store_true", help="for a run: the model at init, not after training")
    add("--init", default="impulse", help="for a model name: an init label (see train --init)")
    add("--model-kwargs", help="for a model name: timm.create_model keywords", **ASSIGNMENTS)
    add("--seed", type=int, default=0, help="for a model name: the seed of its init")
    add("--out", default=out, help=f"PNG to write (default {out})")
