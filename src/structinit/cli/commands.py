"""The `structinit` command: init, train, compare, choose, attention, rank, demo, upgrade-checkpoint."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RunError, first_line, one_line, one_line_warning, quiet_notices, reason
from ..files import refuse_replacing
from ..inits.labels import DEFAULT, InitSpec, parse_assignments, split_top_level
from ..seeds import check_seed
from ..training.setting import flag, int_list
from ..training.settings import TrainConfig
from ..version import DISTRIBUTION
from .choose import run_choose
from .demo import run_demo
from .listings import options_help, supported_models
from .model_flags import init_model_kwargs
from .parser import build_parser
from .train_flags import train_config, train_values

if TYPE_CHECKING:
    from ..studies.launch import Cluster

FIGURE_SUFFIXES = (".png", ".pdf", ".svg")


def run_train(args: argparse.Namespace) -> int:
    from ..training.device import distributed_processes
    from ..training.presets import load_preset
    from ..training.run import print_summary, resume_config, train

    if args.resume:
        if args.config:
            raise ValueError("--resume continues with the run's own config.yaml: give changes as flags, not --config")
        # the run's own config; the flags given now must agree with it, or be ones a resume may change
        asked = {k: v for k, v in train_values(args).items() if k not in ("resume", "out")}
        if args.preset:
            asked = {**load_preset(args.preset), **asked, "preset": args.preset}
        config = resume_config(args.out or TrainConfig.out, **asked)
    else:
        config = train_config(args)
    if config.teacher is not None and config.init_spec.method != "select":
        raise ValueError(f"--teacher is the larger model of --init select; --init {config.init} does not read it")
    args.run_out = config.out  # what an interrupt reads
    with quiet_notices(config.quiet):  # a --config file's or the resumed run's quiet too
        summary = train(config)
    if distributed_processes().main:
        print_summary(summary, config.out)
    return 0


def run_init(args: argparse.Namespace) -> int:
    from ..export import check_init_path, save_init
    from ..files import atomic_write_text, weights_sha256
    from ..models import build_model

    if args.list_models:
        print(supported_models(args.markdown))
        return 0
    if args.list_options:
        print(options_help())
        return 0
    if args.model is None:
        raise SystemExit("structinit init: give a model name (or --list-models for the supported families)")

    to_stdout, args.json = args.json == "-", None if args.json == "-" else args.json  # `-`: standard output
    if args.json and Path(args.json).is_dir():
        raise ValueError(f"--json {args.json} is a directory: give a file name, e.g. {Path(args.json) / 'init.json'}")
    if args.json and not Path(args.json).absolute().parent.is_dir():
        raise ValueError(f"--json {args.json}: {Path(args.json).parent} does not exist: create it first")
    check_seed(args.seed, "--seed")
    if args.save:
        check_init_path(args.save)
        if args.json and Path(args.json).resolve() == Path(args.save).resolve():
            raise ValueError(f"--json and --save both name {args.save}: give the report another file")
    for name, path in (("--save", args.save), ("--json", args.json)):
        if path:
            check_new_file(name, Path(path), args.overwrite)
    model_kwargs, classes, channels = init_model_kwargs(args)
    spec = InitSpec.parse(args.init)
    if spec.is_default:
        raise ValueError(f"--init {DEFAULT}: leaves the model as constructed, there is nothing to initialise")
    model, report = build_model(
        args.model,
        spec,
        args.seed,
        num_classes=classes,
        in_chans=channels,
        data_size=None,
        teacher=args.teacher,
        **model_kwargs,
    )
    print(report, file=sys.stderr if to_stdout else sys.stdout)  # `--json -`: standard output is the JSON
    digest = (
        save_init(model, args.save, report, overwrite=args.overwrite)
        if args.save
        else weights_sha256(model.state_dict())
    )
    saved = f"weights sha256: {digest}" + (f", saved to {args.save}" if args.save else "")
    print(saved, file=sys.stderr if to_stdout else sys.stdout)
    text = json.dumps({**report.to_dict(), "weights_sha256": digest}, indent=2)
    if to_stdout:
        print(text)
    elif args.json:
        atomic_write_text(Path(args.json), text)
    return 0


def check_new_file(name: str, path: Path, overwrite: bool) -> None:
    """Before any work: the file of flag `name` replaces an existing one (a checkpoint, say) only with
    --overwrite, and is never written through a link nor over anything but a regular file."""
    refuse_replacing(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{name} {path} exists: give another file, or add --overwrite to replace it")


def check_figure_path(out: str) -> None:
    """A figure file name that matplotlib writes as named, before any work."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"--out {out} is a directory: give a file name, e.g. {path / 'figure.png'}")
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(f"--out {out}: name a {', '.join(FIGURE_SUFFIXES)} file")


