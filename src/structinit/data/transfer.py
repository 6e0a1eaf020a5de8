"""Values drawn on the host (augmentation draws, an epoch's sample order) sent to the training device."""

from __future__ import annotations

import torch


def to_device(values: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host-drawn values on the device without the host waiting for the copy (pinned, asynchronous on CUDA)."""
    if device.type != "cuda":
        return values.to(device)
    return values.pin_memory().to(device, non_blocking=True)
