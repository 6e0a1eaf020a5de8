"""What the memory guard of model construction (models.check_room, issues 67 and 75) costs: create_model of
three sizes, with the guard (sketches of the model on the meta device, its bytes extrapolated over its
blocks) and with it replaced by a no-op, interleaved, best of 7 each in the process's CPU time
(time.process_time: other processes on shared cores moved wall times by half from run to run), and the
guard alone on the same arguments, best of 30; then how long a model of 10^6 blocks takes to be refused.

    .venv/bin/python benchmarks/bench_guard.py      # ~40 s on 2 cores
"""

import platform
import time
from pathlib import Path

import torch

from structinit import models
from structinit.errors import RunError

NAMES = ("vit_digits", "vit_tiny_patch16_224", "vit_base_patch16_224")
REPEATS = 7
GUARD_REPEATS = 30  # the guard alone, on the arguments a build gave it: milliseconds, so more of them


def build_ms(name: str) -> float:
    """The process's CPU milliseconds of create_model(name)."""
    started = time.process_time()
    models.create_model(name, num_classes=1000, in_chans=3, data_size=None)
    return (time.process_time() - started) * 1e3


def guard_ms(guard, args: tuple) -> float:  # type: ignore[no-untyped-def]
    """The process's CPU milliseconds of the guard on `args`."""
    started = time.process_time()
    guard(*args)
    return (time.process_time() - started) * 1e3


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what platform knows."""
    info = Path("/proc/cpuinfo")
    lines = info.read_text().splitlines() if info.exists() else []
    named = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
    return named or platform.processor() or platform.machine()


def main() -> None:
    guarded, asked = models.check_room, []

    def recorded(*args):  # type: ignore[no-untyped-def]
        asked.append(args)
        return guarded(*args)

    print(f"{cpu_name()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| model | guarded CPU ms | unguarded CPU ms | the guard's CPU ms | its share |\n|---|---|---|---|---|")
    for name in NAMES:
        build_ms(name)  # warm: timm's registry, torch's kernels
        with_guard, without = [], []
        for _ in range(REPEATS):
            models.check_room = recorded
            with_guard.append(build_ms(name))
            models.check_room = lambda *args: True  # no estimate, and so no count while building either
            without.append(build_ms(name))
        models.check_room = guarded
        guard = min(guard_ms(guarded, asked[-1]) for _ in range(GUARD_REPEATS))
        share = guard / min(without)
        print(f"| {name} | {min(with_guard):.1f} | {min(without):.1f} | {guard:.1f} | {share:.1%} |")
    started = time.process_time()
    try:
        models.create_model("vit_tiny_patch16_224", num_classes=1000, in_chans=3, data_size=None, depth=10**6)
    except RunError as error:
        print(f"\ndepth=10^6 refused in {(time.process_time() - started) * 1e3:.0f} CPU ms: {error}")


if __name__ == "__main__":
    main()
