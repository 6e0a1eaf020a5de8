"""timm's RandAugment on a whole uint8 batch at once.

Every image gets its own draw, as timm's per-image `RandAugment` draws: `n` ops with replacement from timm's
15 (or their "increasing" forms), each applied with probability `p`, at magnitude `m` (noised by `mstd`, clipped
to `mmax`), with a random sign where timm negates. The draws come from an explicit CPU generator; each layer then
runs as a fixed set of whole-batch kernels (one table look-up for the six table ops, one blend for the four
enhancements, one bilinear resampling for the five geometric ops), and every image takes the result of its own op.
Each op computes what Pillow computes for timm (tests/test_randaugment.py checks them image by image);
geometric ops resample bilinearly (timm draws bilinear or bicubic unless told)."""

from __future__ import annotations

import dataclasses
import math
import re

import torch
import torch.nn.functional as F

OPS = (
    "AutoContrast",
    "Equalize",
    "Invert",
    "Rotate",
    "Posterize",
    "Solarize",
    "SolarizeAdd",
    "Color",
    "Contrast",
    "Brightness",
    "Sharpness",
    "ShearX",
    "ShearY",
    "TranslateXRel",
    "TranslateYRel",
)
CODE = {name: code for code, name in enumerate(OPS)}
TABLE_OPS = tuple(CODE[n] for n in ("AutoContrast", "Equalize", "Invert", "Posterize", "Solarize", "SolarizeAdd"))
BLEND_OPS = tuple(CODE[n] for n in ("Color", "Contrast", "Brightness", "Sharpness"))
GEOMETRIC_OPS = tuple(CODE[n] for n in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"))
SIGNED_OPS = GEOMETRIC_OPS  # timm negates these at random (and the enhancements in the increasing set)
PARTS = {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int}  # timm's parts and its types
LEVEL_DENOM = 10.0  # timm's magnitude scale: m10 is an op's full strength


@dataclasses.dataclass(frozen=True)
class RandAugmentSpec:
    """timm's RandAugment string, parsed: magnitude, ops an image (layers), each op's probability, the
    magnitude's noise (inf: uniform in [0, m]), its upper bound, the increasing op set."""

    magnitude: float = LEVEL_DENOM
    layers: int = 2
    prob: float = 0.5
    magnitude_std: float = 0.0
    magnitude_max: float | None = None
    increasing: bool = False

    @classmethod
    def parse(cls, spec: str) -> RandAugmentSpec:
        """'rand-m9-n2-mstd0.5-inc1' as timm's rand_augment_transform reads it (a ValueError in flag terms)."""
        parts = spec.split("-")
        if parts[0] != "rand":
            raise ValueError(f"--randaugment takes timm's 'rand-m9-n2...' form, got {spec!r}")
        values: dict[str, float] = {}
        for part in parts[1:]:
            match = re.fullmatch(r"([a-z]+)([0-9]+(?:\.[0-9]*)?)", part)
            if not match or match.group(1) not in PARTS:
                raise ValueError(
                    f"--randaugment {spec}: {part!r} is none of timm's parts ({', '.join(PARTS)} with a number, "
                    "e.g. rand-m9-n2-mstd0.5)"
                )
            key, text = match.groups()
            if PARTS[key] is int and not text.isdigit():
                raise ValueError(f"--randaugment {spec}: {key} takes an integer (timm reads it so), got {text}")
            values[key] = PARTS[key](text)
        std = values.get("mstd", 0.0)
        if values.get("p", 0.5) > 1:
            raise ValueError(f"--randaugment {spec}: p is a probability, in [0, 1]")
        return cls(
            magnitude=values.get("m", LEVEL_DENOM),
            layers=int(values.get("n", 2)),
            prob=values.get("p", 0.5),
            magnitude_std=math.inf if std > 100 else std,  # timm: above 100 means uniform
            magnitude_max=values.get("mmax") or None,
            increasing=bool(values.get("inc", 0)),
        )


@dataclasses.dataclass
class Draws:
    """One batch's draws, (layers, batch) each: the op (-1: not applied), its magnitude and sign, and its
    argument as timm's level functions give it (degrees, a shear, a fraction of the side, bits, a threshold,
    an addend, a blend factor)."""

    ops: torch.Tensor
    magnitude: torch.Tensor
    negate: torch.Tensor
    args: torch.Tensor

    def layer(self, index: int, height: int, width: int, device: torch.device) -> Layer:
        """Layer `index` on `device`, its images ordered by op family, in one copy the host does not wait for."""
        ops, args = self.ops[index], self.args[index]
        family = torch.zeros_like(ops)
        for code, members in enumerate((TABLE_OPS, BLEND_OPS, GEOMETRIC_OPS), 1):
            family = torch.where(torch.isin(ops, torch.tensor(members)), code, family)
        order = torch.argsort(family, stable=True)
        counts = torch.bincount(family, minlength=4).tolist()
        matrices = affine_matrices(ops, args, height, width)
        packed = torch.cat([torch.stack([order, ops[order], args[order]], 1), matrices[order]], 1)
        if device.type == "cuda":
            packed = packed.pin_memory().to(device, non_blocking=True)
        packed = packed.to(device, _wide(device))
        return Layer(packed[:, 0].long(), counts, packed[:, 1].long(), packed[:, 2], packed[:, 3:])


@dataclasses.dataclass
class Layer:
    """One layer's draws on the device, its images ordered by op family (none, table, blend, geometric):
    that order, the count of each family, and in that order each image's op, argument and affine
    coefficients (Pillow's six)."""

    order: torch.Tensor
    counts: list[int]
    ops: torch.Tensor
    args: torch.Tensor
    matrices: torch.Tensor


def draw(spec: RandAugmentSpec, batch: int, generator: torch.Generator) -> Draws:
    """Every image's ops, applications, magnitudes and signs (the same count of numbers whatever they are)."""
    shape = (spec.layers, batch)
    ops = torch.randint(len(OPS), shape, generator=generator)
    applied = torch.rand(shape, generator=generator, dtype=torch.float64) <= spec.prob  # timm: skip if > p
    magnitude = torch.full(shape, float(spec.magnitude), dtype=torch.float64)
    noise = torch.randn(shape, generator=generator, dtype=torch.float64)
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64)
    if math.isinf(spec.magnitude_std):
        magnitude = uniform * spec.magnitude
    elif spec.magnitude_std > 0:
        magnitude = magnitude + noise * spec.magnitude_std
    magnitude = magnitude.clamp(0.0, spec.magnitude_max or LEVEL_DENOM)
    negate = torch.rand(shape, generator=generator, dtype=torch.float64) > 0.5
    args = level_args(ops, magnitude, negate, spec.increasing)
    return Draws(torch.where(applied, ops, -1), magnitude, negate, args)


