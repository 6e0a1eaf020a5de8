"""Two measurements docs/methods.md and the init's docstrings quote.

1. Why mimetic init of ViT-B is slow: the cost of one exact factorisation of a 768x768 matrix
   (eigendecomposition of its Gram matrix, and a full SVD), and how much of the optimal rank-64
   energy of alpha Z + beta I a batched randomised SVD captures at 1-6 power iterations.
2. What `blind_to_content` does: first-layer fidelity of the sharp impulse init (impulse) on CIFAR-10 test images
   (64, from ../shared/datasets/cifar10) for the 32 px / patch-4 ViTs, with it on and off.

    .venv/bin/python benchmarks/bench_details.py          # about a minute on 2 cores
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from pathlib import Path

import timm
import torch

import structinit
from bench_init import load_images, prepare
from structinit.adapters import get_adapter
from structinit.fidelity import layer_inputs
from structinit.offsets import offset_mass


def timed(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def factorisation_cost() -> None:
    dim, rank, heads = 768, 64, 12
    generator = torch.Generator().manual_seed(0)
    z = (torch.rand(heads, dim, dim, generator=generator) * 2 - 1) * (3 / dim) ** 0.5
    m = 0.7 * z + 0.7 * torch.eye(dim)
    eigh = timed(lambda: torch.linalg.eigh(m[0] @ m[0].T))
    svd = timed(lambda: torch.linalg.svd(m[0]))
    print(f"one 768x768 factorisation: eigh of the Gram matrix {1000 * eigh:.0f} ms, full SVD {1000 * svd:.0f} ms")
    optimal = torch.linalg.eigvalsh(m @ m.transpose(-1, -2))[..., -rank:].sum(-1)
    print("\n| power iterations | seconds for 12 heads | captured / optimal rank-64 energy |")
    print("|---|---|---|")
    for iterations in (1, 2, 4, 6):

        def randomised(iterations: int = iterations) -> torch.Tensor:
            y = m @ torch.randn(heads, dim, rank + 16, generator=generator)
            for _ in range(iterations):
                y = m @ (m.transpose(-1, -2) @ torch.linalg.qr(y)[0])
            basis = torch.linalg.qr(y)[0]
            return torch.linalg.svdvals(basis.transpose(-1, -2) @ m)[..., :rank]

        seconds = timed(randomised, repeats=3)
        captured = randomised().pow(2).sum(-1)
        print(f"| {iterations} | {seconds:.3f} | {(captured / optimal).mean():.3f} |")
    exact = timed(lambda: torch.linalg.eigh(m @ m.transpose(-1, -2)), repeats=3)
    print(f"| exact (batched eigh) | {exact:.3f} | 1.000 |")


def content_blindness(images: torch.Tensor) -> None:
    print("\n| model | blind_to_content | real images, layer 0: mean (worst) |")
    print("|---|---|---|")
    for heads, dim in ((3, 192), (9, 180), (12, 192)):
        for blind in (False, True):
            torch.manual_seed(0)
            model = timm.create_model(
                "vit_tiny_patch16_224", img_size=32, patch_size=4, depth=6, embed_dim=dim, num_heads=heads
            )
            report = structinit.initialize(model, "impulse", seed=0, blind_to_content=blind)
            adapter = get_adapter(model)
            layer = adapter.layers()[0]
            with torch.no_grad():
                attn = layer.attention(layer_inputs(adapter, prepare(images, model))[0]).float()
            offsets = [h.offset for h in report.layers[0].heads]
            mass = offset_mass(attn, offsets, adapter.grid, adapter.num_prefix_tokens)
            print(f"| 32px-p4, {heads} heads | {blind} | {mass.mean():.3f} ({mass.min():.3f}) |")


def main() -> int:
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}\n")
    factorisation_cost()
    images = load_images(64)
    if images is None:
        print("\n(no CIFAR-10 images under ../shared/datasets/cifar10: content-blindness table skipped)")
    else:
        content_blindness(images)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
