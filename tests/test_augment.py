import pytest
import torch

from structinit.data.augment import BatchAugment, parse_randaugment, random_crop, random_flip


def test_random_crop_shifts_each_image_inside_zero_padding():
    images = torch.arange(2 * 4 * 4, dtype=torch.uint8).view(2, 1, 4, 4) + 1
    out = random_crop(images, 1, torch.Generator().manual_seed(0))
    assert out.shape == images.shape and out.dtype == torch.uint8
    for original, cropped in zip(images, out):
        padded = torch.nn.functional.pad(original, (1, 1, 1, 1))
        windows = [padded[:, y : y + 4, x : x + 4] for y in range(3) for x in range(3)]
        assert any(torch.equal(cropped, w) for w in windows)


def test_random_flip_flips_about_half():
    images = torch.arange(1000 * 2, dtype=torch.float32).view(1000, 1, 1, 2)
    out = random_flip(images, torch.Generator().manual_seed(0))
    flipped = (out[:, 0, 0, 0] > out[:, 0, 0, 1]).float().mean().item()
    assert 0.45 < flipped < 0.55


def test_randaugment_is_deterministic_per_generator_and_changes_images():
    augment = BatchAugment((0.5,) * 3, (0.5,) * 3, randaugment="rand-m9-mstd0.5-inc1")
    images = torch.randint(0, 256, (16, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    labels = torch.zeros(16, dtype=torch.long)
    a, _ = augment(images, labels, torch.Generator().manual_seed(0))
    torch.manual_seed(123)  # the global RNG plays no part
    b, _ = augment(images, labels, torch.Generator().manual_seed(0))
    assert torch.equal(a, b) and a.shape == (16, 3, 32, 32)
    assert not torch.equal(a, augment.normalise(images))


def test_randaugment_strings():
    op = parse_randaugment("rand-m7-n3-mstd0.5")
    assert (op.num_ops, op.magnitude) == (3, 7)
    with pytest.raises(ValueError, match=r"--randaugment takes timm's 'rand-m9-n2\.\.\.' form"):
        parse_randaugment("augmix-m5")
