"""`structinit attention`: the attention maps of a run (at init or trained) or of an initialised model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import yaml

from .adapters import get_adapter
from .data import load_data
from .fidelity import mean_attention
from .plots import plot_attention
from .train import TrainConfig, build_model, normalised_test_images


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
) -> Path:
    """Average the attention maps over `images` test images and draw them per layer and head.

    `target` is a run directory (the model of its config.yaml, with the weights of last.pt unless
    `at_init`) or a timm model name / preset, initialised with `init`.
    """
    run = Path(target)
    if (run / "config.yaml").exists():
        config = TrainConfig(**yaml.safe_load((run / "config.yaml").read_text()))
        dataset = load_data(data or config.data, root=config.data_root, cache_dir=config.cache_dir)
        model, _ = build_model(config, dataset)
        state = "at init"
        if not at_init:
            if not (run / "last.pt").exists():
                raise FileNotFoundError(f"{run} has no last.pt; use --at-init for the maps at initialisation")
            checkpoint = torch.load(run / "last.pt", map_location="cpu", weights_only=False)
            model.load_state_dict(checkpoint["model"])
            state = f"after epoch {checkpoint['epoch']}"
        title = f"{run.name} ({config.init} init), {state}"
    else:
        if run.exists():
            raise FileNotFoundError(f"{run} is a directory without config.yaml: not a run directory")
        config = TrainConfig(model=target, init=init, seed=seed, model_kwargs=model_kwargs or {})
        dataset = load_data(data or "digits")
        model, _ = build_model(config, dataset)
        title = f"{target}, {init} init"
    model.eval()
    batch = normalised_test_images(model, dataset, images)
    maps = mean_attention(model, batch)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_attention(maps, get_adapter(model).grid, out, f"{title}: mean attention over {len(batch)} test images")
    return out
