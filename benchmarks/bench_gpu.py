"""The Table 5 ViT's training step on one GPU, in each variant worth trying, against the chip's own ceiling.

    python benchmarks/bench_gpu.py --data cifar10:../shared/datasets/cifar10   # a GPU: every row (< 6 min)
    python benchmarks/bench_gpu.py --variants train eager compile      # some rows (names: --list)
    python benchmarks/bench_gpu.py ... --profile kernels.txt            # and where the compiled step's time goes
    python benchmarks/bench_gpu.py --smoke                              # any CPU, ~2 min: the checks, a small model

The cell (gpu_table5.py): the paper's v1 ViT, depth 8, width 256, patch 2 at 32 px (256 tokens), batch 512,
AdamW, cosine schedule, clipping at 3, bf16 autocast, RandAugment (m9, n2) + crop + flip on the device.
Rows: `train` is the trainer as a user runs it (`structinit train` itself for 3 epochs: its step, batches,
epoch loop and defaults; images/s of epochs 2-3; needs --data); every other row is the trainer's Recipe
step on the trainer's batches in one variant, eager meaning eager (`compile-*` rows compile with that mode;
`*-no-randaugment` leave RandAugment out; `*-attention` force one attention kernel). Per row: images/s
(augmentation included), TFLOP/s (torch.utils.flop_counter over one step: checked against 6·P·T + 12·L·T²·d
with P = 12·L·d², within 5 %), the fraction of a bf16 GEMM ceiling timed in the same run (8192³, CUDA
events), peak memory, the host synchronisations one step makes, and the first steps' seconds (compilation).
Then RandAugment + crop + flip alone against the first row's step, and with --profile the compiled step's
device time by kind of kernel. Rows past --budget are skipped and say so; each row is printed and saved
(--json) as it comes. --smoke (CPU): a one-block model, the FLOP count against the formula, a compiled step
against the eager one (same init, same batches: losses equal within bf16's tolerance), the trainer's row on
the digits.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity
from torch.utils.flop_counter import FlopCounterMode

from gpu_table5 import MODEL, RECIPE, SMOKE_MODEL  # a script beside this one: the cell's model and recipe
from structinit.data.augment import BatchAugment
from structinit.data.datasets import TensorData, load_data
from structinit.files import atomic_write_text
from structinit.training import TrainConfig
from structinit.training.device import Dist, resolve_amp, resolve_device
from structinit.training.recipe import Recipe
from structinit.training.run import train


@dataclasses.dataclass(frozen=True)
class Variant:
    """How the step runs: torch.compile's mode (None: eager), AdamW's kernel, models trained side by side on
    the same batches, RandAugment on or off, an attention kernel forced (an SDPBackend name; None: torch's)."""

    compile: str | None = "default"
    fused: bool = True
    models: int = 1
    randaugment: bool = True
    attention: str | None = None


# in the order a lease should measure them: those that share one compilation (inductor's cache) first, the
# costly autotuning last, where --budget may cut it. The TRAINER_ROWS are no Variant: the trainer itself.
VARIANTS = {
    "eager": Variant(None),
    "eager-no-randaugment": Variant(None, randaugment=False),
    "eager-foreach-adamw": Variant(None, fused=False),
    "compile": Variant(),
    "compile-no-randaugment": Variant(randaugment=False),
    "compile-flash-attention": Variant(attention="FLASH_ATTENTION"),
    "compile-math-attention": Variant(attention="MATH"),  # unfused: inductor fuses the softmax between two bmm
    "compile-cudnn-attention": Variant(attention="CUDNN_ATTENTION"),
    "compile-efficient-attention": Variant(attention="EFFICIENT_ATTENTION"),
    "compile-two-models": Variant(models=2),
    "compile-cudagraphs": Variant("reduce-overhead"),
    "compile-max-autotune-no-cudagraphs": Variant("max-autotune-no-cudagraphs"),
    "compile-max-autotune": Variant("max-autotune"),
}
TRAINER_ROWS = {"train": None, "train-cudagraphs": "reduce-overhead"}  # the trainer itself, by --compile-mode
SMOKE_VARIANTS = ["train", "eager", "eager-no-randaugment", "eager-foreach-adamw"]
HEADER = ["variant", "img/s", "TFLOP/s", "of ceiling", "peak GiB", "syncs/step", "first steps s"]


@dataclasses.dataclass
class Cell:
    """What the variants share: the data on the device, the trainer's config, the augmentation's setting."""

    data: TensorData
    config: TrainConfig
    device: torch.device
    amp: torch.dtype | None

    def recipe(self, variant: Variant) -> Recipe:
        """The trainer's Recipe, eager unless the variant compiles (the trainer compiles on CUDA by default)."""
        recipe = Recipe(dataclasses.replace(self.config, compile=False), self.data, self.device, Dist())
        recipe.schedule(len(self.data.train_labels) // self.config.batch_size, 0)
        for group in recipe.optimizer.param_groups:  # the trainer's default is fused on CUDA
            group.update(fused=True, foreach=False) if variant.fused else group.update(fused=None, foreach=True)
        if variant.compile is not None:
            recipe.forward = torch.compile(recipe.model, mode=variant.compile)
        return recipe

    def augment(self, randaugment: bool) -> BatchAugment:
        mean = std = (0.5,) * self.data.image_shape[0]
        policy = self.config.randaugment if randaugment else None
        return BatchAugment(mean, std, self.data.image_shape[1] // 8, True, randaugment=policy)

    def batches(self, variant: Variant, steps: int, seed: int = 0):
        """`steps` augmented batches, drawn as the trainer draws them (one permutation per pass, on the host)."""
        images, labels = self.data.train_images, self.data.train_labels
        augment, generator = self.augment(variant.randaugment), torch.Generator().manual_seed(seed)
        batch = self.config.batch_size
        whole = len(labels) // batch
        for i in range(steps):
            if i % whole == 0:
                order = torch.randperm(len(labels), generator=generator)[: whole * batch].view(whole, batch)
                order = order.to(self.device)
            yield augment(images[order[i % whole]], labels[order[i % whole]], generator)


def formula_flops(config: TrainConfig, data: TensorData) -> float:
    """Training FLOPs of one image: 6·P·T for the blocks' matrices (P = 12·L·d²) and 12·L·T²·d for attention."""
    kwargs = config.model_kwargs
    depth, width = kwargs.get("depth", 8), kwargs.get("embed_dim", 256)
    tokens = (data.image_shape[1] // 2) ** 2  # the cell's patch is 2
    return 6 * 12 * depth * width**2 * tokens + 12 * depth * tokens**2 * width


def _sdpa_flops(query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    """A fused attention's matrix products: QK^T and PV, 2 FLOPs a multiply-add."""
    batch, heads, queries, head_dim = query_shape
    return 2 * batch * heads * queries * key_shape[-2] * (head_dim + value_shape[-1])


def _sdpa_backward_flops(grad_shape, query_shape, key_shape, value_shape, *args, **kwargs) -> int:
    return 2 * _sdpa_flops(query_shape, key_shape, value_shape)  # dV, dP, dQ, dK: four products


# torch counts the CUDA kernels of scaled_dot_product_attention, not the CPU's fused one
CPU_ATTENTION = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward_flops,
}


def counted_flops(cell: Cell) -> float:
    """FLOPs per image of one eager training step, as torch's FlopCounterMode counts them."""
    recipe = cell.recipe(Variant(None))
    images, labels = next(cell.batches(Variant(None), 1))
    with FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION) as counter:
        recipe.step(images, labels, 0)
    return counter.get_total_flops() / len(labels)


def gemm_ceiling(device: torch.device, amp: torch.dtype | None) -> float:
    """TFLOP/s of a large matrix product in the run's precision, best of ten (CUDA events on a GPU)."""
    size = 8192 if device.type == "cuda" else 1024
    a = torch.randn(size, size, device=device, dtype=amp or torch.float32)
    b = torch.randn_like(a)
    best = float("inf")
    for _ in range(12):
        best = min(best, timed(lambda: a @ b, device))
    return 2 * size**3 / best / 1e12


def timed(work, device: torch.device) -> float:
    """Seconds `work()` takes (CUDA events on a GPU, so only the device's time counts)."""
    if device.type != "cuda":
        started = time.perf_counter()
        work()
        return time.perf_counter() - started
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    work()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000


def host_syncs(cell: Cell, recipes: list[Recipe], batch) -> int | str:
    """The host synchronisations one step makes (CUDA's sync debug mode; '-' where there is none)."""
    if cell.device.type != "cuda":
        return "-"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for recipe in recipes:
                recipe.step(*batch, 1)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def attention(variant: Variant):
    """The variant's forced attention kernel, or torch's choice."""
    if variant.attention is None:
        return contextlib.nullcontext()
    return sdpa_kernel(getattr(SDPBackend, variant.attention))


def measure(cell: Cell, variant: Variant, steps: int, warmup: int, flops: float, ceiling: float) -> dict:
    """One variant: warm-up steps (compilation), then `steps` timed ones, augmentation included."""
    torch._dynamo.reset()
    if cell.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(cell.device)
    recipes = [cell.recipe(variant) for _ in range(variant.models)]
    batches = cell.batches(variant, warmup + steps + 1)

    def run(count: int) -> None:
        for i, (images, labels) in zip(range(count), batches):
            for recipe in recipes:
                recipe.step(images, labels, i)

    with attention(variant):
        first = timed(lambda: run(warmup), cell.device)
        syncs = host_syncs(cell, recipes, next(batches))
        per_s = steps * cell.config.batch_size * variant.models / timed(lambda: run(steps), cell.device)
    return summarise(cell, per_s, flops, ceiling, syncs, first)


def summarise(cell: Cell, per_s: float, flops: float | None, ceiling: float, syncs, first: float) -> dict:
    tflops = per_s * flops / 1e12 if flops is not None else None
    return {
        "img_per_s": per_s,
        "tflops": tflops,
        "of_ceiling": tflops / ceiling if tflops is not None else None,
        "peak_gib": torch.cuda.max_memory_allocated(cell.device) / 2**30 if cell.device.type == "cuda" else None,
        "syncs_per_step": syncs,
        "first_steps_s": first,
    }


def trainer_row(cell: Cell, data_spec: str, flops: float | None, ceiling: float, epochs: int, mode: str | None):
    """The trainer as a user runs it (`structinit train`'s step, batches and epoch loop, its defaults: compiled
    on CUDA; `mode`: its --compile-mode): `epochs` epochs of the cell; images/s of the epochs after the first
    (which compiles)."""
    torch._dynamo.reset()
    if cell.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(cell.device)
    with tempfile.TemporaryDirectory() as out:
        config = dataclasses.replace(
            cell.config, data=data_spec, epochs=epochs, eval_every=epochs, out=out, quiet=True, compile_mode=mode
        )
        config = dataclasses.replace(config, device=str(cell.device))
        train(config)
        lines = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    later = [line["img_per_s"] for line in lines[1:]]
    return summarise(cell, sum(later) / len(later), flops, ceiling, "-", lines[0]["epoch_seconds"])


def augment_ms(cell: Cell, batches: int = 20) -> dict[str, float]:
    """Milliseconds RandAugment, crop and flip take on one batch alone: the host's (drawing and launching)
    and, on a GPU, the device's (CUDA events; the larger bounds the pace where nothing else runs)."""
    feed = cell.batches(Variant(), batches + 2)
    next(feed), next(feed)  # warm
    if cell.device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    device = timed(lambda: [None for _ in feed], cell.device)
    host = time.perf_counter() - started
    return {"host": host / batches * 1000, "device": device / batches * 1000}


def row(name: str, measured: dict | str) -> list[str]:
    """A table row: three significant digits, '-' for what this device or row cannot tell."""
    if isinstance(measured, str):
        return [name, measured, *[""] * (len(HEADER) - 2)]
    shown = {k: "-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v) for k, v in measured.items()}
    shown["img_per_s"] = f"{measured['img_per_s']:,.0f}"
    if measured["of_ceiling"] is not None:
        shown["of_ceiling"] = f"{measured['of_ceiling']:.1%}"
    return [name, *shown.values()]


def compiled_agrees(cell: Cell, steps: int = 3) -> tuple[list[float], list[float]]:
    """The eager and the compiled step's losses over the same batches, from the same init."""
    losses = {}
    for mode in (None, "default"):
        torch._dynamo.reset()
        recipe = cell.recipe(Variant(mode))
        losses[mode] = [recipe.step(x, y, i).item() for i, (x, y) in enumerate(cell.batches(Variant(mode), steps))]
    return losses[None], losses["default"]


def synthetic(images: int, classes: int = 10) -> TensorData:
    """Random CIFAR-10-sized uint8 images: the pace does not depend on what they show."""
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randint(0, 256, (images, 3, 32, 32), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, classes, (images,), generator=generator)
    return TensorData("random", pixels, labels, pixels[:1000], labels[:1000], [str(c) for c in range(classes)])


def cell_for(args: argparse.Namespace) -> Cell:
    device = resolve_device(args.device, 0)
    amp = resolve_amp("auto", device)
    data = load_data(args.data) if args.data else synthetic(400 if args.smoke else 50_000)
    data = dataclasses.replace(
        data, train_images=data.train_images.to(device), train_labels=data.train_labels.to(device)
    )
    recipe = {**RECIPE, "batch_size": 16 if args.smoke else RECIPE["batch_size"]}
    kwargs = SMOKE_MODEL if args.smoke else {}
    config = TrainConfig(**recipe, data=args.data or "cifar10", model=MODEL, model_kwargs=kwargs, init="kaiming")
    return Cell(data, config, device, amp)


def markdown(rows: list[list]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    return "\n".join(lines + ["| " + " | ".join(str(v) for v in row) + " |" for row in rows]) + "\n"


# what bounds the step: each kernel (or, on a CPU, each op) by the first kind whose word its name holds
KINDS = {
    "attention": ("flash", "fmha", "attention", "sdpa", "cudnn"),
    "GEMM": ("gemm", "cutlass", "nvjet", "xmma", "cublas", "matmul", "aten::mm", "aten::addmm", "aten::bmm"),
    "optimizer": ("multi_tensor", "adam", "foreach"),
    "fused by inductor": ("triton",),
    "copies and indexing": ("memcpy", "memset", "copy", "cat", "index", "gather", "scatter"),
}


def kind_of(name: str) -> str:
    name = name.lower()
    return next((kind for kind, words in KINDS.items() if any(w in name for w in words)), "other")


def profile(cell: Cell, path: Path, steps: int = 6) -> dict[str, float]:
    """Where the compiled step's time goes (device time on a GPU): torch.profiler over `steps` steps after
    the compilation, the kernel table written to `path`, each kind's share returned."""
    torch._dynamo.reset()
    recipe = cell.recipe(Variant())
    batches = cell.batches(Variant(), steps + 3)
    for i, (images, labels) in zip(range(3), batches):
        recipe.step(images, labels, i)
    cuda = cell.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        for i, (images, labels) in enumerate(batches):
            recipe.step(images, labels, i)
        if cuda:
            torch.cuda.synchronize()
    events = prof.key_averages()
    sort = "self_device_time_total" if cuda else "self_cpu_time_total"
    atomic_write_text(path, events.table(sort_by=sort, row_limit=60))
    timed_events = [e for e in events if (e.device_type == DeviceType.CUDA) == cuda]
    if not cuda:  # CPU ops nest: count the aten ops' own time only
        timed_events = [e for e in timed_events if e.key.startswith("aten::")]
    times = {e.key: getattr(e, sort) for e in timed_events}
    total = sum(times.values()) or 1.0
    shares: dict[str, float] = {}
    for key, spent in times.items():
        shares[kind_of(key)] = shares.get(kind_of(key), 0.0) + spent / total
    return dict(sorted(shares.items(), key=lambda item: -item[1]))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", help="variant names (default: all; --smoke: the trainer and eager)")
    parser.add_argument("--list", action="store_true", help="the variants' names")
    parser.add_argument("--data", help="a --data spec (default: random CIFAR-10-sized images; 'train' needs one)")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per variant")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps first (compilation)")
    parser.add_argument("--budget", type=float, default=270, help="seconds; later variants are skipped past it")
    parser.add_argument("--profile", type=Path, help="profile the compiled step: kernel table here, shares printed")
    parser.add_argument("--smoke", action="store_true", help="CPU: a one-block model, the checks")
    parser.add_argument("--json", type=Path, help="write the rows and the checks here too")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join([*TRAINER_ROWS, *VARIANTS]))
        return {}
    names = args.variants or (SMOKE_VARIANTS if args.smoke else [*TRAINER_ROWS, *VARIANTS])
    unknown = [n for n in names if n not in VARIANTS and n not in TRAINER_ROWS]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; --list names them")
    if args.smoke:
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
    started = time.perf_counter()
    cell = cell_for(args)
    flops, formula = counted_flops(cell), formula_flops(cell.config, cell.data)
    ceiling = gemm_ceiling(cell.device, cell.amp)
    result = {
        "device": torch.cuda.get_device_name(cell.device) if cell.device.type == "cuda" else "cpu",
        "precision": str(cell.amp).removeprefix("torch.") if cell.amp else "float32",
        "gflop_per_image": {"counted": flops / 1e9, "formula": formula / 1e9, "ratio": flops / formula},
        "ceiling_tflops": ceiling,
        "rows": {},
    }
    if args.smoke:
        result["eager_losses"], result["compiled_losses"] = compiled_agrees(cell)
    print(
        f"{result['device']}, {result['precision']}: ceiling {ceiling:.3g} TFLOP/s (GEMM); one image "
        f"{flops / 1e9:.3g} GFLOP counted, {formula / 1e9:.3g} by the formula ({flops / formula - 1:+.1%})",
        flush=True,
    )
    for name in names:  # each row printed and saved as it comes: a call cut short keeps what it measured
        result["rows"][name] = measured_row(cell, args, name, flops, ceiling, time.perf_counter() - started)
        print("| " + " | ".join(row(name, result["rows"][name])) + " |", flush=True)
        save(args, result)
    result["augment_ms"] = augment_ms(cell)
    save(args, result)
    print(markdown([row(name, measured) for name, measured in result["rows"].items()]), end="")
    print(augment_line(result, cell.config.batch_size), flush=True)
    if args.profile:
        result["profile"] = profile(cell, args.profile)
        print("device time by kind: " + ", ".join(f"{k} {v:.1%}" for k, v in result["profile"].items()), flush=True)
        save(args, result)
    failed = checks_failed(result)
    if failed:
        raise SystemExit("bench_gpu.py: " + "; ".join(failed))
    return result


def measured_row(cell: Cell, args: argparse.Namespace, name: str, flops: float, ceiling: float, spent: float):
    """A row's numbers, or why it has none."""
    if spent > args.budget:
        return "skipped: --budget spent"
    if name not in TRAINER_ROWS:
        try:  # a kernel this build lacks fails its row, not the lease's table
            return measure(cell, VARIANTS[name], args.steps, args.warmup, flops, ceiling)
        except (RuntimeError, NotImplementedError) as error:
            return f"failed: {str(error).strip().splitlines()[0][:150]}"
    if args.data is None and not args.smoke:
        return "skipped: needs --data (the trainer reads a spec)"
    # --smoke: the trainer on the digits, so its FLOPs are not the cell's (its TFLOP/s are left out)
    epochs, mode = 2 if args.smoke else 3, TRAINER_ROWS[name]
    return trainer_row(cell, args.data or "digits", flops if args.data else None, ceiling, epochs, mode)


def save(args: argparse.Namespace, result: dict) -> None:
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=2))


def augment_line(result: dict, batch: int) -> str:
    """RandAugment, crop and flip alone, against the step of the trainer's row (or the first one measured)."""
    rows = [r for r in result["rows"].values() if isinstance(r, dict) and r["of_ceiling"] is not None]
    ms = max(result["augment_ms"].values())
    line = "RandAugment (m9, n2) + crop + flip alone, a batch of {}: host {host:.2f} ms, device {device:.2f} ms"
    line = line.format(batch, **result["augment_ms"])
    if rows:
        step_ms = batch / rows[0]["img_per_s"] * 1000
        name = next(k for k, r in result["rows"].items() if r is rows[0])
        line += f"; the larger is {ms / step_ms:.1%} of the {name} step"
    return line


def checks_failed(result: dict) -> list[str]:
    """What the run contradicts: the FLOP count more than 5 % off the formula; a compiled step whose loss
    differs from the eager one's by more than bf16's resolution (2^-8, relative)."""
    failed = []
    ratio = result["gflop_per_image"]["ratio"]
    if abs(ratio - 1) > 0.05:
        failed.append(f"the counted FLOPs are {ratio:.3f} times the formula's")
    for step, (eager, compiled) in enumerate(zip(result.get("eager_losses", []), result.get("compiled_losses", []))):
        if abs(eager - compiled) > 2**-8 * abs(eager):
            failed.append(f"step {step}: compiled loss {compiled:.5f}, eager {eager:.5f}")
    return failed


if __name__ == "__main__":
    main()
    sys.exit(0)
