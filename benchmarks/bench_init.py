"""Init speed and attention fidelity of every method, on the paper's ViTs.

--speed (docs/bench_init.md's first table): each init's time cold (an empty solve cache, the first call
of its kind in a fresh process) and warm (the cache filled: median of two more calls), as a ratio to timm's
own init of the same model (model.init_weights(), median of three) in the same process; a process a model.
"impulse, table off" is impulse with the shipped table of solved values hidden: the solve a model that is
not in it pays.

Otherwise, for each model and method: the time of `structinit.initialize` (median of --repeats runs, model
creation excluded), the fidelity on the pseudo input (mean and worst head, every layer) and on real
CIFAR-10 test images resized to the model's input (first layer, mean and worst head). Fidelity is the
mean attention mass on the head's assigned offset (impulse) or on its best offset of the 3x3 kernel
(other methods). Prints a markdown table.

    .venv/bin/python benchmarks/bench_init.py --speed                # cold and warm, ~15 minutes on 2 cores
    .venv/bin/python benchmarks/bench_init.py --speed --speed-models vit_base_patch16_224 --methods mimetic
    git worktree add ../old 80c85a9 && .venv/bin/python benchmarks/bench_init.py --against ../old \\
        --methods timm mimetic        # this tree's init times beside an older checkout's, same machine
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
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
from PIL import Image

import structinit
from structinit.errors import RunError
from structinit.files import regular_file
from structinit.inits import api as init_api
from structinit.inits import sharpness
from structinit.models import PRESETS, create_model
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
    "impulse": ("impulse", {}),
    "impulse-soft": ("impulse-soft", {}),
    "impulse (refine)": ("impulse", {"solver": "refine"}),
    "impulse-neurips": ("impulse-neurips", {}),
    "qk-norm": ("qk-norm", {}),
}
# the README's model, ViT-Ti/S/B at 224, ViT-B at 384 and the paper's Table 5 ViT (a structinit preset)
SPEED_MODELS = {
    "README's model": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, num_classes=10)),
    "vit_tiny_patch16_224": ("vit_tiny_patch16_224", {}),
    "vit_small_patch16_224": ("vit_small_patch16_224", {}),
    "vit_base_patch16_224": ("vit_base_patch16_224", {}),
    "vit_base_patch16_384": ("vit_base_patch16_384", {}),
    "Table 5 ViT": ("vit_w256_d8_p2_gap_sincos", {}),
    "vit_small at 64 px, patch 4": ("vit_small_patch16_224", dict(img_size=64, patch_size=4, num_classes=10)),
    "vit_base at 96 px, patch 8": ("vit_base_patch16_224", dict(img_size=96, patch_size=8, num_classes=10)),
}
TABLE_OFF = "impulse, table off"


def load_images(count: int, seed: int = 0) -> torch.Tensor | None:
    """`count` CIFAR-10 test images (a seeded random draw over all classes), as a (B, 3, 32, 32) tensor in [0, 1]."""
    files = sorted(CIFAR.glob("test/*/*.jpg"))
    if not files or count == 0:
        return None
    chosen = random.Random(seed).sample(files, count)
    for f in chosen:  # a FIFO or a device among the images would hang the read: one line
        try:
            regular_file(f)
        except RunError as error:
            raise SystemExit(f"bench_init.py: error: {error}") from None
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
    from structinit.measure import layer_inputs
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


def build(name: str) -> torch.nn.Module:
    arch, kwargs = SPEED_MODELS[name]
    if arch in PRESETS:
        return create_model(arch, num_classes=10, in_chans=3, data_size=None)
    return timm.create_model(arch, **kwargs)


def speed_of_one(name: str, methods: list[str]) -> list[dict]:
    """In this process: timm's own init of model `name`, then each method cold and warm."""
    own, model = [], build(name)  # timm's own init on a model of its own: it redraws a preset's sin-cos table
    for _ in range(3):
        start = time.perf_counter()
        model.init_weights()
        own.append(time.perf_counter() - start)
    model = build(name)
    rows = []
    for label in methods:
        method, options = METHODS.get(label, ("impulse", {}))
        with tempfile.TemporaryDirectory() as cache:
            os.environ["STRUCTINIT_CACHE"] = cache
            lookup = sharpness.table_value
            if label == TABLE_OFF:
                sharpness.table_value = lambda *shape: None
            times, report = [], None
            for seed in range(3):
                start = time.perf_counter()
                report = structinit.initialize(model, method, seed=seed, **options)
                times.append(time.perf_counter() - start)
            sharpness.table_value = lookup
        found = report.source.get("target_fidelity", "").partition("; ")[2].rstrip(")")
        rows.append(
            dict(
                model=name,
                method=label,
                own=statistics.median(own),
                cold=times[0],
                warm=statistics.median(times[1:]),
                found=found,
            )
        )
    return rows


