"""The weights `structinit init MODEL --init X --seed N --save F` writes, pinned: a refactoring must
leave them as they are. Each tensor is pinned by its shape and three sums (plain, squared, and
against a fixed random sign pattern), compared to 1e-5: bit-exact digests of SVD results differ
between CPUs, a changed init differs in the first digits.

After a deliberate change of an init: python tests/test_pinned_inits.py --write"""

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from structinit.cli import main

PINNED = Path(__file__).with_name("pinned_inits.json")
SMALL = "img_size=32"
CASES = [
    ("vit_digits", "", "impulse", 3),
    ("vit_digits", "", "impulse-soft", 3),
    ("vit_digits", "", "impulse-authors", 3),
    ("vit_digits", "", "mimetic", 3),
    ("vit_digits", "", "timm", 3),
    ("vit_digits", "", "kaiming", 3),
    ("vit_digits", "", "qk-norm", 3),
    ("vit_tiny_p4", SMALL, "impulse[kernel_size=5]", 0),
    ("vit_tiny_p4", SMALL, "mimetic[base=kaiming]", 0),
    ("swin_d6_p2_w4", SMALL, "impulse", 1),
    ("mixer_d6_p4", SMALL, "impulse", 1),
    ("convmixer_d6_p4", "", "impulse", 1),
    ("convmixer_d6_p4", "", "random", 1),
]


def case_id(case: tuple) -> str:
    model, kwargs, init, seed = case
    return f"{model}{'(' + kwargs + ')' if kwargs else ''} {init} seed {seed}"


def fingerprint(state: dict[str, torch.Tensor]) -> dict[str, list]:
    """Per tensor: its shape, and its sum, sum of squares and sum against fixed signs (float64)."""
    prints = {}
    for name, tensor in sorted(state.items()):
        values = tensor.detach().double().flatten()
        signs = torch.randint(0, 2, values.shape, generator=torch.Generator().manual_seed(0)).double() * 2 - 1
        sums = [values.sum().item(), values.square().sum().item(), (values * signs).sum().item()]
        prints[name] = [list(tensor.shape), sums]
    return prints


def written_weights(case: tuple, folder: Path) -> dict[str, torch.Tensor]:
    model, kwargs, init, seed = case
    path = folder / "init.safetensors"
    argv = ["init", model, "--init", init, "--seed", str(seed), "--save", str(path)]
    assert main([*argv, "--model-kwargs", kwargs] if kwargs else argv) == 0
    return load_file(path)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_the_weights_an_init_writes_are_those_pinned(case, tmp_path, capsys):
    pinned = json.loads(PINNED.read_text())[case_id(case)]
    now = fingerprint(written_weights(case, tmp_path))
    capsys.readouterr()
    assert list(now) == list(pinned)
    for name, (shape, sums) in now.items():
        assert shape == pinned[name][0], name
        scale = max(abs(s) for s in pinned[name][1]) or 1.0
        assert sums == pytest.approx(pinned[name][1], rel=1e-5, abs=1e-5 * scale), name


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        prints = {case_id(case): fingerprint(written_weights(case, Path(folder))) for case in CASES}
    PINNED.write_text(json.dumps(prints, indent=1) + "\n")
    print(f"pinned {len(prints)} inits in {PINNED}")