def level_args(ops: torch.Tensor, magnitude: torch.Tensor, negate: torch.Tensor, increasing: bool) -> torch.Tensor:
    """Each op's argument at its magnitude, by timm's level functions (float64, as Python computes them)."""
    level = magnitude / LEVEL_DENOM
    sign = torch.where(negate, -1.0, 1.0).to(torch.float64)
    posterize, solarize = (level * 4).floor(), (level * 256).floor().clamp(max=256)
    enhance = (level * 0.9 * sign + 1.0).clamp(min=0.1) if increasing else level * 1.8 + 0.1
    by_op = {
        "Rotate": level * 30.0 * sign,
        "Posterize": 4 - posterize if increasing else posterize,
        "Solarize": 256 - solarize if increasing else solarize,
        "SolarizeAdd": (level * 110).floor().clamp(max=128),
        "Color": enhance,
        "Contrast": enhance,
        "Brightness": enhance,
        "Sharpness": enhance,
        "ShearX": level * 0.3 * sign,
        "ShearY": level * 0.3 * sign,
        "TranslateXRel": level * 0.45 * sign,
        "TranslateYRel": level * 0.45 * sign,
    }
    args = torch.zeros_like(magnitude)
    for name, values in by_op.items():
        args = torch.where(ops == CODE[name], values, args)
    return args


def affine_matrices(ops: torch.Tensor, args: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """(batch, 6) float64: for each image, Pillow's affine coefficients (output pixel centre -> input point)
    of its geometric op, the identity for the rest. Rotation as Pillow's Image.rotate builds it."""
    matrices = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64).repeat(len(ops), 1)
    for i in torch.nonzero(torch.isin(ops, torch.tensor(GEOMETRIC_OPS))).flatten().tolist():
        op, value = OPS[int(ops[i])], float(args[i])
        if op == "Rotate":
            matrices[i] = torch.tensor(rotation(value, width, height), dtype=torch.float64)
        elif op in ("ShearX", "TranslateXRel"):
            matrices[i, 1 if op == "ShearX" else 2] = value if op == "ShearX" else value * width
        else:
            matrices[i, 3 if op == "ShearY" else 5] = value if op == "ShearY" else value * height
    return matrices


def rotation(degrees: float, width: int, height: int) -> list[float]:
    """Pillow's coefficients for rotating by `degrees` (counter-clockwise) about the image's centre."""
    angle = -math.radians(degrees % 360.0)
    a, b = round(math.cos(angle), 15), round(math.sin(angle), 15)
    d, e = round(-math.sin(angle), 15), round(math.cos(angle), 15)
    cx, cy = width / 2.0, height / 2.0
    return [a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy]


