"""Training throughput of `structinit train` against a plain eager fp32 PyTorch loop, same model.

Model: ViT-T depth 12 (192 wide, 3 heads), 32 px, patch 4, on CIFAR-10 from ../shared/datasets/cifar10
(ImageFolder of JPEGs). Both train the same stratified subset with the same recipe (AdamW lr 1e-3,
wd 0.05, cosine with warmup, label smoothing 0.1, crop with 4 px padding + flip, batch 128) for the
same epochs, then report throughput (training images per second, evaluation excluded) and test
top-1 on the full 10,000-image test set.

- plain loop: torchvision ImageFolder + transforms (decode and augment every JPEG every epoch) in a
  DataLoader with 2 workers, fp32 eager forward/backward.
- structinit train: images decoded once into a uint8 tensor (cached), augmented as whole batches,
  bf16 autocast where the CPU supports it.

    .venv/bin/python benchmarks/bench_train.py                   # 2 epochs on 500 images/class, ~10 min
    .venv/bin/python benchmarks/bench_train.py --per-class 100 --epochs 1
    .venv/bin/python benchmarks/bench_train.py --attention-only   # the second table, ~1 min
    .venv/bin/python benchmarks/bench_train.py --eval-only        # the third table, ~1 min

Second table: why `structinit train` runs timm's attention unfused on a CPU under bf16. One training
step (batch 128, random images) of the study's ViT (width 192, depth 6, 32 px / patch 4) with 12 and
3 heads, torch's fused scaled_dot_product_attention against the plain softmax(q k^T) v.

Third table: why the `cpu-quick` preset evaluates in batches of 128 (the trainer's default is 512,
for GPUs). Inference throughput of the same ViT (bf16 autocast, unfused attention, random images)
by evaluation batch size, the best of three passes.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch
from timm.loss import LabelSmoothingCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler
from torchvision import datasets, transforms

import structinit
from structinit.data.subsets import stratified_subset
from structinit.training import TrainConfig, train
from structinit.training.device import resolve_amp

ROOT = Path(__file__).resolve().parents[1]
CIFAR = ROOT.parent / "shared" / "datasets" / "cifar10"
MODEL = dict(img_size=32, patch_size=4, depth=12, num_classes=10)


def plain_loop(per_class: int, epochs: int, batch: int, seed: int) -> tuple[float, float]:
    """What a user writes by hand: returns (train images/s, test top-1 %)."""
    torch.manual_seed(seed)
    mean, std = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
    train_tf = transforms.Compose(
        [
            transforms.RandomCrop(32, 4),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )
    test_tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    train_set = datasets.ImageFolder(str(CIFAR / "train"), train_tf)
    keep = stratified_subset(torch.tensor(train_set.targets), per_class, None, 0).tolist()
    train_set = torch.utils.data.Subset(train_set, keep)
    test_set = datasets.ImageFolder(str(CIFAR / "test"), test_tf)
    loader = torch.utils.data.DataLoader(
        train_set, batch, shuffle=True, drop_last=True, num_workers=2, persistent_workers=True
    )
    model = timm.create_model("vit_tiny_patch16_224", **MODEL)
    structinit.initialize(model, "impulse", seed=seed)
    steps = len(loader)
    optimizer = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05)
    scheduler = CosineLRScheduler(
        optimizer, t_initial=epochs * steps, lr_min=1e-5, warmup_t=steps // 2, warmup_lr_init=1e-6, t_in_epochs=False
    )
    criterion = LabelSmoothingCrossEntropy(0.1)
    seen, seconds = 0, 0.0
    for epoch in range(epochs):
        model.train()
        start = time.perf_counter()
        for step, (images, labels) in enumerate(loader):
            loss = criterion(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step_update(epoch * steps + step + 1)
            seen += len(images)
        seconds += time.perf_counter() - start
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in torch.utils.data.DataLoader(test_set, 500, num_workers=2):
            correct += (model(images).argmax(1) == labels).sum().item()
    return seen / seconds, 100 * correct / len(test_set)


def structinit_run(per_class: int, epochs: int, batch: int, seed: int, out: Path) -> tuple[float, float]:
    config = TrainConfig(
        data=f"cifar10:{CIFAR}",
        per_class=per_class,
        model="vit_tiny_patch16_224",
        model_kwargs={k: v for k, v in MODEL.items() if k != "num_classes"},
        init="impulse",
        epochs=epochs,
        batch_size=batch,
        warmup_epochs=0.5,
        seed=seed,
        out=str(out),
        quiet=True,
    )
    train(config)  # the first run decodes and caches the images; time the epochs only
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    images = sum(m["img_per_s"] * m["epoch_seconds"] for m in lines)
    return images / sum(m["epoch_seconds"] for m in lines), lines[-1]["test_top1"]


def study_vit(heads: int, fused: bool) -> torch.nn.Module:
    """The study's ViT (width 192, depth 6, 32 px / patch 4), seed 0, with or without fused attention."""
    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", **{**MODEL, "depth": 6, "num_heads": heads})
    for block in model.blocks:
        block.attn.fused_attn = fused
    return model