def speed(args: argparse.Namespace) -> int:
    """Each model in its own process (a cold start is a first call), the rows as a markdown table."""
    header()
    print("\n| model | init | cold (s) | warm (s) | cold ÷ timm's own | warm ÷ timm's own | sharpness from |")
    print("|---|---|---|---|---|---|---|")
    methods = [m for m in args.methods if m != "impulse (refine)"] + ([TABLE_OFF] if "impulse" in args.methods else [])
    for name in args.speed_models:
        code = "import json, sys; sys.path.insert(0, sys.argv[1]); import bench_init as b; "
        code += "print(json.dumps(b.speed_of_one(sys.argv[2], sys.argv[3:])))"
        out = subprocess.run([sys.executable, "-W", "ignore", "-c", code, str(Path(__file__).parent), name, *methods],
                             capture_output=True, text=True, check=True).stdout  # fmt: skip
        for row in json.loads(out.splitlines()[-1]):
            cold, warm = row["cold"] / row["own"], row["warm"] / row["own"]
            times = f"{row['cold']:.2f} | {row['warm']:.2f} | {cold:.1f}x | {warm:.1f}x"
            print(f"| {row['model']} | {row['method']} | {times} | {row['found'] or '-'} |", flush=True)
    print("\ntimm's own init (model.init_weights()), median of 3, in the same process as each model's rows")
    return 0


AGAINST = """
import sys, time, timm, structinit
model = timm.create_model(sys.argv[1])
structinit.initialize(model, "timm", seed=0)
for method in sys.argv[2:]:
    start = time.perf_counter()
    structinit.initialize(model, method, seed=1)
    print(method, time.perf_counter() - start)
"""


def against(args: argparse.Namespace) -> int:
    """This tree's inits beside another checkout's (--against DIR), in alternating processes on one machine."""
    header()
    trees = {"this tree": ROOT, args.against: Path(args.against)}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": str(tree / "src")}
            out = subprocess.run([sys.executable, "-W", "ignore", "-c", AGAINST, args.against_model, *args.methods],
                                 env=env, capture_output=True, text=True, check=True).stdout  # fmt: skip
            for line in out.splitlines():
                method, seconds = line.rsplit(" ", 1)
                times.setdefault((label, method), []).append(float(seconds))
    print(f"\n{args.against_model}, {args.rounds} alternating processes a tree, median seconds\n")
    print(f"| init | this tree | {args.against} | ratio |\n|---|---|---|---|")
    for method in args.methods:
        ours, theirs = (statistics.median(times[label, method]) for label in trees)
        print(f"| {method} | {ours:.2f} | {theirs:.2f} | {ours / theirs:.2f}x |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed", action="store_true", help="cold and warm times against timm's own init")
    parser.add_argument("--speed-models", nargs="+", default=list(SPEED_MODELS), choices=list(SPEED_MODELS))
    parser.add_argument(
        "--against", help="a checkout (a git worktree) to time beside this one: --methods there and here"
    )
    parser.add_argument("--against-model", default="vit_base_patch16_224")
    parser.add_argument("--rounds", type=int, default=5, help="with --against: processes a tree, alternating")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
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
    if args.against:
        return against(args)
    unknown = set(args.methods) - set(METHODS)
    if unknown:
        parser.error(f"unknown --methods {sorted(unknown)}: choose from {list(METHODS)}")
    if args.speed:
        return speed(args)
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
