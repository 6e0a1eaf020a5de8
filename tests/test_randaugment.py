"""The batched RandAugment (structinit.data.randaugment) against timm's per-image RandAugment on Pillow
images: each op image by image, each op's argument at every magnitude, and whole draws fed to timm's own
RandAugment object; images equal to the last bit."""

import random

import numpy as np
import pytest
import torch
from PIL import Image
from timm.data import auto_augment as timm_aa
from timm.data import create_transform

from structinit.data import randaugment as ra
from structinit.data.augment import BatchAugment

CPU = torch.device("cpu")


def images(count: int, channels: int = 3, height: int = 24, width: int = 40, seed: int = 0) -> torch.Tensor:
    """Random images, some with a narrow range of levels and one flat (autocontrast's and equalize's edges)."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (count, channels, height, width), dtype=torch.uint8, generator=generator)
    x[1] = x[1] // 4 + 60
    x[2] = 77
    x[3, :, : height // 2] = 0  # two levels only
    return x


def to_pil(image: torch.Tensor) -> Image.Image:
    array = image.permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else array)


def from_pil(image: Image.Image, channels: int) -> torch.Tensor:
    array = torch.from_numpy(np.array(image))
    return array[None] if channels == 1 else array.permute(2, 0, 1)


def one_layer(x: torch.Tensor, name: str, arg: float) -> torch.Tensor:
    """Every image of `x` through op `name` with argument `arg`, batched."""
    ops = torch.full((len(x),), ra.CODE[name])
    args = torch.full((len(x),), float(arg), dtype=torch.float64)
    layer = ra.Draws(ops[None], args[None], args[None], args[None]).layer(0, *x.shape[-2:], CPU)
    return ra.apply_layer(x, layer, torch.tensor([128] * x.shape[1]))


# each op's arguments: timm's at m0, m5, m9 and m10 where it takes one, with both signs where it negates
ARGUMENTS = {
    "AutoContrast": [0],
    "Equalize": [0],
    "Invert": [0],
    "Rotate": [0.0, 15.0, -27.0, 30.0],
    "Posterize": [1, 2, 3, 4, 8],  # Pillow 13 refuses 0 bits (keep_zero_bits)
    "Solarize": [0, 128, 230, 256],
    "SolarizeAdd": [0, 55, 99, 110],
    "Color": [0.1, 1.0, 1.72, 1.9],
    "Contrast": [0.1, 0.46, 1.72, 1.9],
    "Brightness": [0.1, 1.0, 1.72, 1.9],
    "Sharpness": [0.1, 0.46, 1.72, 1.9],
    "ShearX": [0.27, -0.15, 0.3],
    "ShearY": [-0.27, 0.3],
    "TranslateXRel": [0.405, -0.225],
    "TranslateYRel": [-0.405, 0.45],
}


@pytest.mark.parametrize("channels", [3, 1])
@pytest.mark.parametrize("name", ra.OPS)
def test_each_op_gives_pillows_image_to_the_last_bit(name, channels):
    x = images(8, channels)
    fill = (128,) * 3 if channels == 3 else 128
    for arg in ARGUMENTS[name]:
        kwargs = (
            {} if name in ("AutoContrast", "Equalize", "Invert") else {"fillcolor": fill, "resample": Image.BILINEAR}
        )
        args = () if not kwargs else (arg,)
        expected = torch.stack([from_pil(timm_aa.NAME_TO_OP[name](to_pil(i), *args, **kwargs), channels) for i in x])
        assert torch.equal(one_layer(x, name, arg), expected), (name, arg, channels)


def test_posterize_to_zero_bits_clears_every_bit():
    x = images(4)
    assert torch.equal(one_layer(x, "Posterize", 0), torch.zeros_like(x))


@pytest.mark.parametrize("increasing", [False, True])
def test_each_ops_argument_is_timms_at_every_magnitude_and_sign(increasing, monkeypatch):
    names = timm_aa._RAND_INCREASING_TRANSFORMS if increasing else timm_aa._RAND_TRANSFORMS
    assert len(names) == len(ra.OPS)
    magnitudes = torch.arange(0, 10.25, 0.25, dtype=torch.float64)
    for negate in (False, True):
        monkeypatch.setattr(random, "random", lambda answer=float(negate): answer)  # timm negates when > 0.5
        for code, timm_name in enumerate(names):
            ops = torch.full(magnitudes.shape, code)
            ours = ra.level_args(ops, magnitudes, torch.full(magnitudes.shape, negate), increasing)
            level_fn = timm_aa.LEVEL_TO_ARG[timm_name]
            for m, value in zip(magnitudes.tolist(), ours.tolist()):
                expected = level_fn(m, {"translate_pct": 0.45}) if level_fn else (0,)
                assert value == pytest.approx(expected[0], abs=0), (timm_name, m, negate)


@pytest.mark.parametrize("spec", ["rand-m9-n2", "rand-m9-n2-mstd0.5-inc1", "rand-m7-n3-p0.8-mstd200", "rand-n1-p1"])
def test_a_whole_batch_equals_timms_randaugment_fed_the_same_draws(spec, monkeypatch):
    """timm's own RandAugment object, its random calls answered with our draws: the same images."""
    parsed = ra.RandAugmentSpec.parse(spec)
    x = images(24, seed=3)
    generator = torch.Generator().manual_seed(5)
    draws = ra.draw(parsed, len(x), torch.Generator().manual_seed(5))
    ours = ra.rand_augment(x, parsed, torch.tensor([128, 128, 128]), generator)
    names = timm_aa._RAND_INCREASING_TRANSFORMS if parsed.increasing else timm_aa._RAND_TRANSFORMS
    timm_ra = ra.keep_zero_bits(timm_aa.rand_augment_transform(spec, {"img_mean": (128,) * 3, "interpolation": 2}))
    signed = {"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"} | {n for n in names if "Increasing" in n}
    signed -= {"PosterizeIncreasing", "SolarizeIncreasing"}
    for i, image in enumerate(x):
        chosen, answers = [], []
        for layer in range(parsed.layers):
            op = int(draws.ops[layer, i])
            chosen.append(timm_ra.ops[max(op, 0)])
            if parsed.prob < 1:
                answers.append(0.0 if op >= 0 else 1.0)  # timm skips an op when random() > p
            if op >= 0 and names[op] in signed:
                answers.append(1.0 if draws.negate[layer, i] else 0.0)
        magnitudes = iter(draws.magnitude[:, i][draws.ops[:, i] >= 0].tolist())
        queue = iter(answers)
        monkeypatch.setattr(np.random, "choice", lambda *a, chosen=chosen, **k: chosen)
        monkeypatch.setattr(random, "random", lambda queue=queue: next(queue))
        monkeypatch.setattr(random, "gauss", lambda *a, magnitudes=magnitudes: next(magnitudes))
        monkeypatch.setattr(random, "uniform", lambda *a, magnitudes=magnitudes: next(magnitudes))
        expected = from_pil(timm_ra(to_pil(image)), 3)
        assert torch.equal(ours[i], expected), (spec, i, draws.ops[:, i].tolist())


