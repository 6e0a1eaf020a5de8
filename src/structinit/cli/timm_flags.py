"""Every flag of timm's train.py, and what `structinit train` does with it: one table. A flag structinit
takes is one of its own (a setting's flag or alias, or read here into one); a flag that changes no result is
accepted with a note; any other is refused in one line that says why and what to use instead. The list is
timm 1.0.22's train.py parser, as the authors' fork (osiriszjq/structured_initialization, 7cd02f1) ships
it: the train.py the paper's commands run."""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import Any

TAKEN, NOTED, REFUSED = "taken", "noted", "refused"

DATA_READERS = "timm's Hugging Face, WebDataset and TFDS readers; structinit reads image folders and torchvision sets"
NO_BATCHNORM = "structinit keeps BatchNorm (ConvMixer's) per process as torch does; its ViTs have none"
SCHEDULE = "structinit's schedule is timm's --sched (cosine, tanh, step, multistep, poly) without it"
AUGMENT = "structinit's augmentation is --aa, --reprob, --mixup/--cutmix and timm's crop and flip flags"


def taken(nargs: Any = None, into: str | None = None, value: Any = None) -> tuple[str, Any, str | None, Any]:
    """A flag structinit takes: its own (`into` None), or read here into setting `into` (`value`: the value a
    switch gives it)."""
    return TAKEN, nargs, into, value


def noted(note: str, nargs: Any = None) -> tuple[str, Any, str, None]:
    return NOTED, nargs, note, None


def refused(why: str, nargs: Any = None) -> tuple[str, Any, str, None]:
    return REFUSED, nargs, why, None