def run_compare(args: argparse.Namespace) -> int:
    from ..studies.grid import compare

    inits = split_top_level(args.inits)
    if args.teacher is not None and all(InitSpec.parse(i).method != "select" for i in inits):
        raise ValueError("--teacher is the larger model of the select inits, and --inits lists none")
    per_class = int_list(args.per_class, "--per-class") if args.per_class else [None]
    base = train_config(args)
    if args.parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {args.parallel}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    seeds = int_list(args.seeds, "--seeds")
    rows = compare(
        base,
        inits,
        seeds,
        per_class,
        args.out,
        parallel=args.parallel,
        rerun=args.rerun,
        threads=args.threads,
        cluster=cluster_of(args),
        wide=args.wide,
    )
    print((Path(args.out) / "results.md").read_text(), end="")
    print(f"{len(rows)} runs; results.csv, results.md, curves.png and summary.png in {args.out}")
    return 0


def cluster_of(args: argparse.Namespace) -> Cluster | None:
    """The --cluster settings, or None (and an error for cluster settings given without --cluster)."""
    settings = ("partition", "gpus_per_run", "cpus_per_run", "mem_gb", "slurm_args")
    if args.cluster is None:
        given = [flag(name) for name in settings if getattr(args, name) is not None]
        if given:
            raise ValueError(f"{', '.join(given)} only apply to cluster jobs: add --cluster slurm (or local)")
        return None
    from ..studies.launch import Cluster

    slurm = args.cluster == "slurm"
    return Cluster(
        kind=args.cluster,
        partition=args.partition,
        timeout_min=args.timeout_min,
        gpus_per_run=args.gpus_per_run if args.gpus_per_run is not None else int(slurm),
        cpus_per_run=args.cpus_per_run if args.cpus_per_run is not None else (8 if slurm else 1),
        mem_gb=args.mem_gb,
        parallel=args.parallel if args.parallel > 1 else None,
        slurm_args={k: str(v) for k, v in parse_assignments(args.slurm_args, "--slurm-args").items()},
    )


def target_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of the inspection commands' functions, from their shared flags."""
    if args.images < 1:
        raise ValueError(f"--images must be >= 1, got {args.images}")
    check_seed(args.seed, "--seed")
    check_figure_path(args.out)
    return dict(
        data=args.data,
        images=args.images,
        at_init=args.at_init,
        init=args.init,
        model_kwargs=parse_assignments(args.model_kwargs, "--model-kwargs"),
        seed=args.seed,
        out=args.out,
    )


def run_attention(args: argparse.Namespace) -> int:
    from ..inspection.attention import attention_figure

    print(f"wrote {attention_figure(args.target, **target_arguments(args), pseudo_input=args.pseudo_input)}")
    return 0


def run_rank(args: argparse.Namespace) -> int:
    from ..inspection.rank import rank_figure, ranks_table

    ranks, path = rank_figure(args.target, **target_arguments(args))
    print(ranks_table(ranks), end="")
    print(f"wrote {path}")
    return 0


def run_upgrade(args: argparse.Namespace) -> int:
    from ..training.checkpoint import upgrade_checkpoint

    for path in args.checkpoints:
        upgrade_checkpoint(Path(path))
        print(f"upgraded {path}")
    return 0