def test_draws_follow_timms_probabilities():
    """Ops uniform with replacement, applied with probability p, magnitudes noised by mstd, signs even."""
    spec = ra.RandAugmentSpec.parse("rand-m6-n2-p0.3-mstd1")
    draws = ra.draw(spec, 30_000, torch.Generator().manual_seed(0))
    applied = draws.ops >= 0
    assert abs(applied.double().mean().item() - 0.3) < 0.01
    counts = torch.bincount(draws.ops[applied], minlength=15).double() / applied.sum()
    assert (counts - 1 / 15).abs().max() < 0.01
    assert abs(draws.magnitude.mean().item() - 6) < 0.02 and abs(draws.magnitude.std().item() - 1) < 0.02
    assert abs(draws.negate.double().mean().item() - 0.5) < 0.01
    both = (draws.ops[0] == draws.ops[1]) & applied.all(0)
    assert both.any()  # with replacement, as timm draws without weights


def test_uniform_magnitudes_and_the_upper_bound():
    uniform = ra.draw(ra.RandAugmentSpec.parse("rand-m8-mstd101"), 20_000, torch.Generator().manual_seed(0))
    assert uniform.magnitude.min() >= 0 and uniform.magnitude.max() <= 8
    assert abs(uniform.magnitude.mean().item() - 4) < 0.05
    bounded = ra.draw(ra.RandAugmentSpec.parse("rand-m9-mstd3-mmax12"), 20_000, torch.Generator().manual_seed(0))
    assert bounded.magnitude.max() == 12 and (bounded.magnitude > 10).any()
    clipped = ra.draw(ra.RandAugmentSpec.parse("rand-m9-mstd3"), 20_000, torch.Generator().manual_seed(0))
    assert clipped.magnitude.max() == 10