SWITCH = 0
# timm's flag -> (what structinit does, argparse's nargs (0: a switch), the setting it fills / the note / why)
TIMM_FLAGS: dict[str, tuple[str, Any, str | None, Any]] = {
    **dict.fromkeys(("-c", "--config", "--data-dir", "--train-split", "--val-split", "--model"), taken()),
    **dict.fromkeys(("--dataset", "--initial-checkpoint", "--num-classes", "--img-size", "--crop-pct"), taken()),
    **dict.fromkeys(("--input-size", "--mean", "--std", "--interpolation", "-b", "--batch-size"), taken()),
    **dict.fromkeys(("--grad-accum-steps", "--model-kwargs", "--torchcompile-mode", "--torchcompile"), taken()),
    **dict.fromkeys(("--device", "--opt", "--opt-eps", "--opt-betas", "--momentum", "--weight-decay"), taken()),
    **dict.fromkeys(("--clip-grad", "--layer-decay", "--sched", "--lr", "--lr-base", "--lr-base-size"), taken()),
    **dict.fromkeys(("--lr-base-scale", "--warmup-lr", "--min-lr", "--epochs", "--decay-milestones"), taken()),
    **dict.fromkeys(("--decay-epochs", "--warmup-epochs", "--cooldown-epochs", "--decay-rate", "--dr"), taken()),
    **dict.fromkeys(("--scale", "--ratio", "--hflip", "--color-jitter", "--aa", "--aug-repeats"), taken()),
    **dict.fromkeys(("--reprob", "--mixup", "--cutmix", "--smoothing", "--drop", "--drop-path", "--seed"), taken()),
    **dict.fromkeys(("--model-ema", "--model-ema-decay", "-j", "--workers", "--output", "--resume"), taken()),
    **dict.fromkeys(("--dataset-download", "--pin-mem", "--amp", "--amp-dtype"), taken()),
    "-vb": taken(into="eval_batch_size"),
    "--validation-batch-size": taken(into="eval_batch_size"),
    "--log-wandb": taken(SWITCH, into="log", value=["wandb"]),
    "--experiment": taken(into="out"),  # the run's directory under --output (experiment_out)
    # accepted: they change how a run is watched or how fast it goes, not what it computes
    "--channels-last": noted("structinit keeps torch's memory format (the same values)", SWITCH),
    "--fuser": noted("TorchScript's fuser: structinit does not script the model (--compile compiles it)"),
    "--grad-checkpointing": noted("not applied: it saves memory only; give a smaller --batch-size instead", SWITCH),
    "--no-ddp-bb": noted("structinit's DDP keeps torch's default buckets (the same values)", SWITCH),
    "--synchronize-step": noted("timing only: structinit times whole epochs", SWITCH),
    "--local_rank": noted("torchrun's environment (LOCAL_RANK) gives the rank"),
    "--amp-impl": noted("structinit's autocast is torch.amp (timm's native)"),
    "--sched-on-updates": noted("structinit's schedule moves every optimiser step already", SWITCH),
    "--log-interval": noted("structinit logs each epoch (metrics.jsonl) and shows a bar on a terminal"),
    "--recovery-interval": noted("structinit checkpoints every epoch (last.pt, prev.pt)"),
    "--checkpoint-hist": noted("structinit keeps last.pt and prev.pt (--snapshot-epochs keeps others)"),
    "--save-images": noted("structinit saves no training images", SWITCH),
    "--no-prefetcher": noted("structinit has no CUDA prefetcher to turn off", SWITCH),
    "--use-multi-epochs-loader": noted("loader speed only", SWITCH),
    "--model-ema-force-cpu": noted("the EMA stays on the training device (the same values)", SWITCH),
    "--eval-metric": noted("structinit keeps the last checkpoint and reports top-1 and top-5, not a best one"),
    "--wandb-project": noted("set $WANDB_PROJECT (--log wandb reads it)"),
    "--wandb-tags": noted("W&B tags are not set", "+"),
    "--wandb-resume-id": noted("a resumed run opens a new W&B run"),
    # refused: each would change what is computed in a way structinit does not reproduce
    **dict.fromkeys(("--train-num-samples", "--val-num-samples", "--class-map"), refused(DATA_READERS)),
    **dict.fromkeys(("--input-img-mode", "--input-key", "--target-key"), refused(DATA_READERS)),
    "--dataset-trust-remote-code": refused(DATA_READERS, SWITCH),
    "--pretrained": refused("structinit initialises models; start from weights with --initial-checkpoint", SWITCH),
    "--pretrained-path": refused("structinit initialises models; start from weights with --initial-checkpoint FILE"),
    "--no-resume-opt": refused("a resume restores the optimiser with the weights", SWITCH),
    "--gp": refused("give --model-kwargs global_pool=NAME"),
    "--in-chans": refused("the data sets the channels"),
    "--fast-norm": refused("timm's fast norm computes in lower precision: not taken", SWITCH),
    "--head-init-scale": refused("the head's init is the model's (structinit's --init sets attention)"),
    "--head-init-bias": refused("the head's init is the model's (structinit's --init sets attention)"),
    "--torchscript": refused("give --compile (torch.compile)", SWITCH),
    "--model-dtype": refused("structinit trains in float32 under autocast (--amp)"),
    "--device-modules": refused("give --device (cpu, cuda, mps)", "+"),
    "--clip-mode": refused(
        "structinit clips the gradient's norm (--clip-grad); timm's agc and value modes are not taken"
    ),
    "--layer-decay-min-scale": refused("--layer-decay takes timm's default scales"),
    "--layer-decay-no-opt-scale": refused("--layer-decay takes timm's default scales"),
    "--opt-kwargs": refused("give --opt-eps, --opt-betas or --momentum", "*"),
    **dict.fromkeys(("--lr-noise-pct", "--lr-noise-std", "--lr-cycle-mul"), refused(SCHEDULE)),
    **dict.fromkeys(("--lr-cycle-decay", "--lr-cycle-limit", "--lr-k-decay"), refused(SCHEDULE)),
    "--lr-noise": refused(SCHEDULE, "+"),
    "--patience-epochs": refused("plateau schedules need a metric: " + SCHEDULE),
    "--warmup-prefix": refused(SCHEDULE, SWITCH),
    "--epoch-repeats": refused("give more --epochs"),
    "--start-epoch": refused("--resume goes on from the run's last epoch"),
    **dict.fromkeys(("--vflip", "--color-jitter-prob", "--grayscale-prob"), refused(AUGMENT)),
    **dict.fromkeys(("--gaussian-blur-prob", "--train-crop-mode", "--train-interpolation"), refused(AUGMENT)),
    **dict.fromkeys(("--remode", "--recount", "--mixup-prob", "--mixup-switch-prob"), refused(AUGMENT)),
    **dict.fromkeys(("--mixup-mode", "--mixup-off-epoch", "--aug-splits"), refused(AUGMENT)),
    "--no-aug": refused(AUGMENT, SWITCH),
    "--resplit": refused(AUGMENT, SWITCH),
    "--cutmix-minmax": refused(AUGMENT, "+"),
    "--jsd-loss": refused("structinit trains with cross-entropy (soft targets under mixup)", SWITCH),
    "--bce-loss": refused("structinit trains with cross-entropy (soft targets under mixup)", SWITCH),
    "--bce-sum": refused("structinit trains with cross-entropy", SWITCH),
    **dict.fromkeys(("--bce-target-thresh", "--bce-pos-weight"), refused("structinit trains with cross-entropy")),
    **dict.fromkeys(("--drop-connect", "--drop-block"), refused("give --drop-path (stochastic depth) or --drop")),
    **dict.fromkeys(("--bn-momentum", "--bn-eps", "--dist-bn"), refused(NO_BATCHNORM)),
    **dict.fromkeys(("--sync-bn", "--split-bn"), refused(NO_BATCHNORM, SWITCH)),
    "--model-ema-warmup": refused("structinit's EMA (timm's ModelEmaV3) keeps a fixed decay", SWITCH),
    "--worker-seeding": refused("structinit seeds each epoch's draws from --seed (a resumed run the same)"),
    "--tta": refused("structinit evaluates each image once"),
    "--naflex-loader": refused("NaFlex ViTs' variable-resolution loader is not taken", SWITCH),
    **dict.fromkeys(("--naflex-max-seq-len", "--naflex-loss-scale"), refused("NaFlex's loader is not taken")),
    **dict.fromkeys(
        ("--naflex-train-seq-lens", "--naflex-patch-sizes", "--naflex-patch-size-probs"),
        refused("NaFlex's loader is not taken", "+"),
    ),
}


