"""The init as a file: weights that timm's `load_checkpoint` (and so train.py's
`--initial-checkpoint`), `model.load_state_dict` and other trainers take.

`.safetensors` files carry the init's record (method, seed, options, structinit version and the
weights' sha256) as metadata; `.pth`/`.pt` files hold the bare state dict, which is what
`model.load_state_dict(torch.load(path))` expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torch import nn

from .adapters import unwrap
from .files import atomic_save, weights_sha256
from .report import Report

SUFFIXES = (".safetensors", ".pth", ".pt")


def check_init_path(path: str | Path) -> Path:
    """`path` if save_init can write there, else a ValueError that names the fix (before any work)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ValueError(f"save the init as one of {', '.join(SUFFIXES)}, got {path.name!r}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory: give a file name, e.g. {path / ('init' + SUFFIXES[0])}")
    if not path.parent.is_dir():
        raise ValueError(f"{path.parent} does not exist: create it first")
    return path


def save_init(model: nn.Module, path: str | Path, report: Report | None = None) -> str:
    """Write `model`'s weights (unwrapped from torch.compile/DDP) to `path` and return their sha256.

    Pass the `Report` that `initialize` returned to record the init in a `.safetensors` file."""
    path = check_init_path(path)
    # own, contiguous CPU copies: safetensors refuses tensors that share storage
    state = {name: t.detach().cpu().contiguous().clone() for name, t in unwrap(model).state_dict().items()}
    digest = weights_sha256(state)
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        metadata = {"format": "pt", "weights_sha256": digest, **_record(report)}
        atomic_save(state, path, write=lambda tensors, f: f.write(save(tensors, metadata=metadata)))
    else:
        atomic_save(state, path)
    return digest


def _record(report: Report | None) -> dict[str, str]:
    from .version import __version__

    record: dict[str, Any] = {"structinit": __version__}
    if report is not None:
        record.update(method=report.method, seed=report.seed, options=report.options, model=report.model)
        record.update(report.source)
        record["mean_fidelity"] = report.mean_fidelity
    return {key: value if isinstance(value, str) else json.dumps(value, default=str) for key, value in record.items()}
