"""Two measurements docs/methods.md and the init's docstrings quote.

1. Why mimetic init of ViT-B is slow: the cost of one exact factorisation of a 768x768 matrix
   (eigendecomposition of its Gram matrix, and a full SVD), and how much of the optimal rank-64
   energy of alpha Z + beta I a batched randomised SVD captures at 1-6 power iterations.
2. The eigenpairs behind mimetic's factors since 0.3.1 (inits/partial_eigh.py): 12 heads' top 64 of a
   768x768 Gram matrix, one after another and on two threads (as mimetic's workers run them), by torch's
   eigh of all of them (float32: 0.2; float64: 0.3.0), scipy's dsyevx wrapper and structinit's ctypes call.
3. What `blind_to_content` does: first-layer fidelity of the sharp impulse init (labels.BUNDLE, `impulse`
   before 0.3) on CIFAR-10 test images (64, from ../shared/datasets/cifar10) for the 32 px / patch-4 ViTs,
   with it on and off.
4. Where each init's structure shows on the README's model (ViT-Ti, 32 px, patch 4, learned position
   table): mean fidelity over every layer and head on the pseudo input and on the same 64 CIFAR-10 test
   images (structinit.measure_on_images), and how many of the model's tensors the init changes from timm's
   construction (the README's "every other weight" statement).

5. What a run's start-up measurement costs (training/startup.measure_init: the init's fidelity on 16 of the
   run's images, once before training): seconds for the README's model and ViT-S/16 at 224 px.

    .venv/bin/python benchmarks/bench_details.py          # about a minute on 2 cores
    .venv/bin/python benchmarks/bench_details.py --only on-images
    .venv/bin/python benchmarks/bench_details.py --only startup
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import scipy.linalg
import timm
import torch
from threadpoolctl import threadpool_limits

import structinit
from bench_init import load_images, prepare
from structinit.adapters import get_adapter
from structinit.inits.labels import BUNDLE
from structinit.inits.partial_eigh import largest_eigenpairs
from structinit.measure import layer_inputs
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


def eigenpairs_cost() -> None:
    dim, rank, heads = 768, 64, 12
    generator = torch.Generator().manual_seed(0)
    m = 0.7 * (torch.rand(heads, dim, dim, generator=generator) * 2 - 1) * (3 / dim) ** 0.5 + 0.7 * torch.eye(dim)
    grams = [(one @ one.T).double() for one in m.double()]
    ways = {
        "torch eigh, all, float32 (0.2)": lambda a: torch.linalg.eigh(a.float()),
        "torch eigh, all, float64 (0.3.0)": torch.linalg.eigh,
        "scipy's dsyevx wrapper, top 64": lambda a: scipy.linalg.eigh(
            a.numpy(), subset_by_index=[dim - rank, dim - 1], driver="evx", check_finite=False
        ),
        "dsyevx through ctypes, top 64 (0.3.1)": lambda a: largest_eigenpairs(a.numpy(), rank),
    }
    print("\n| 12 heads' eigenpairs (768 x 768) | one after another (s) | on two threads (s) |\n|---|---|---|")
    with threadpool_limits(1), ThreadPoolExecutor(2, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        torch.set_num_threads(1)
        for name, way in ways.items():
            alone = timed(lambda way=way: [way(a) for a in grams], repeats=3)
            paired = timed(lambda way=way: list(pool.map(way, grams)), repeats=3)
            print(f"| {name} | {alone:.3f} | {paired:.3f} |")


def content_blindness(images: torch.Tensor) -> None:
    print("\n| model | blind_to_content | real images, layer 0: mean (worst) |")
    print("|---|---|---|")
    for heads, dim in ((3, 192), (9, 180), (12, 192)):
        for blind in (False, True):
            torch.manual_seed(0)
            model = timm.create_model(
                "vit_tiny_patch16_224", img_size=32, patch_size=4, depth=6, embed_dim=dim, num_heads=heads
            )
            report = structinit.initialize(model, BUNDLE, seed=0, blind_to_content=blind)  # the sharp form
            adapter = get_adapter(model)
            layer = adapter.layers()[0]
            with torch.no_grad():
                attn = layer.attention(layer_inputs(adapter, prepare(images, model))[0]).float()
            offsets = [h.offset for h in report.layers[0].heads]
            mass = offset_mass(attn, offsets, adapter.grid, adapter.num_prefix_tokens)
            print(f"| 32px-p4, {heads} heads | {blind} | {mass.mean():.3f} ({mass.min():.3f}) |")


# where the structure lives: a learned table read through each block's LayerNorm (the README's ViT-Ti) and a
# relative-position bias table added to the logits (BEiT, the same width, heads and depth)
ON_IMAGES = (
    ("ViT-Ti, learned table", "vit_tiny_patch16_224", {}, ("impulse", "impulse-neurips", "mimetic[base=kaiming]")),
    ("BEiT, bias table", "beit_base_patch16_224", dict(embed_dim=192, num_heads=3), ("impulse", "mimetic")),
)


def structure_on_images(images: torch.Tensor) -> None:
    kwargs = dict(img_size=32, patch_size=4, num_classes=10)
    print("\n| model (32 px, patch 4) | init | fidelity, pseudo input | on 64 CIFAR-10 images | tensors changed |")
    print("|---|---|---|---|---|")
    for name, arch, extra, labels in ON_IMAGES:
        for label in (*labels, "timm", "kaiming"):
            torch.manual_seed(0)
            model = timm.create_model(arch, **kwargs, **extra)
            built = {key: t.clone() for key, t in model.state_dict().items()}
            report = structinit.initialize(model, label, seed=0)
            if arch.startswith("beit"):
                mean, uniform = bias_table_on_images(model, report, prepare(images, model))
            else:
                structinit.measure_on_images(report, model, prepare(images, model))
                mean, uniform = report.on_images["mean"], report.on_images["uniform"]
            changed = sum(not torch.equal(t, built[key]) for key, t in model.state_dict().items())
            print(
                f"| {name} | {label} | {report.mean_fidelity:.3f} | {mean:.3f} (uniform {uniform:.3f}) "
                f"| {changed} of {len(built)} |"
            )


@torch.no_grad()
def bias_table_on_images(model: torch.nn.Module, report, images: torch.Tensor) -> tuple[float, float]:
    """BEiT's mean share on each head's reported offset over the images (structinit measures images on ViT
    families only): its maps read off the softmax (timm's unfused path) by a hook on attn_drop."""
    maps = []
    for block in model.blocks:
        block.attn.fused_attn = False
        block.attn.attn_drop.register_forward_hook(lambda module, args, out: maps.append(args[0]))
    model.eval()(images)
    grid, prefix = tuple(model.patch_embed.grid_size), model.num_prefix_tokens
    shares = [
        offset_mass(a.float(), [h.offset for h in layer.heads], grid, prefix) for a, layer in zip(maps, report.layers)
    ]
    return torch.cat(shares).mean().item(), 1 / maps[0].shape[-1]


def startup_cost() -> None:
    from structinit.data.datasets import TensorData
    from structinit.training.startup import SAMPLE, measure_init

    print(f"\n| model | start-up measurement on {SAMPLE} images (s) |")
    print("|---|---|")
    for name, kwargs, size in (
        ("README's model", dict(img_size=32, patch_size=4, num_classes=10), 32),
        ("ViT-S/16 224", dict(num_classes=10), 224),
    ):
        model = timm.create_model("vit_tiny_patch16_224" if size == 32 else "vit_small_patch16_224", **kwargs)
        report = structinit.initialize(model, "mimetic", seed=0)
        images = torch.randint(0, 256, (SAMPLE, 3, size, size), dtype=torch.uint8)
        data = TensorData("random", images, torch.zeros(SAMPLE, dtype=torch.long), images, torch.zeros(SAMPLE), ["a"])
        seconds = timed(lambda r=report, m=model, d=data: measure_init(r, m, d, 3), repeats=3)
        print(f"| {name} | {seconds:.2f} |")


def main() -> int:
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}\n")
    if sys.argv[1:] == ["--only", "startup"]:
        startup_cost()
        return 0
    if sys.argv[1:] == ["--only", "on-images"]:
        images = load_images(64)
        if images is None:
            raise SystemExit("no CIFAR-10 images under ../shared/datasets/cifar10")
        structure_on_images(images)
        return 0
    factorisation_cost()
    threads = torch.get_num_threads()
    eigenpairs_cost()
    torch.set_num_threads(threads)
    images = load_images(64)
    if images is None:
        print("\n(no CIFAR-10 images under ../shared/datasets/cifar10: content-blindness table skipped)")
    else:
        content_blindness(images)
        structure_on_images(images)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
