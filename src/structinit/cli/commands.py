"""The `structinit` command."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from .. import __version__
from ..errors import first_line
from ..inits.labels import DEFAULT, KERNEL_SIZE, VARIANTS, parse_assignments, parse_init, split_top_level
from ..inits.registry import METHODS
from ..models import PRESETS
from ..studies.launch import CLUSTERS, Cluster
from ..training.rundir import flag, load_yaml

# `train --filters`, for ConvMixer: the init label each choice stands for
FILTERS = {
    "trained": "default",
    "random": "random[freeze=True]",
    "impulse": "impulse[freeze=True]",
    "box": "box[freeze=True]",
}
INIT_HELP = (
    f"init label (default impulse): a method ({', '.join(sorted(METHODS))}), a variant ({', '.join(VARIANTS)}), "
    "'default' (the model as constructed), or any of them with options in brackets, e.g. "
    "impulse[target_fidelity=0.9,kernel_size=5] (structinit init --list-options)"
)
FIGURE_SUFFIXES = (".png", ".pdf", ".svg")
EMA_DECAY = 0.9998  # timm's --model-ema-decay default
# flags of structinit 0.1 whose settings now live elsewhere, and where
REMOVED = {
    "--options": "write the options in the init label: --init 'impulse[target_fidelity=0.9]'",
    "--init-kwargs": "write the options in the init label: --init 'impulse[target_fidelity=0.9]'",
    "--kernel-size": "write it in the init label: --init 'impulse[kernel_size=5]'",
}


class _Removed(argparse.Action):
    """A flag that was renamed: fail with where its setting went, not with 'unrecognized arguments'."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        parser.error(f"{option_string} is gone: {REMOVED[option_string]}")


def add_removed_flags(parser: argparse.ArgumentParser) -> None:
    for name in REMOVED:
        parser.add_argument(name, action=_Removed, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="structinit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"structinit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="build a timm model, initialise it and print the report")
    init.add_argument("model", nargs="?", help="a preset or timm model name, e.g. vit_tiny_patch16_224")
    init.add_argument("--list-models", action="store_true", help="print the supported families, their inits, presets")
    init.add_argument(
        "--list-options", action="store_true", help="print every init method's options: type, default, meaning"
    )
    init.add_argument("--init", "--method", default="impulse", help=INIT_HELP)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--model-kwargs", help="timm.create_model keywords, e.g. img_size=32,patch_size=4,num_heads=12")
    add_removed_flags(init)
    init.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    init.add_argument(
        "--save",
        metavar="PATH",
        help="write the initialised weights (.safetensors, .pth or .pt) for timm's --initial-checkpoint, "
        "load_state_dict or any trainer",
    )

    train = commands.add_parser("train", help="train one model (timm recipe); torchrun for several processes")
    add_train_arguments(train)

    grid = commands.add_parser("compare", help="train a grid of inits x seeds (x subset sizes) and tabulate it")
    add_train_arguments(grid, grid=True)
    grid.add_argument("--inits", default="timm,mimetic,impulse", help="comma-separated init labels; " + INIT_HELP)
    grid.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    grid.add_argument(
        "--parallel",
        "--jobs",
        type=int,
        default=1,
        metavar="K",
        help="K runs at once, each in its own process (on several GPUs: spread over them)",
    )
    grid.add_argument(
        "--threads",
        type=int,
        metavar="T",
        help="torch threads per run (default: the cores / K); a CPU grid repeats bit for bit at the same T",
    )
    grid.add_argument(
        "--rerun", action="store_true", help="train again (from scratch) run directories made with another recipe"
    )
    jobs = grid.add_argument_group("cluster jobs (through submitit: pip install 'structinit[cluster]')")
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

    attention = commands.add_parser("attention", help="PNG of the attention maps per layer and head")
    add_target_arguments(attention, images=64, out="attention.png")
    rank = commands.add_parser("rank", help="stable rank of the patch embeddings and every block's output")
    add_target_arguments(rank, images=256, out="rank.png")

    upgrade = commands.add_parser(
        "upgrade-checkpoint",
        help="rewrite checkpoints of structinit < 0.2 in the safe format (unpickles them: only files you trust)",
    )
    upgrade.add_argument("checkpoints", nargs="+", help="last.pt files")

    demo = commands.add_parser(
        "demo", help="the main job: timm vs mimetic vs impulse vs impulse-soft init on the embedded digits"
    )
    demo.add_argument("--out", default="runs/demo")
    demo.add_argument("--epochs", type=int, default=30)
    demo.add_argument("--seeds", default="0")
    demo.add_argument("--quiet", action="store_true")
    return parser