def apply_layer(images: torch.Tensor, layer: Layer, fill: torch.Tensor) -> torch.Tensor:
    """One layer on a uint8 batch (B, C, H, W): each image its op with its argument, each op family on its
    images at once (fill: the geometric ops' colour outside the image, (C,))."""
    ordered, pieces, start = images[layer.order], [], 0
    for family, count in enumerate(layer.counts):
        part, start = slice(start, start + count), start + count
        x, ops, args = ordered[part], layer.ops[part], layer.args[part]
        if count == 0 or family == 0:
            pieces.append(x)
        elif family == 1:
            pieces.append(look_up(x, ops, args))
        elif family == 2:
            pieces.append(blend(x, ops, args))
        else:
            pieces.append(resample(x, layer.matrices[part], fill))
    out = torch.empty_like(images)
    out[layer.order] = torch.cat(pieces)
    return out


def rand_augment(images: torch.Tensor, spec: RandAugmentSpec, fill: torch.Tensor, generator: torch.Generator):
    """RandAugment of a uint8 batch, every image its own draw from `generator`."""
    draws = draw(spec, len(images), generator)
    height, width = images.shape[-2:]
    for index in range(spec.layers):
        images = apply_layer(images, draws.layer(index, height, width, images.device), fill)
    return images


def _wide(device: torch.device) -> torch.dtype:
    """The float Pillow computes in (double) where the device has it."""
    return torch.float32 if device.type == "mps" else torch.float64


def histograms(images: torch.Tensor) -> torch.Tensor:
    """(B, C, 256) pixel counts of each image's channels."""
    flat = images.flatten(2).long()
    counts = torch.zeros(*flat.shape[:2], 256, dtype=torch.long, device=images.device)
    return counts.scatter_add_(2, flat, torch.ones_like(flat))


def look_up(images: torch.Tensor, ops: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
    """The table ops (ImageOps' autocontrast, equalize, invert, posterize, solarize; timm's solarize_add):
    each image's table for its op, one gather for the batch."""
    levels = torch.arange(256, device=images.device)
    counts = histograms(images)
    value = args.round().long()[:, None, None]
    bits = (8 - value).clamp(0, 8)
    tables = {
        "AutoContrast": autocontrast_tables(counts, levels),
        "Equalize": equalize_tables(counts, levels),
        "Invert": 255 - levels,
        "Posterize": levels & (-(1 << bits) & 255),
        "Solarize": torch.where(levels < value, levels, 255 - levels),
        "SolarizeAdd": torch.where(levels < 128, (levels + value).clamp(max=255), levels),
    }
    table = levels.expand(*counts.shape)
    for name, candidate in tables.items():
        table = torch.where((ops == CODE[name])[:, None, None], candidate, table)
    return table.gather(2, images.flatten(2).long()).to(torch.uint8).view_as(images)


def autocontrast_tables(counts: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """ImageOps.autocontrast's table: the darkest level to 0, the brightest to 255, truncated."""
    present = counts > 0
    low = present.int().argmax(2, keepdim=True)
    high = 255 - present.flip(2).int().argmax(2, keepdim=True)
    scale = 255.0 / (high - low).clamp(min=1).to(_wide(counts.device))
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


def blend(images: torch.Tensor, ops: torch.Tensor, args: torch.Tensor) -> torch.Tensor:
    """The enhancements (ImageEnhance's Color, Contrast, Brightness, Sharpness): Image.blend of each image
    with its op's degenerate image by its factor, in float32 and truncated, as Pillow blends."""
    x = images.float()
    gray = luma(images)
    mean = (gray.flatten(1).sum(1).to(_wide(images.device)) / gray[0].numel() + 0.5).floor().float()
    degenerate = {
        "Color": gray.float().expand_as(x),
        "Contrast": mean[:, None, None, None].expand_as(x),
        "Brightness": torch.zeros_like(x),
        "Sharpness": smoothed(images),
    }
    base = x
    for name, candidate in degenerate.items():
        base = torch.where((ops == CODE[name])[:, None, None, None], candidate, base)
    factor = args.float()[:, None, None, None]
    return (base + factor * (x - base)).clamp(0, 255).trunc().to(torch.uint8)


def resample(images: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Pillow's bilinear affine transform: each output pixel centre mapped by the image's coefficients; a
    point outside the image takes `fill`, one inside the bilinear mix of its four neighbours (edge-clamped)."""
    batch, channels, height, width = images.shape
    wide = _wide(images.device)
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


def keep_zero_bits(transform):
    """timm's RandAugment (alone or in a Compose) with a posterize that takes 0 bits (every bit cleared, as
    Pillow did before it refused them: Pillow 13 raises, and timm asks for 0 bits at magnitude 10 of the
    increasing set, 4 in 3,000 images of DeiT's rand-m9-mstd0.5-inc1)."""
    from timm.data.auto_augment import RandAugment, posterize

    for part in [transform, *getattr(transform, "transforms", [])]:
        for op in part.ops if isinstance(part, RandAugment) else []:
            if op.aug_fn is posterize:
                op.aug_fn = _posterize
    return transform


def _posterize(image, bits: int, **_):
    from timm.data.auto_augment import posterize

    return image.point(lambda _: 0) if bits <= 0 else posterize(image, bits)
