"""Pillow's image ops as timm's RandAugment calls them, on a whole uint8 batch (B, C, H, W), each image with
its own argument: ImageOps' table ops (autocontrast, equalize, invert, posterize, solarize; timm's
solarize_add), ImageEnhance's blends (color, contrast, brightness, sharpness) and the bilinear affine
transform (rotate, shear, translate), each computed in Pillow's arithmetic (its integer steps, float32 blends,
double coordinates) so that the images are Pillow's to the last bit (tests/test_randaugment.py)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def wide_float(device: torch.device) -> torch.dtype:
    """The float Pillow computes in (double) where the device has it."""
    return torch.float32 if device.type == "mps" else torch.float64


def histograms(images: torch.Tensor) -> torch.Tensor:
    """(B, C, 256) pixel counts of each image's channels."""
    flat = images.flatten(2).long()
    counts = torch.zeros(*flat.shape[:2], 256, dtype=torch.long, device=images.device)
    return counts.scatter_add_(2, flat, torch.ones_like(flat))


def look_up(images: torch.Tensor, member: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
    """The table ops (autocontrast, equalize, invert, posterize, solarize, solarize_add: `member`, each
    image's, in that order, randaugment.TABLE_OPS'): each image's table for its op, one gather for the batch."""
    levels = torch.arange(256, device=images.device)
    counts = histograms(images)
    value = args.round().long()[:, None, None]
    bits = (8 - value).clamp(0, 8)
    tables = (  # in randaugment.TABLE_OPS' order
        autocontrast_tables(counts, levels),
        equalize_tables(counts, levels),
        (255 - levels).expand(*counts.shape),
        (levels & (-(1 << bits) & 255)).expand(*counts.shape),
        torch.where(levels < value, levels, 255 - levels).expand(*counts.shape),
        torch.where(levels < 128, (levels + value).clamp(max=255), levels).expand(*counts.shape),
    )
    table = torch.stack(tables)[member, torch.arange(len(member), device=member.device)]
    return table.gather(2, images.flatten(2).long()).to(torch.uint8).view_as(images)


def autocontrast_tables(counts: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """ImageOps.autocontrast's table: the darkest level to 0, the brightest to 255, truncated."""
    present = counts > 0
    low = present.int().argmax(2, keepdim=True)
    high = 255 - present.flip(2).int().argmax(2, keepdim=True)
    scale = 255.0 / (high - low).clamp(min=1).to(wide_float(counts.device))
    table = (levels * scale + -low * scale).trunc().clamp(0, 255).long()
    return torch.where(high <= low, levels, table)


def equalize_tables(counts: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """ImageOps.equalize's table, in its integer steps."""
    present = counts > 0
    last = counts.gather(2, 255 - present.flip(2).int().argmax(2, keepdim=True))
    step = (counts.sum(2, keepdim=True) - last) // 255
    below = counts.cumsum(2) - counts
    table = (step // 2 + below) // step.clamp(min=1)
    flat = (present.sum(2, keepdim=True) <= 1) | (step == 0)
    return torch.where(flat, levels, table.clamp(max=255))


def luma(images: torch.Tensor) -> torch.Tensor:
    """Pillow's RGB -> L conversion (ITU-R 601-2, fixed point), (B, 1, H, W); a one-channel image itself."""
    if images.shape[1] != 3:
        return images[:, :1].long()
    r, g, b = images.long().unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16)[:, None]


def smoothed(images: torch.Tensor) -> torch.Tensor:
    """ImageFilter.SMOOTH as Pillow computes it (float32 in its order, truncated; the border kept)."""
    x = images.float()
    side, centre = torch.tensor(1.0) / 13.0, torch.tensor(5.0) / 13.0
    pad = F.pad(x, (1, 1, 1, 1))

    def row(dy: int, middle: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        rows = pad[..., 1 + dy : 1 + dy + h, :]
        return rows[..., 0:w] * side + rows[..., 1 : w + 1] * middle + rows[..., 2 : w + 2] * side

    total = row(1, side) + row(0, centre) + row(-1, side)
    out = (total + 0.5).clamp(0, 255).trunc()
    inner = torch.zeros_like(x, dtype=torch.bool)
    inner[..., 1:-1, 1:-1] = True
    return torch.where(inner, out, x)


def blend(images: torch.Tensor, member: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
    """The enhancements (color, contrast, brightness, sharpness: `member`, each image's, in that order,
    randaugment.BLEND_OPS'): Image.blend of each image with its op's degenerate image by its factor, in
    float32 and truncated, as Pillow blends."""
    x = images.float()
    gray = luma(images)
    mean = (gray.flatten(1).sum(1).to(wide_float(images.device)) / gray[0].numel() + 0.5).floor().float()
    degenerate = (  # in randaugment.BLEND_OPS' order: Color, Contrast, Brightness, Sharpness
        gray.float().expand_as(x),
        mean[:, None, None, None].expand_as(x),
        torch.zeros_like(x),
        smoothed(images),
    )
    base = torch.stack(degenerate)[member, torch.arange(len(member), device=member.device)]
    factor = args.float()[:, None, None, None]
    return (base + factor * (x - base)).clamp(0, 255).trunc().to(torch.uint8)


def resample(images: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Pillow's bilinear affine transform: each output pixel centre mapped by the image's coefficients; a
    point outside the image takes `fill`, one inside the bilinear mix of its four neighbours (edge-clamped)."""
    batch, channels, height, width = images.shape
    wide = wide_float(images.device)
    m = matrices[:, :, None, None]
    ys, xs = torch.meshgrid(
        torch.arange(height, device=images.device, dtype=wide) + 0.5,
        torch.arange(width, device=images.device, dtype=wide) + 0.5,
        indexing="ij",
    )
    x_in = m[:, 0:1] * xs + m[:, 1:2] * ys + m[:, 2:3]  # (B, 1, H, W), in the input's pixel-edge coordinates
    y_in = m[:, 3:4] * xs + m[:, 4:5] * ys + m[:, 5:6]
    inside = (x_in >= 0) & (x_in < width) & (y_in >= 0) & (y_in < height)
    x_in, y_in = x_in - 0.5, y_in - 0.5
    x0, y0 = x_in.floor(), y_in.floor()
    dx, dy = x_in - x0, y_in - y0
    flat = images.flatten(2).to(wide)

    def pixel(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        index = (y.long().clamp(0, height - 1) * width + x.long().clamp(0, width - 1)).flatten(1)
        return flat.gather(2, index[:, None, :].expand(batch, channels, -1)).view(batch, channels, height, width)

    top = pixel(y0, x0) + (pixel(y0, x0 + 1) - pixel(y0, x0)) * dx
    bottom = pixel(y0 + 1, x0) + (pixel(y0 + 1, x0 + 1) - pixel(y0 + 1, x0)) * dx
    value = (top + (bottom - top) * dy).clamp(0, 255).trunc()
    return torch.where(inside, value, fill.to(value)[None, :, None, None]).to(torch.uint8)
