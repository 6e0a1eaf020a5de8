"""Augmentation of whole uint8 image batches on the training device (the in-memory path).

RandAugment (torchvision's, on groups of images), random crop with zero padding and horizontal flip
draw their randomness from an explicit CPU generator, so a run is reproducible on any device, a
resumed run draws what the uninterrupted one drew, and every DDP process draws the same.
Mixup/CutMix is timm's `Mixup`, applied to the batch.
"""

from __future__ import annotations

import re

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

TIMM_PARTS = ("m", "n", "mstd", "mmax", "inc", "w", "p")  # timm's rand_augment_transform reads these


def parse_randaugment(spec: str) -> v2.RandAugment:
    """timm's RandAugment string ('rand-m9-n2-mstd0.5-inc1') as torchvision's RandAugment with the
    same number of ops and magnitude on timm's 0-10 scale (mstd and inc are not modelled)."""
    parts = spec.split("-")
    if parts[0] != "rand":
        raise ValueError(f"--randaugment takes timm's 'rand-m9-n2...' form, got {spec!r}")
    options = {"m": 9.0, "n": 2.0}
    for part in parts[1:]:
        match = re.fullmatch(r"([a-z]+)([0-9]+(?:\.[0-9]*)?)", part)
        if not match or match.group(1) not in TIMM_PARTS:
            raise ValueError(
                f"--randaugment {spec}: {part!r} is none of timm's parts ({', '.join(TIMM_PARTS)} with a number, "
                "e.g. rand-m9-n2-mstd0.5)"
            )
        if match.group(1) in options:
            options[match.group(1)] = float(match.group(2))
    return v2.RandAugment(num_ops=int(options["n"]), magnitude=int(options["m"]), num_magnitude_bins=11)


def rand_augment(images: torch.Tensor, op: v2.RandAugment, generator: torch.Generator, group: int = 8) -> torch.Tensor:
    """Apply RandAugment to each group of `group` images (one draw of ops per group)."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[images.device] if images.device.type == "cuda" else []):
        torch.manual_seed(seed)
        return torch.cat([op(chunk) for chunk in images.split(group)])


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-drawn values on the device without the host waiting for the copy (pinned, asynchronous on CUDA)."""
    if device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Per-image random crop of the original size from the zero-padded batch (B, C, H, W)."""
    if padding <= 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    dy = to_device(torch.randint(0, 2 * padding + 1, (batch,), generator=generator), images.device)
    dx = to_device(torch.randint(0, 2 * padding + 1, (batch,), generator=generator), images.device)
    rows = (dy[:, None] + torch.arange(height, device=images.device))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + torch.arange(width, device=images.device))[:, None, :]  # (B, 1, W)
    index = torch.arange(batch, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[index, rows, cols].permute(0, 3, 1, 2)


def random_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Flip each image left-right with probability 1/2."""
    flip = to_device(torch.rand(images.shape[0], generator=generator) < 0.5, images.device)
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


class BatchAugment:
    """uint8 batch -> augmented, normalised float batch (and soft targets when mixing)."""

    def __init__(self, mean, std, padding=0, flip=False, mixup=None, randaugment: str | None = None, group=8):
        self.group = group  # images that share one RandAugment draw
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.padding, self.flip, self.mixup = padding, flip, mixup
        self.randaugment = parse_randaugment(randaugment) if randaugment else None

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        return (images.float() / 255.0 - mean) / std

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator):
        if self.randaugment is not None:
            images = rand_augment(images, self.randaugment, generator, self.group)
        images = random_crop(images, self.padding, generator)
        if self.flip:
            images = random_flip(images, generator)
        images = self.normalise(images)
        if self.mixup is not None:
            images, labels = self.mixup(images, labels)
        return images, labels
