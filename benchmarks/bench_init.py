"""Init speed and attention fidelity of every method, on the paper's ViTs.

For each model and method: the time of `structinit.initialize` (median of --repeats runs, model
creation excluded), the fidelity on the pseudo input (mean and worst head, every layer) and on real
CIFAR-10 test images resized to the model's input (first layer, mean and worst head). Fidelity is the
mean attention mass on the head's assigned offset (impulse) or on its best offset of the 3x3 kernel
(other methods). Prints a markdown table.

    .venv/bin/python benchmarks/bench_init.py                      # every model, ~8 minutes on 2 cores
    .venv/bin/python benchmarks/bench_init.py --models vit_base_patch16_224 --repeats 5
    .venv/bin/python benchmarks/bench_init.py --models vit_base_patch16_224 --methods timm mimetic \
        "impulse (closed form)" --busy        # alone, then beside a process that keeps every core busy
    .venv/bin/python benchmarks/bench_init.py --models vit_small_patch16_224 --methods "impulse (closed form)" \
        --busy --all-threads --repeats 1      # the same, with the init's ops on every thread as before 0.2
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import timm
import torch
from PIL import Image

import structinit
from structinit.inits import api as init_api
from structinit.training.provenance import cpu_model

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "datasets" / "cifar10"
SMALL = dict(img_size=32, patch_size=4, embed_dim=192, depth=6)
MODELS = {
    "vit_tiny_patch16_224": ("vit_tiny_patch16_224", {}),
    "vit_small_patch16_224": ("vit_small_patch16_224", {}),
    "vit_base_patch16_224": ("vit_base_patch16_224", {}),
    "vit-32px-p4-3heads": ("vit_tiny_patch16_224", {**SMALL, "num_heads": 3}),
    "vit-32px-p4-9heads": ("vit_tiny_patch16_224", {**SMALL, "embed_dim": 180, "num_heads": 9}),
    "vit-32px-p4-12heads": ("vit_tiny_patch16_224", {**SMALL, "num_heads": 12}),
}
METHODS = {
    "timm": ("timm", {}),
    "kaiming": ("kaiming", {}),
    "mimetic": ("mimetic", {}),
    "impulse-soft (closed form)": ("impulse-soft", {}),
    "impulse (closed form)": ("impulse", {}),
    "impulse (refine)": ("impulse", {"solver": "refine"}),
    "impulse-authors[base=keep]": ("impulse-authors", {"base": "keep"}),
}


def load_images(count: int, seed: int = 0) -> torch.Tensor | None:
    """`count` CIFAR-10 test images (a seeded random draw over all classes), as a (B, 3, 32, 32) tensor in [0, 1]."""
    files = sorted(CIFAR.glob("test/*/*.jpg"))
    if not files or count == 0:
        return None
    chosen = random.Random(seed).sample(files, count)
    arrays = [torch.frombuffer(bytearray(Image.open(f).convert("RGB").tobytes()), dtype=torch.uint8) for f in chosen]
    return torch.stack([a.view(32, 32, 3).permute(2, 0, 1) for a in arrays]).float() / 255


def prepare(images: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
    """Resize to the model's input size and normalise with the model's own mean/std."""
    config = model.pretrained_cfg
    mean = torch.tensor(config.get("mean", (0.5, 0.5, 0.5))).view(1, 3, 1, 1)
    std = torch.tensor(config.get("std", (0.5, 0.5, 0.5))).view(1, 3, 1, 1)
    size = tuple(model.patch_embed.img_size)
    resized = torch.nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False)
    return (resized - mean) / std


def first_layer_fidelity(
    model: torch.nn.Module, images: torch.Tensor, report: structinit.Report
) -> tuple[float, float]:
    """Mean and worst-head mass of layer 0 on real images: on the assigned offsets for the impulse
    init (the report's), on each head's best offset otherwise."""
    from structinit.adapters import get_adapter
    from structinit.fidelity import layer_inputs
    from structinit.offsets import offset_mass

    adapter = get_adapter(model)
    layer = adapter.layers()[0]
    with torch.no_grad():
        attn = layer.attention(layer_inputs(adapter, images)[0]).float()
        if report.method == "impulse":
            offsets = [h.offset for h in report.layers[0].heads]
            mass = offset_mass(attn, offsets, adapter.grid, adapter.num_prefix_tokens).tolist()
        else:
            mass = [h.fidelity for h in structinit.fidelity(model, images).layers[0].heads]
    return sum(mass) / len(mass), min(mass)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per model and method (median)")
    parser.add_argument("--images", type=int, default=64, help="CIFAR-10 test images for the real-image column")
    parser.add_argument(
        "--busy", action="store_true", help="time each init alone, then beside a process that keeps every core busy"
    )
    parser.add_argument(
        "--all-threads",
        action="store_true",
        help="the init's torch ops on every thread, as before 0.2 (with --busy: the stall one thread per op avoids)",
    )
    args = parser.parse_args()
    if args.all_threads:
        init_api.one_torch_thread = contextlib.nullcontext
    return contention(args) if args.busy else run(args)


def start_busy_process() -> subprocess.Popen:
    """A process multiplying 1024 x 1024 matrices on every core, as a training beside the init would."""
    loop = (
        "import os, torch\ntorch.set_num_threads(os.cpu_count())\na = torch.randn(1024, 1024)\n"
        "while True:\n    a = (a @ a).tanh_()"
    )
    busy = subprocess.Popen([sys.executable, "-c", loop])
    time.sleep(2)
    return busy


def header() -> None:
    print(f"# structinit {structinit.__version__} init benchmark")
    cpu = cpu_model()
    print(f"machine: {cpu}, {torch.get_num_threads()} threads, torch {torch.__version__}, timm {timm.__version__}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")


def init_seconds(
    arch: str, kwargs: dict, method: str, options: dict, repeats: int
) -> tuple[float, structinit.Report, torch.nn.Module]:
    """Median time of `structinit.initialize` over `repeats` fresh models (creation excluded), last report, model."""
    times = []
    for repeat in range(repeats):
        model = timm.create_model(arch, **kwargs)
        start = time.perf_counter()
        report = structinit.initialize(model, method, seed=repeat, **options)
        times.append(time.perf_counter() - start)
    return statistics.median(times), report, model


def contention(args: argparse.Namespace) -> int:
    """Each init alone, then beside a process that keeps every core busy (a grid's other runs)."""
    header()
    print("\n| model | method | alone (s) | beside a busy process (s) | ratio |\n|---|---|---|---|---|")
    cells = [(model, method) for model in args.models for method in args.methods]
    alone = {cell: init_seconds(*MODELS[cell[0]], *METHODS[cell[1]], args.repeats)[0] for cell in cells}
    busy_process = start_busy_process()
    try:
        busy = {cell: init_seconds(*MODELS[cell[0]], *METHODS[cell[1]], args.repeats)[0] for cell in cells}
    finally:
        busy_process.kill()
        busy_process.wait()
    for model, method in cells:
        a, b = alone[model, method], busy[model, method]
        print(f"| {model} | {method} | {a:.3f} | {b:.3f} | {b / a:.2f}x |")
    return 0


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    images = load_images(args.images)
    header()
    real = f"{args.images} CIFAR-10 test images" if images is not None else f"(no images found under {CIFAR})"
    print(f"real images: {real}\n")
    print(
        "| model | heads x dim | method | seconds | pseudo input: mean (worst) | real images, layer 0: mean (worst) |"
    )
    print("|---|---|---|---|---|---|")
    for model_name in args.models:
        arch, kwargs = MODELS[model_name]
        for method_name in args.methods:
            seconds, report, model = init_seconds(arch, kwargs, *METHODS[method_name], args.repeats)
            attn = model.blocks[0].attn
            real_cell = "-"
            if images is not None:
                mean, worst = first_layer_fidelity(model, prepare(images, model), report)
                real_cell = f"{mean:.3f} ({worst:.3f})"
            print(
                f"| {model_name} | {attn.num_heads} x {attn.head_dim} | {method_name} | {seconds:.3f} "
                f"| {report.mean_fidelity:.3f} ({report.min_fidelity:.3f}) | {real_cell} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