class _Refused(argparse.Action):
    """timm's flag that structinit does not take: one line, why, and what to give instead."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        parser.error(f"{option_string} (timm's train.py) is not taken: {TIMM_FLAGS[option_string][2]}")


def add_timm_flags(parser: argparse.ArgumentParser) -> None:
    """timm's flags that are not structinit's own: noted, refused, or read into a setting (train_values)."""
    group = parser.add_argument_group("timm's train.py flags structinit reads or explains (docs/training.md)")
    for name, (kind, nargs, into, _) in TIMM_FLAGS.items():
        if kind == TAKEN and into is None:
            continue  # structinit's own flag
        dest = "timm_" + name.lstrip("-").replace("-", "_")
        shape: dict[str, Any] = {"action": "store_true"} if nargs == SWITCH else {"nargs": nargs, "metavar": "X"}
        if kind == REFUSED:
            shape = {"action": _Refused, "nargs": "?" if nargs == SWITCH else nargs, "metavar": "X"}
        group.add_argument(name, dest=dest, help=argparse.SUPPRESS, **shape)


def timm_values(args: argparse.Namespace) -> dict[str, Any]:
    """The settings timm's flags give (-vb, --log-wandb, --experiment), with a Notice for each accepted flag that
    changes nothing."""
    from ..errors import Notice

    values: dict[str, Any] = {}
    for name, (kind, switch, into, value) in TIMM_FLAGS.items():
        given = getattr(args, "timm_" + name.lstrip("-").replace("-", "_"), None)
        if given in (None, False) or kind == REFUSED:
            continue
        if kind == NOTED:
            warnings.warn(f"{name} (timm's train.py) accepted, changing nothing: {into}", Notice, stacklevel=2)
        elif into == "out":
            values["out"] = experiment_out(getattr(args, "out", None), given)
        elif into == "eval_batch_size":
            values[into] = whole_number(name, given)
        elif into is not None:
            values[into] = value if switch == SWITCH else given
    return values


def whole_number(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} takes a whole number, got {text!r}") from None


def experiment_out(output: str | None, experiment: str | None) -> str | None:
    """timm's --output DIR --experiment NAME: the run is DIR/NAME (structinit's --output names the run itself)."""
    if experiment is None:
        return output
    return str(Path(output or "runs") / experiment)
