"""`structinit attention`: the attention maps of a run (at init or trained) or of an initialised model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .adapters import get_adapter
from .fidelity import mean_attention
from .inits.labels import DEFAULT, KERNEL_SIZE, parse_init
from .plots import plot_attention
from .report import best_offsets
from .targets import load_target
from .train import normalised_test_images


def attention_figure(
    target: str,
    *,
    data: str | None = None,
    images: int = 64,
    at_init: bool = False,
    init: str = "impulse",
    model_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    out: str | Path = "attention.png",
    dpi: int = 110,
) -> Path:
    """Average the attention maps over `images` test images and draw them per layer and head.

    `target` is a run directory (the model of its config.yaml, with the weights of last.pt unless
    `at_init`) or a timm model name / preset, initialised with `init`.
    """
    model, dataset, title, config = load_target(
        target, data=data, at_init=at_init, init=init, model_kwargs=model_kwargs, seed=seed
    )
    batch = normalised_test_images(model, dataset, images)
    maps = mean_attention(model, batch)
    grid = get_adapter(model).grid
    kernel_size = 3 if config.init == DEFAULT else parse_init(config.init)[1].get(KERNEL_SIZE, 3)
    heads = [best_offsets(m.unsqueeze(0), kernel_size, grid, 0) for m in maps]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    title = f"{title}: mean attention over {len(batch)} test images"
    plot_attention(maps, grid, out, title, heads=heads, kernel_size=kernel_size, dpi=dpi)
    return out
