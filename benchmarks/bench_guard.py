"""What the memory guard of model construction (memory.allocations_checked, issue 67) costs: create_model
of three sizes with the guard and with it replaced by a no-op, best of 5 each, interleaved.

    .venv/bin/python benchmarks/bench_guard.py      # ~30 s on 2 cores
"""

import contextlib
import platform
import time

import torch

from structinit import models

NAMES = ("vit_digits", "vit_tiny_patch16_224", "vit_base_patch16_224")


def best(name: str, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        models.create_model(name, num_classes=1000, in_chans=3, data_size=None)
        times.append(time.perf_counter() - started)
    return min(times)


def main() -> None:
    guarded = models.allocations_checked
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| model | guarded ms | unguarded ms | ratio |\n|---|---|---|---|")
    for name in NAMES:
        best(name, 1)  # warm: timm's registry, torch's kernels
        with_guard = best(name)
        models.allocations_checked = lambda what, fix: contextlib.nullcontext()
        without = best(name)
        models.allocations_checked = guarded
        print(f"| {name} | {with_guard * 1e3:.1f} | {without * 1e3:.1f} | {with_guard / without:.2f} |")


if __name__ == "__main__":
    main()