def add_target_arguments(parser: argparse.ArgumentParser, images: int, out: str) -> None:
    """Flags of the inspection commands, which look at a run directory or a model name."""
    add = parser.add_argument
    add("target", help="a run directory (its last.pt) or a timm model name / preset")
    add("--data", default=None, help="test images to use (default: the run's data, or digits)")
    add("--images", type=int, default=images, help=f"number of test images (default {images})")
    add("--at-init", action="store_true", help="for a run: the model at init, not after training")
    add("--init", default="impulse", help="for a model name: an init label (see train --init)")
    add("--model-kwargs", help="for a model name: timm.create_model keywords")
    add("--seed", type=int, default=0)
    add("--out", default=out, help=f"PNG to write (default {out})")


def add_train_arguments(parser: argparse.ArgumentParser, grid: bool = False) -> None:
    """Flags of `train`, and of `compare` (`grid`: lists of subset sizes; the init and seed come from
    --inits/--seeds): None means the preset's value or the default."""
    from ..data.datasets import DATASETS_HELP

    add = parser.add_argument
    add("--data", help=f"dataset (default digits): {DATASETS_HELP}")
    add("--data-root", "--data-dir", help="where torchvision datasets live or are downloaded (default ./data)")
    add("--download", action="store_true", default=None, help="download a torchvision dataset (needs internet)")
    add("--cache-dir", help="where decoded small-image datasets are cached (default ~/.cache/structinit)")
    if grid:
        add("--per-class", help="comma-separated subset sizes per class, e.g. 100,200,500")
    else:
        add("--per-class", type=int, help="train on a stratified subset of K images per class")
    add("--train-fraction", type=float, help="train on a stratified fraction of each class")
    add("--subset-seed", type=int, help="seed of the subset draw (default 0)")
    add(
        "--val-per-class",
        type=int,
        metavar="K",
        help="hold out K training images per class (stratified, disjoint from the subset) and evaluate on them "
        "instead of the test set: choose settings there, report the test set once",
    )
    add("--model", help=f"timm model name or preset ({', '.join(PRESETS)})")
    add("--model-kwargs", help="timm.create_model keywords, e.g. depth=6,num_heads=12,global_pool=avg")
    if not grid:
        add("--init", help=INIT_HELP)
        add(
            "--filters",
            choices=sorted(FILTERS),
            help="ConvMixer, instead of --init: trained (learned from the default init), or frozen at "
            "random (the default init), impulse (one-hot) or box (all 1/f^2) values",
        )
    add_removed_flags(parser)
    add("-c", "--config", metavar="FILE", help="YAML of settings, the keys of a run's config.yaml; flags override it")
    add("--preset", help="recipe preset: small-data, imagenet, cpu-quick (under --config and the flags)")
    add("--epochs", type=int)
    add("-b", "--batch-size", type=int, help="global batch size (split across processes)")
    add("--lr", type=float)
    add("--weight-decay", type=float)
    add("--warmup-epochs", type=float)
    add("--smoothing", type=float, help="label smoothing")
    add("--mixup", type=float, help="mixup alpha (0 = off)")
    add("--cutmix", type=float, help="cutmix alpha (0 = off)")
    add("--drop-path", type=float)
    add("--min-lr", type=float, help="final learning rate of the cosine schedule")
    add("--randaugment", "--aa", help="timm RandAugment string, e.g. rand-m9-mstd0.5-inc1")
    add("--reprob", type=float, help="random erasing probability")
    add("--clip-grad", type=float)
    add(
        "--ema-decay",
        "--model-ema-decay",
        type=float,
        help="keep an EMA of the weights with this decay and report its accuracy",
    )
    add("--model-ema", action="store_true", help=f"keep an EMA of the weights (decay {EMA_DECAY} unless given)")
    add("--amp", choices=["auto", "bf16", "fp16", "none"])
    add("--compile", "--torchcompile", action="store_true", default=None, help="torch.compile the model (inductor)")
    add("--device", help="auto (default), cpu, cuda, cuda:1, mps")
    add("-j", "--workers", type=int, help="DataLoader workers for large images")
    add(
        "--log",
        metavar="NAME,NAME",
        help="loggers beside metrics.jsonl: tensorboard (OUT/tensorboard), wandb (WANDB_PROJECT, default structinit)",
    )
    add("--eval-every", type=int, metavar="K", help="evaluation every K epochs and after the last (default 1)")
    add("--snapshot-epochs", metavar="E,E", help="keep the weights after these epochs in OUT/snapshots (0: at init)")
    if grid:
        add("--out", "--output", default="runs/compare", help="directory of the grid's runs and results")
        return add("--quiet", action="store_true", default=None, help="no progress bars")
    add("--seed", type=int)
    add("--out", "--output", help="the run's directory (default runs/run; timm's --output is its parent)")
    add("--resume", action="store_true", default=None, help="continue the run in --out from its last checkpoint")
    add("--stop-after", type=int, metavar="K", help="end after epoch K, leaving a resumable checkpoint")
    add("--quiet", action="store_true", default=None, help="no progress bars")


