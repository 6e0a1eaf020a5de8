"""What the inspection commands (`attention`, `rank`) look at: a run directory, at init or trained,
or a model name / preset initialised on the spot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

from ..data.datasets import StreamData, TensorData, load_data
from ..errors import RunError, first_line
from ..models import is_model_name
from ..training.checkpoint import load_checkpoint
from ..training.config_file import read_config
from ..training.recipe import model_of
from ..training.settings import TrainConfig
from ..weights_in import check_weights


def load_target(
    target: str,
    *,
    data: str | None = None,
    at_init: bool = False,
    init: str = "impulse",
    model_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
) -> tuple[nn.Module, TensorData | StreamData, str, TrainConfig]:
    """(model in eval mode, dataset, title, config). A run directory gives the model of its config.yaml
    with the weights of last.pt (unless `at_init`) and its data (unless `data`); anything else is a
    timm model name or preset, initialised with the init label `init`, on `data` (default digits)."""
    run = Path(target)
    if (run / "config.yaml").exists():
        config = read_config(run / "config.yaml")
        dataset = load_data(
            data or config.data, root=config.data_root, cache_dir=config.cache_dir, img_size=config.img_size
        )
        model, _ = model_of(config, dataset, checkpointed=not at_init)
        state = "at initialisation"
        if not at_init:
            if not (run / "last.pt").exists():
                raise FileNotFoundError(f"{run} has no last.pt; use --at-init for the model at initialisation")
            checkpoint = load_checkpoint(run / "last.pt")
            try:
                model.load_state_dict(checkpoint["model"])
            except (RuntimeError, TypeError) as error:
                given = f" built for --data {data}" if data else ""
                raise RunError(f"{run / 'last.pt'} does not fit the model{given} ({first_line(error)})") from None
            check_weights(str(run / "last.pt"), checkpoint["model"], model)
            state = f"trained {checkpoint['epoch']} of {config.total_epochs} epochs"
        title = f"{config.model}, {config.init} init (seed {config.seed}), {state} on {config.data}"
    else:
        if run.exists():
            raise FileNotFoundError(f"{run} is a directory without config.yaml: not a run directory")
        if "/" in target or "\\" in target or not is_model_name(target):
            raise FileNotFoundError(f"{target} is neither a run directory nor a timm model name or preset")
        config = TrainConfig(model=target, init=init, seed=seed, model_kwargs=model_kwargs or {})
        dataset = load_data(data or "digits")
        model, _ = model_of(config, dataset)
        title = f"{target}, {init} init (seed {seed}), at initialisation"
    return model.eval(), dataset, title, config