def test_the_batch_depends_on_the_generator_alone_and_changes_most_images():
    augment = BatchAugment((0.5,) * 3, (0.5,) * 3, randaugment="rand-m9-mstd0.5-inc1")
    x = images(64)
    labels = torch.zeros(64, dtype=torch.long)
    a, _ = augment(x, labels, torch.Generator().manual_seed(0))
    torch.manual_seed(123)
    random.seed(4)
    b, _ = augment(x, labels, torch.Generator().manual_seed(0))
    c, _ = augment(x, labels, torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and not torch.equal(a, c)
    changed = (a != augment.normalise(x)).flatten(1).any(1).float().mean().item()
    assert 0.6 < changed < 0.9  # 1 - (1 - p)^2 = 0.75 of images meet an applied op (some ops leave an image as is)


def test_the_fill_is_timms_mean_colour():
    augment = BatchAugment((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), randaugment="rand-m9")
    assert augment.constants(CPU)[2].tolist() == [124, 116, 104]  # timm: round(255 * mean)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("rand", ra.RandAugmentSpec(10, 2, 0.5, 0.0, None, False)),
        ("rand-m9-n3-mstd0.5-inc1", ra.RandAugmentSpec(9, 3, 0.5, 0.5, None, True)),
        ("rand-m7-p0.2-mstd101-mmax15", ra.RandAugmentSpec(7, 2, 0.2, float("inf"), 15, False)),
    ],
)
def test_strings_read_as_timm_reads_them(spec, expected):
    assert ra.RandAugmentSpec.parse(spec) == expected


@pytest.mark.parametrize(
    "spec, message",
    [
        ("augmix-m5", r"takes timm's 'rand-m9-n2\.\.\.' form"),
        ("rand-m9-w0", r"'w0' is none of timm's parts \(m, n, p, mstd, mmax, inc"),
        ("rand-tweights", r"'tweights' is none of timm's parts"),
        ("rand-m9.5", r"m takes an integer \(timm reads it so\), got 9\.5"),
        ("rand-p1.5", r"p is a probability"),
    ],
)
def test_strings_timm_would_refuse_or_misread_are_refused_in_one_line(spec, message):
    with pytest.raises(ValueError, match=message):
        ra.RandAugmentSpec.parse(spec)


def test_streamed_images_meet_zero_bits_without_pillow_refusing_them():
    transform = ra.keep_zero_bits(create_transform(32, is_training=True, auto_augment="rand-m10-n3-p1.0-inc1"))
    image = to_pil(images(4)[0, :, :24, :24])
    random.seed(0)
    np.random.seed(0)
    for _ in range(200):  # PosterizeIncreasing at m10 asks for 0 bits: Pillow 13 raises on it
        transform(image)
    assert ra._posterize(image, 0).getextrema() == ((0, 0),) * 3