def train_values(args: argparse.Namespace) -> dict[str, Any]:
    """The training settings given on the command line (not the preset's or the defaults)."""
    from dataclasses import fields

    from ..training.run import TrainConfig

    skip = ("model_kwargs", "preset", "per_class", "snapshot_epochs", "log")
    names = [f.name for f in fields(TrainConfig) if f.name not in skip]
    values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    per_class = getattr(args, "per_class", None)
    if isinstance(per_class, int):
        values["per_class"] = per_class
    if args.snapshot_epochs:
        values["snapshot_epochs"] = int_list(args.snapshot_epochs, "--snapshot-epochs")
    if args.model_kwargs:
        values["model_kwargs"] = parse_assignments(args.model_kwargs, "--model-kwargs")
    if args.model_ema and args.ema_decay is None:
        values["ema_decay"] = EMA_DECAY
    if args.log is not None:
        values["log"] = split_top_level(args.log)
    if getattr(args, "filters", None):
        if args.init:
            raise ValueError("--filters and --init both set the init: give one")
        values["init"] = FILTERS[args.filters]
    return values


def train_config(args: argparse.Namespace, **overrides: Any):
    """Defaults, then the preset, then --config's file, then the flags, then `overrides`."""
    from ..training.run import TrainConfig

    values = {**file_values(args), **train_values(args), **overrides}
    preset = args.preset or values.pop("preset", None)
    values.pop("preset", None)
    return TrainConfig.from_preset(preset, **values)


