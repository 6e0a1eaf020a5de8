"""Augmentation of whole uint8 image batches on the training device (the in-memory path).

RandAugment (timm's, every image its own draw: randaugment.py), timm's colour jitter, random crop with zero
padding and horizontal flip draw their randomness from an explicit CPU generator, so a run is reproducible on any
device, a resumed run draws what the uninterrupted one drew, and every DDP process draws the same.
Mixup/CutMix is timm's `Mixup`, applied to the batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .pillow_ops import blend
from .randaugment import CODE, MEMBER, RandAugmentSpec, rand_augment
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


def random_flip(images: torch.Tensor, generator: torch.Generator, probability: float = 0.5) -> torch.Tensor:
    """Flip each image left-right with `probability`."""
    flip = to_device(torch.rand(images.shape[0], generator=generator) < probability, images.device)
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


# torchvision's ColorJitter on a PIL image: ImageEnhance's Brightness, Contrast and Color (saturation), as blend's ops
JITTER_MEMBERS = torch.tensor([int(MEMBER[CODE[name] + 1]) for name in ("Brightness", "Contrast", "Color")])


def colour_jitter(images: torch.Tensor, strength: float, generator: torch.Generator) -> torch.Tensor:
    """timm's ColorJitter(strength, strength, strength) (torchvision's, on the PIL images timm jitters): each image's
    brightness, contrast and saturation by factors drawn from [max(0, 1 - strength), 1 + strength], in an order
    drawn for each image, in Pillow's arithmetic."""
    batch, low = images.shape[0], max(0.0, 1.0 - strength)
    order = torch.rand(batch, 3, generator=generator).argsort(1)
    factors = low + torch.rand(batch, 3, generator=generator, dtype=torch.float64) * (1.0 + strength - low)
    order, factors = to_device(order, images.device), to_device(factors, images.device)
    members = JITTER_MEMBERS.to(images.device)
    for step in range(3):
        op = order[:, step]
        images = blend(images, members[op], factors.gather(1, op[:, None])[:, 0])
    return images


def centre_crop(images: torch.Tensor, crop_pct: float, interpolation: str = "bicubic") -> torch.Tensor:
    """timm's evaluation crop of a uint8 batch: resized to floor(side / crop_pct) (torch's `interpolation`,
    antialiased), then the centre crop of the original size (torchvision's CenterCrop's rounding)."""
    height, width = images.shape[-2:]
    size = (math.floor(height / crop_pct), math.floor(width / crop_pct))
    if size == (height, width):
        return images
    smooth = {"antialias": True} if interpolation != "nearest" else {}
    scaled = F.interpolate(images.float(), size, mode=interpolation, **smooth).round().clamp(0, 255).to(torch.uint8)
    top, left = round((size[0] - height) / 2.0), round((size[1] - width) / 2.0)
    return scaled[..., top : top + height, left : left + width]


class BatchAugment:
    """uint8 batch -> augmented, normalised float batch (and soft targets when mixing)."""

    def __init__(self, mean, std, padding=0, flip=False, mixup=None, randaugment: str | None = None, jitter=0.0):
        """`flip`: True (timm's 1/2) or the flip's probability; `jitter`: colour jitter's strength (0: none)."""
        fill = [min(255, round(255 * m)) for m in mean]  # timm's fill for geometric ops: the mean colour
        self.values = torch.tensor([mean, std, fill], dtype=torch.float32)  # (3, C)
        self.on: dict[torch.device, torch.Tensor] = {}  # the values on each device, copied once
        self.padding, self.mixup, self.jitter = padding, mixup, jitter
        self.flip = 0.5 if flip is True else float(flip)
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
        if self.jitter:
            images = colour_jitter(images, self.jitter, generator)
        images = random_crop(images, self.padding, generator)
        if self.flip:
            images = random_flip(images, generator, self.flip)
        images = self.normalise(images)
        if self.mixup is not None:
            images, labels = self.mixup(images, labels)
        return images, labels
