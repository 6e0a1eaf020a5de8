"""The in-memory augmentation's cost on a CPU: RandAugment + crop + flip on one batch, as the trainer runs it.

    python benchmarks/bench_augment.py                  # batch 512, rand-m9-n2, one thread (~10 s)
    python benchmarks/bench_augment.py --batch 128 --randaugment rand-m9-mstd0.5-inc1

Two sizes: 32 px (CIFAR-10: the work itself) and 2 px, where the arithmetic is nothing and what is left
is the host's part, drawing and dispatching each op: on a GPU that part is the host time a step's
augmentation costs (the device's part is bench_gpu.py's). Median of --repeats batches, milliseconds.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from structinit.data.augment import BatchAugment


def batch_ms(augment: BatchAugment, size: int, batch: int, repeats: int) -> float:
    images = torch.randint(0, 256, (batch, 3, size, size), dtype=torch.uint8)
    labels = torch.zeros(batch, dtype=torch.long)
    generator = torch.Generator().manual_seed(0)
    augment(images, labels, generator)  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        augment(images, labels, generator)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> dict[int, float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--randaugment", default="rand-m9-n2")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    augment = BatchAugment((0.5,) * 3, (0.5,) * 3, 4, True, randaugment=args.randaugment)
    result = {size: batch_ms(augment, size, args.batch, args.repeats) for size in (32, 2)}
    print(f"{platform.processor() or platform.machine()}, {args.threads} thread(s), torch {torch.__version__}")
    for size, ms in result.items():
        print(f"{args.randaugment} + crop + flip, batch {args.batch} at {size} px: {ms:.2f} ms")
    return result


if __name__ == "__main__":
    main()
