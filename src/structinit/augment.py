"""Augmentation of whole uint8 image batches on the training device (the in-memory path).

Random crop with zero padding and horizontal flip draw their parameters from an explicit CPU
generator, so a run is reproducible on any device and a resumed run draws what the uninterrupted
one drew. Mixup/CutMix is timm's `Mixup`, applied to the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator) -> torch.Tensor:
    """Per-image random crop of the original size from the zero-padded batch (B, C, H, W)."""
    if padding <= 0:
        return images
    batch, _, height, width = images.shape
    padded = F.pad(images, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (batch,), generator=generator).to(images.device)
    dx = torch.randint(0, 2 * padding + 1, (batch,), generator=generator).to(images.device)
    rows = (dy[:, None] + torch.arange(height, device=images.device))[:, :, None]  # (B, H, 1)
    cols = (dx[:, None] + torch.arange(width, device=images.device))[:, None, :]  # (B, 1, W)
    index = torch.arange(batch, device=images.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[index, rows, cols].permute(0, 3, 1, 2)


def random_flip(images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Flip each image left-right with probability 1/2."""
    flip = (torch.rand(images.shape[0], generator=generator) < 0.5).to(images.device)
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


class BatchAugment:
    """uint8 batch -> augmented, normalised float batch (and soft targets when mixing)."""

    def __init__(self, mean, std, padding: int = 0, flip: bool = False, mixup=None) -> None:
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.padding, self.flip, self.mixup = padding, flip, mixup

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        return (images.float() / 255.0 - mean) / std

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator):
        images = random_crop(images, self.padding, generator)
        if self.flip:
            images = random_flip(images, generator)
        images = self.normalise(images)
        if self.mixup is not None:
            images, labels = self.mixup(images, labels)
        return images, labels