def file_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of --config FILE (none without it)."""
    if not args.config:
        return {}
    import yaml

    from ..training.run import config_values

    path = Path(args.config)
    if not path.is_file():
        raise ValueError(f"--config {path}: no such file")
    try:
        loaded = load_yaml(path.read_text())
    except yaml.YAMLError as error:
        raise ValueError(f"--config {path}: not valid YAML ({first_line(error)})") from None
    return config_values(loaded or {}, f"--config {path}")


def run_train(args: argparse.Namespace) -> int:
    from ..training.run import TrainConfig, load_preset, print_summary, resume_config, train

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
    summary = train(config)
    if int(os.environ.get("RANK", "0")) == 0:
        print_summary(summary, config.out)
    return 0


def run_init(args: argparse.Namespace) -> int:
    import torch

    from ..export import check_init_path, save_init
    from ..files import atomic_write_text, weights_sha256
    from ..inits.api import initialize
    from ..models import create_model

    if args.list_models:
        print(supported_models())
        return 0
    if args.list_options:
        print(options_help())
        return 0
    if args.model is None:
        raise SystemExit("structinit init: give a model name (or --list-models for the supported families)")

    if args.json and Path(args.json).is_dir():
        raise ValueError(f"--json {args.json} is a directory: give a file name, e.g. {Path(args.json) / 'init.json'}")
    if args.json and not Path(args.json).absolute().parent.is_dir():
        raise ValueError(f"--json {args.json}: {Path(args.json).parent} does not exist: create it first")
    check_seed(args.seed)
    if args.save:
        check_init_path(args.save)
        if args.json and Path(args.json).absolute() == Path(args.save).absolute():
            raise ValueError(f"--json and --save both name {args.save}: give the report another file")
    model_kwargs = parse_assignments(args.model_kwargs, "--model-kwargs")
    method, options = parse_init(args.init)
    if method == DEFAULT:
        raise ValueError(f"--init {DEFAULT}: leaves the model as constructed, there is nothing to initialise")
    kernel_size = options.pop(KERNEL_SIZE, None)
    classes, channels = model_kwargs.pop("num_classes", 1000), model_kwargs.pop("in_chans", 3)
    torch.manual_seed(args.seed)  # what the init leaves (MLPs, head) is the same in every process too
    model = create_model(args.model, num_classes=classes, in_chans=channels, data_size=None, **model_kwargs)
    report = initialize(model, method, kernel_size=kernel_size, seed=args.seed, **options)
    print(report)
    digest = save_init(model, args.save, report) if args.save else weights_sha256(model.state_dict())
    print(f"weights sha256: {digest}" + (f", saved to {args.save}" if args.save else ""))
    if args.json:
        atomic_write_text(Path(args.json), json.dumps({**report.to_dict(), "weights_sha256": digest}, indent=2))
    return 0


def check_seed(seed: int) -> None:
    if not 0 <= seed < 2**32:
        raise ValueError(f"--seed must lie in 0..{2**32 - 1} (numpy's seeds), got {seed}")


def check_figure_path(out: str) -> None:
    """A figure file name that matplotlib writes as named, before any work."""
    path = Path(out)
    if path.is_dir():
        raise ValueError(f"--out {out} is a directory: give a file name, e.g. {path / 'figure.png'}")
    if path.suffix.lower() not in FIGURE_SUFFIXES:
        raise ValueError(f"--out {out}: name a {', '.join(FIGURE_SUFFIXES)} file")


def int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise ValueError(f"{flag} needs at least one integer, got {text!r}")
    return values


def run_compare(args: argparse.Namespace) -> int:
    from ..studies.grid import compare

    inits = split_top_level(args.inits)
    for label in inits:
        parse_init(label)  # fail before the first run, not in the middle of the grid
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
    check_seed(args.seed)
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

    print(f"wrote {attention_figure(args.target, **target_arguments(args))}")
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


def run_demo(args: argparse.Namespace) -> int:
    from ..inspection.attention import attention_figure
    from ..studies.grid import compare
    from ..training.run import TrainConfig

    out = Path(args.out)
    base = TrainConfig(data="digits", model="vit_digits", epochs=args.epochs, quiet=args.quiet)
    # impulse: the paper's sharp maps; impulse-soft: the soft maps chosen at 64 tokens
    structured = ["impulse", "impulse-soft"]
    rows = compare(base, ["timm", "mimetic", *structured], int_list(args.seeds, "--seeds"), [None], out)
    seed = int_list(args.seeds, "--seeds")[0]
    for init in structured:
        attention_figure(str(out / "full" / f"{init}-seed{seed}"), at_init=True, out=out / f"attention-{init}-init.png")
        attention_figure(str(out / "full" / f"{init}-seed{seed}"), out=out / f"attention-{init}.png")
    print((out / "results.md").read_text(), end="")
    print(
        f"{len(rows)} runs in {out}: results.md, results.csv, curves.png, summary.png, "
        f"attention-<init>-init.png and attention-<init>.png (trained) for {' and '.join(structured)}"
    )
    return 0


COMMANDS = {
    "init": run_init,
    "train": run_train,
    "compare": run_compare,
    "attention": run_attention,
    "rank": run_rank,
    "demo": run_demo,
    "upgrade-checkpoint": run_upgrade,
}


# modules that the library call does without, and the extra that installs each
EXTRAS = {"matplotlib": "train", "sklearn": "train", "tensorboard": "log", "wandb": "log"}


def main(argv: list[str] | None = None) -> int:
    from ..training.rundir import RunError

    args = build_parser().parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # kill: cleaned up and reported as Ctrl-C is
    try:
        return COMMANDS[args.command](args)
    except (ValueError, TypeError, RunError) as error:
        return fail(args.command, str(error))
    except OSError as error:  # a missing, unwritable or full path: its name and the reason
        where = f"{error.filename}: " if error.filename else ""
        return fail(args.command, f"{where}{error.strerror or error}")
    except ModuleNotFoundError as error:
        extra = EXTRAS.get((error.name or "").split(".")[0])
        if extra is None:
            raise
        return fail(args.command, f"this needs {error.name}: pip install 'structinit[{extra}]'")
    except KeyboardInterrupt:
        again = (
            "run the same command again: finished runs are skipped, interrupted ones resume"
            if args.command in ("compare", "demo")
            else "--resume goes on from the last (a run stopped in its first epoch: run it again)"
        )
        print(f"structinit {args.command}: interrupted; finished epochs are checkpointed: {again}", file=sys.stderr)
        return 130


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def fail(command: str, message: str) -> int:
    print(f"structinit {command}: error: {message}", file=sys.stderr)
    return 2


def supported_models() -> str:
    """The families structinit initialises, their init methods and an example each, and the presets."""
    from ..adapters import ADAPTERS
    from ..adapters.convmixer import ConvMixerAdapter
    from ..inits.convmixer import FILTER_METHODS
    from ..inits.registry import FAMILIES, METHODS
    from ..models import PRESETS

    rows = [(adapter, list(METHODS)) for adapter in ADAPTERS]
    rows += [(family.adapter, list(family.methods)) for family in FAMILIES]
    rows.append((ConvMixerAdapter, list(FILTER_METHODS)))
    lines = ["families (init methods; e.g.):"]
    lines += [f"  {adapter.family}\n      {', '.join(methods)}; e.g. {adapter.example}" for adapter, methods in rows]
    lines.append("presets for small images (give the size: structinit init NAME --model-kwargs img_size=32):")
    lines += [f"  {name}" for name in PRESETS]
    return "\n".join(lines)


def options_help() -> str:
    """Every init method's options, once per options class: `structinit init --list-options`."""
    from ..inits.options import FilterOptions, NoOptions
    from ..inits.registry import FAMILIES, VIT_FAMILY

    classes = [init.options for family in (VIT_FAMILY, *FAMILIES) for init in family.methods.values()]
    lines = [
        "init options go in the label's brackets, e.g. impulse[target_fidelity=0.9,kernel_size=5]; every method "
        "also takes kernel_size, the f of the f x f kernel (default 3; ConvMixer: its own)"
    ]
    for cls in dict.fromkeys([*classes, FilterOptions]):
        if cls is NoOptions:
            continue
        summary = " ".join((cls.__doc__ or "").split())
        lines.append(f"\n{cls.__name__}: {summary}")
        lines += ["  " + line.replace("\n", "\n  ") for line in cls.describe()]
    return "\n".join(lines)
