"""Augmentation of whole uint8 image batches on the training device (the in-memory path).

RandAugment (timm's, every image its own draw: randaugment.py), random crop with zero padding and
horizontal flip draw their randomness from an explicit CPU generator, so a run is reproducible on any
device, a resumed run draws what the uninterrupted one drew, and every DDP process draws the same.
Mixup/CutMix is timm's `Mixup`, applied to the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .randaugment import RandAugmentSpec, rand_augment
from .transfer import to_device


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

    def __init__(self, mean, std, padding=0, flip=False, mixup=None, randaugment: str | None = None):
        fill = [min(255, round(255 * m)) for m in mean]  # timm's fill for geometric ops: the mean colour
        self.values = torch.tensor([mean, std, fill], dtype=torch.float32)  # (3, C)
        self.on: dict[torch.device, torch.Tensor] = {}  # the values on each device, copied once
        self.padding, self.flip, self.mixup = padding, flip, mixup
        self.randaugment = RandAugmentSpec.parse(randaugment) if randaugment else None

    def constants(self, device: torch.device) -> torch.Tensor:
        """Mean, std and fill on `device` (one copy a device, not one a step: each would wait for the GPU)."""
        if device not in self.on:
            self.on[device] = self.values.to(device)
        return self.on[device]

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        mean, std, _ = self.constants(images.device)[:, None, :, None, None]
        return (images.float() / 255.0 - mean) / std

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator):
        if self.randaugment is not None:
            images = rand_augment(images, self.randaugment, self.constants(images.device)[2], generator)
        images = random_crop(images, self.padding, generator)
        if self.flip:
            images = random_flip(images, generator)
        images = self.normalise(images)
        if self.mixup is not None:
            images, labels = self.mixup(images, labels)
        return images, labels
