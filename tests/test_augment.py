import torch

from structinit.data.augment import random_crop, random_flip


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
