"""`structinit demo`: a small ViT on the 8x8 digits, four inits, a table, curves and each init's attention
maps. It checks that the pipeline works and measures nothing, so it is sized to the CPU it finds: its epochs
from the pace of a few steps measured here, to train in about TRAINING_SECONDS."""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

from ..errors import RunError
from ..training.setting import int_list
from ..training.settings import TrainConfig

# impulse: the paper's text (Q/K alone at its solve's sharpness); impulse-soft: the soft maps chosen at 64 tokens;
# mimetic on PyTorch's base: the trainer's default for ViTs (docs/studies/default-rule.md)
INITS = ["timm", "mimetic[base=kaiming]", "impulse", "impulse-soft"]
MOST_EPOCHS = 30  # where the CPU is fast enough (AVX-512 and bf16: README)
FEWEST_EPOCHS = 4  # a curve of a few points, its warm-up (a quarter of the run) over before it ends
TRAINING_SECONDS = 180.0  # the runs' share of five minutes; start-up, 12 figures and the tables take ~1 more


def demo_epochs(setup: float, epoch: float, runs: int, seconds: float = TRAINING_SECONDS) -> int:
    """The epochs each of `runs` runs trains for all of them to fit `seconds`, a run taking `setup` seconds
    to start and `epoch` seconds an epoch on this CPU (measured); within [FEWEST_EPOCHS, MOST_EPOCHS]."""
    fits = math.floor((seconds / runs - setup) / epoch)
    return min(MOST_EPOCHS, max(FEWEST_EPOCHS, fits))


def run_demo(args: argparse.Namespace) -> int:
    from ..inspection.attention import attention_figure
    from ..studies.choose_pace import warmup_for
    from ..studies.grid import compare, run_dir

    out, seeds = Path(args.out), int_list(args.seeds, "--seeds")
    base = TrainConfig(data="digits", model="vit_digits", epochs=args.epochs or MOST_EPOCHS, quiet=args.quiet)
    epochs, warmup = (args.epochs, None) if args.epochs is not None else sized(base, out, len(INITS) * len(seeds))
    warmup = warmup_for(base, epochs) if warmup is None else warmup  # within the run: no notice
    base = dataclasses.replace(base, epochs=epochs, warmup_epochs=warmup)
    rows = compare(base, INITS, seeds, [None], out)
    for init in INITS:  # where each init's structure is: on the pseudo input, on images at init, trained
        run = run_dir(out, None, init, seeds[0])
        name = run.name.removesuffix(f"-seed{seeds[0]}")
        attention_figure(str(run), at_init=True, pseudo_input=True, out=out / f"attention-{name}-init-pseudo.png")
        attention_figure(str(run), at_init=True, out=out / f"attention-{name}-init.png")
        attention_figure(str(run), out=out / f"attention-{name}.png")
    print((out / "results.md").read_text(), end="")
    print(
        f"{len(rows)} runs in {out}: results.md, results.csv, curves.png, summary.png, and for each init "
        "attention-<init>-init-pseudo.png (at init, on the pseudo input: where the impulse is), "
        "attention-<init>-init.png (at init, on test images) and attention-<init>.png (trained)"
    )
    return 0


def sized(base: TrainConfig, out: Path, runs: int) -> tuple[int, float | None]:
    """The epochs that fit this CPU, said in a line, and the warm-up where it is not a quarter of them at most:
    those of the demo already in `out` (its runs resume), else from the pace of a few steps measured here."""
    import torch

    from ..studies.choose_pace import measure
    from ..training.config_file import read_config
    from ..training.device import resolve_amp, resolve_device
    from ..training.recipe import data_of
    from ..training.startup import eval_images

    kept = next(iter(sorted(out.glob("*/config.yaml"))), None) if out.is_dir() else None
    if kept is not None:
        try:
            config = read_config(kept)
        except RunError:  # damaged: the grid names it in one line
            config = base
        print(f"demo: {runs} runs of {config.epochs} epochs, as the demo in {out} was sized (another --out sizes anew)")
        return config.epochs, config.warmup_epochs
    started = time.perf_counter()
    data = data_of(base)
    timing = measure(base, data, time.perf_counter() - started)[0]
    pace = timing.pace(len(data.train_labels) // base.batch_size, eval_images(data, base.eval_split))
    epochs = demo_epochs(pace.setup, pace.epoch, runs)
    device = resolve_device(base.device, 0)
    precision = "bf16" if resolve_amp(base.amp, device) == torch.bfloat16 else "float32"
    where = f"this CPU ({torch.backends.cpu.get_cpu_capability()}, {precision})" if device.type == "cpu" else device
    print(
        f"demo: {runs} runs of {epochs} epochs, sized to {where}: an epoch takes {pace.epoch:.1f} s here, so "
        f"about {runs * pace.seconds_for(epochs) / 60:.1f} min of training (at most {MOST_EPOCHS} epochs; "
        "--epochs N sets them)",
        flush=True,
    )
    return epochs, None