COMMANDS = {
    "init": run_init,
    "train": run_train,
    "compare": run_compare,
    "choose": run_choose,
    "attention": run_attention,
    "rank": run_rank,
    "demo": run_demo,
    "upgrade-checkpoint": run_upgrade,
}


# what a command interrupted (Ctrl-C, SIGTERM) left, and what to do, where no folder says it; the others: run it again
AFTER_INTERRUPT = {
    "init": "no file is left half-written: run it again",
    "upgrade-checkpoint": "the checkpoints named as upgraded are done, the others are as they were",
}
GRIDS = ("compare", "choose", "demo")
GRID_AGAIN = "run the same command again: finished runs are skipped, interrupted ones resume"

# modules that the library call does without, and the extra that installs each
EXTRAS = {"matplotlib": "train", "sklearn": "train", "tensorboard": "log", "wandb": "log"}


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # a budget (choose --minutes) counts from here, before torch and timm load
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:  # the subcommand's flags are where its help lists them, not `structinit --help`
        return fail(
            args.command,
            f"unrecognized arguments: {' '.join(unknown)} (structinit {args.command} --help lists the flags)",
        )
    args.started = started
    if getattr(args, "out", None) == "":  # Path("") is the current directory
        return fail(args.command, "--out is empty: name where to write, e.g. --out runs/mine")
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # kill: cleaned up and reported as Ctrl-C is
    shown, warnings.formatwarning = warnings.formatwarning, one_line_warning  # the command's warnings: one line
    try:
        with quiet_notices(bool(getattr(args, "quiet", False))):
            return COMMANDS[args.command](args)
    except (ValueError, TypeError, RunError) as error:
        return fail(args.command, str(error))
    except OSError as error:  # a missing, unwritable or full path: its name and the reason
        return fail(args.command, reason(error))
    except ModuleNotFoundError as error:
        extra = EXTRAS.get((error.name or "").split(".")[0])
        if extra is None:
            raise
        return fail(args.command, f"this needs {error.name}: pip install '{DISTRIBUTION}[{extra}]'")
    except MemoryError as error:  # what no estimate foresaw: one line, not a traceback
        detail = f" ({first_line(error)})" if str(error) else ""
        return fail(args.command, f"out of memory{detail}: ask for less (a smaller model, batch or image size)")
    except KeyboardInterrupt:
        print(f"structinit {args.command}: interrupted; {after_interrupt(args)}", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = shown


def after_interrupt(args: argparse.Namespace) -> str:
    """What an interrupted command left, read from its folder at that moment, and what to do."""
    out = getattr(args, "run_out", None) or getattr(args, "out", None)
    if args.command not in ("train", *GRIDS) or not out:
        return AFTER_INTERRUPT.get(args.command, "run it again")
    if args.command == "train":
        held = checkpointed(Path(out))
        if held is None:
            return f"no epoch had finished, so {out} holds no checkpoint: run it again"
        return f"finished epochs are checkpointed: {out} holds {held}; --resume goes on from there"
    runs = [run.parent for run in Path(out).rglob("last.pt")] if Path(out).is_dir() else []
    finished = sum((run / "summary.json").exists() for run in runs)
    if not runs:
        return f"no run in {out} had finished an epoch: {GRID_AGAIN}"
    held = [f"{finished} finished run{'s' * (finished != 1)}"] if finished else []
    held += [f"{len(runs) - finished} with finished epochs to resume"] if len(runs) > finished else []
    return f"finished epochs are checkpointed: {out} holds {' and '.join(held)}; {GRID_AGAIN}"


def checkpointed(run: Path) -> str | None:
    """What `run`'s checkpoint holds ("3 epochs": its log's lines), None where it has none."""
    from ..training.record import MetricsLog

    if not (run / "last.pt").is_file():
        return None
    try:
        epochs = len(MetricsLog(run).epochs())
    except (RunError, OSError, ValueError):  # a damaged log: --resume names it
        return "a checkpoint"
    return f"{epochs} epoch{'s' * (epochs != 1)}" if epochs else "a checkpoint"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def fail(command: str, message: str) -> int:
    print(f"structinit {command}: error: {one_line(message)}", file=sys.stderr)
    return 2