def attention_kernels(batch: int, steps: int = 4) -> None:
    print("| heads | autocast | fused SDPA img/s | unfused img/s |")
    print("|---|---|---|---|")
    for amp in (torch.bfloat16, None):
        for heads in (12, 3):
            speeds = []
            for fused in (True, False):
                model = study_vit(heads, fused)
                optimizer = torch.optim.AdamW(model.parameters())
                images, labels = torch.randn(batch, 3, 32, 32), torch.randint(10, (batch,))
                for step in range(steps + 2):  # two warm-up steps
                    if step == 2:
                        start = time.perf_counter()
                    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                        loss = torch.nn.functional.cross_entropy(model(images), labels)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                speeds.append(steps * batch / (time.perf_counter() - start))
            print(f"| {heads} | {'bf16' if amp else 'fp32'} | {speeds[0]:.0f} | {speeds[1]:.0f} |", flush=True)


def eval_batches(sizes=(128, 256, 512), images: int = 2048, repeats: int = 3) -> None:
    """Inference img/s by batch size: the best of `repeats` passes over the images (this VM is noisy)."""
    print("| heads | " + " | ".join(f"batch {b} img/s" for b in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for heads in (12, 3):
        model = study_vit(heads, fused=False).eval()
        batch = torch.randn(images, 3, 32, 32)
        speeds = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for size in sizes:
                model(batch[:size])  # warm-up
                best = float("inf")
                for _ in range(repeats):
                    start = time.perf_counter()
                    for chunk in batch.split(size):
                        model(chunk)
                    best = min(best, time.perf_counter() - start)
                speeds.append(images / best)
        print(f"| {heads} | " + " | ".join(f"{s:.0f}" for s in speeds) + " |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-class", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention-only", action="store_true", help="only the attention-kernel table")
    parser.add_argument("--eval-only", action="store_true", help="only the evaluation batch-size table")
    args = parser.parse_args()
    if not (CIFAR / "train").is_dir():
        print(f"CIFAR-10 ImageFolder not found at {CIFAR}", file=sys.stderr)
        return 1
    amp = resolve_amp("auto", torch.device("cpu"))
    print(f"# structinit {structinit.__version__} training throughput")
    print(f"machine: {platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}, amp: {amp}")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    if args.attention_only:
        attention_kernels(args.batch_size)
        return 0
    if args.eval_only:
        eval_batches()
        return 0
    setting = f"CIFAR-10 {args.per_class}/class, batch {args.batch_size}, {args.epochs} epochs"
    print(f"ViT-T depth 12, 32 px / patch 4, {setting}\n")
    with tempfile.TemporaryDirectory() as tmp:
        ours = structinit_run(args.per_class, args.epochs, args.batch_size, args.seed, Path(tmp) / "run")
    plain = plain_loop(args.per_class, args.epochs, args.batch_size, args.seed)
    print("| trainer | train img/s | test top-1 (%) |")
    print("|---|---|---|")
    print(f"| plain eager fp32 loop (ImageFolder + DataLoader) | {plain[0]:.1f} | {plain[1]:.2f} |")
    print(f"| structinit train | {ours[0]:.1f} | {ours[1]:.2f} |")
    print(f"\nspeed-up: {ours[0] / plain[0]:.2f}x\n")
    attention_kernels(args.batch_size)
    print()
    eval_batches()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
