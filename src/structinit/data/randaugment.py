"""timm's RandAugment on a whole uint8 batch at once.

Every image gets its own draw, as timm's per-image `RandAugment` draws: `n` ops with replacement from timm's
15 (or their "increasing" forms), each applied with probability `p`, at magnitude `m` (noised by `mstd`, clipped
to `mmax`), with a random sign where timm negates. The draws come from an explicit CPU generator and reach the
device in one asynchronous copy a layer; there the images of each op family go through it at once (one table
look-up for the six table ops, one blend for the four enhancements, one bilinear resampling for the five
geometric ops: pillow_ops.py), each with its own op and argument. Each op computes what Pillow computes for
timm (tests/test_randaugment.py checks them image by image); geometric ops resample bilinearly (timm draws
bilinear or bicubic unless told)."""

from __future__ import annotations

import dataclasses
import math
import re

import torch

from ..memory import check_fits
from .pillow_ops import blend, look_up, resample, wide_float
from .transfer import to_device

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
FAMILIES = (TABLE_OPS, BLEND_OPS, GEOMETRIC_OPS)


def _families() -> tuple[torch.Tensor, torch.Tensor]:
    """By op + 1 (op -1: not applied): its family (0 none, 1 table, 2 blend, 3 geometric), its place there."""
    family, member = torch.zeros(len(OPS) + 1, dtype=torch.long), torch.zeros(len(OPS) + 1, dtype=torch.long)
    for code, members in enumerate(FAMILIES, 1):
        for place, op in enumerate(members):
            family[op + 1], member[op + 1] = code, place
    return family, member


FAMILY, MEMBER = _families()
PARTS = {"m": int, "n": int, "p": float, "mstd": float, "mmax": int, "inc": int}  # timm's parts and its types
DRAW_BYTES = 80  # memory one op of one image takes while a batch's ops are drawn: draw()'s ten float64 arrays
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
            if key in values:
                raise ValueError(
                    f"--randaugment {spec}: {key} is given twice (timm keeps the last m, n, p or inc but the first "
                    "mstd or mmax): give each part once"
                )
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

    def check_draws(self, batch_size: int) -> None:
        """RunError where a batch's draws (n ops an image) need more memory than is left."""
        check_fits(
            self.layers * batch_size * DRAW_BYTES,
            f"--randaugment n{self.layers} ({self.layers:,} ops an image, drawn for batches of {batch_size})",
            "give n of a few ops (timm's default: n2)",
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
        family = FAMILY[ops + 1]
        order = torch.argsort(family, stable=True)
        counts = torch.bincount(family, minlength=4).tolist()
        matrices = affine_matrices(ops, args, height, width)
        packed = torch.cat([torch.stack([order, MEMBER[ops + 1][order], args[order]], 1), matrices[order]], 1)
        packed = to_device(packed.to(wide_float(device)), device)
        return Layer(packed[:, 0].long(), counts, packed[:, 1].long(), packed[:, 2], packed[:, 3:])


@dataclasses.dataclass
class Layer:
    """One layer's draws on the device, its images ordered by op family (none, table, blend, geometric):
    that order, the count of each family, and in that order each image's op (its place in its family),
    argument and affine coefficients (Pillow's six)."""

    order: torch.Tensor
    counts: list[int]
    member: torch.Tensor
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
    for column, name, scale in (
        (1, "ShearX", 1),
        (2, "TranslateXRel", width),
        (3, "ShearY", 1),
        (5, "TranslateYRel", height),
    ):
        matrices[:, column] = torch.where(ops == CODE[name], args * scale, matrices[:, column])
    rotated = torch.nonzero(ops == CODE["Rotate"]).flatten()
    if len(rotated):  # Python's own trigonometry and rounding, as Pillow's
        rows = [rotation(degrees, width, height) for degrees in args[rotated].tolist()]
        matrices[rotated] = torch.tensor(rows, dtype=torch.float64)
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
        x, member, args = ordered[part], layer.member[part], layer.args[part]
        if count == 0 or family == 0:
            pieces.append(x)
        elif family == 1:
            pieces.append(look_up(x, member, args))
        elif family == 2:
            pieces.append(blend(x, member, args))
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
