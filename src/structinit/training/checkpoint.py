"""Checkpoints that are safe to open and never half-written.

A checkpoint holds only tensors and plain containers (RNG states included), so it loads with
`torch.load(weights_only=True)`: opening a run directory never runs code planted in it. It is
written to a temporary file, fsynced, and renamed over last.pt, whose previous version is kept as
prev.pt; a failed write (a full disk) removes the temporary file and says so in one line.
"""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import RunError, first_line
from ..files import atomic_save, regular_file
from ..schema import Schema, integer, listing, mapping, problem, text
from .record import EPOCH, checkpoint_lines, line_problem


def _lines_of_its_epoch(state: dict[str, Any]) -> str | None:
    """The log lines a checkpoint holds are log lines; its metrics, those of its epoch."""
    for line in checkpoint_lines(state):
        why = line_problem(line)
        if why:
            return f"a log line it holds is not an epoch or event record ({why})"
    metrics = state.get("metrics")
    if metrics and metrics["epoch"] != state["epoch"]:
        return f"its metrics are of epoch {metrics['epoch']}, not of its 'epoch' {state['epoch']}"
    return None


# a checkpoint's plain values (its weights are checked as all weights entering are: weights_in; its config as
# config.yaml's: config_file.config_values); an older structinit's lacks `log` and `data` (its data's fingerprint)
CHECKPOINT = Schema(
    {
        "epoch": integer(1),
        "model": mapping(),
        "config": mapping(),
        "metrics": mapping(EPOCH, optional=True, null=True),
        "log": listing(optional=True, null=True),
        "rng": mapping(optional=True),
        "data": text(optional=True),
    },
    rules=(_lines_of_its_epoch,),
)


def load_checkpoint(path: Path, mmap: bool = False) -> dict[str, Any]:
    """A checkpoint written by `atomic_save`, loaded with weights_only=True (`mmap`: its tensors read
    only when used); one-line errors for a missing, truncated, damaged, foreign or unsafe file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    regular_file(path)
    damaged = f"; prev.pt, if present, holds the epoch before ({path.parent}/prev.pt: copy it over {path.name})"
    if not zipfile.is_zipfile(path):  # torch.save writes zip archives; anything else is damaged or foreign
        raise RunError(f"{path} is truncated or damaged, or not a checkpoint (not a torch.save archive){damaged}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        if "unsupported global" not in str(error).lower():
            raise RunError(f"{path} is damaged ({first_line(error)}){damaged}") from None
        raise RunError(
            f"{path} holds Python objects beyond tensors and plain containers, so structinit will not "
            "open it (unpickling can run code). If it is a checkpoint of an older structinit, convert it "
            f"once (no code runs): structinit upgrade-checkpoint {path}"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise RunError(f"{path} is truncated or damaged ({first_line(error)}){damaged}") from None
    if not isinstance(state, dict) or not {"model", "epoch", "config"} <= state.keys():
        raise RunError(f"{path} is not a structinit checkpoint (it lacks model, epoch or config)")
    why = problem(state, CHECKPOINT)
    if why:
        raise RunError(f"{path} is damaged ({why}){damaged}")
    return state


def upgrade_checkpoint(path: Path) -> None:
    """Rewrite a checkpoint of structinit < 0.2 (numpy RNG state pickled as an array, a scheduler
    state) in the safe format. Unpickled with only numpy's array constructors allowed beside
    tensors and plain containers, so no file runs code here either."""
    path = Path(path)
    if not path.exists():
        raise RunError(f"{path}: no such checkpoint file (give a run's last.pt)")
    regular_file(path)
    if not zipfile.is_zipfile(path):
        raise RunError(f"{path} is damaged or not a checkpoint (not a torch.save archive): nothing to upgrade")
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError:
        pass  # objects beyond tensors: an old checkpoint, or a foreign file (below)
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise RunError(f"{path} is truncated or damaged ({first_line(error)}): nothing to upgrade") from None
    else:
        raise RunError(f"{path} is already in the current format: nothing to upgrade")
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            old = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise RunError(
            f"{path} holds objects no structinit checkpoint holds ({first_line(error)}): not converted"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise RunError(f"{path} is truncated or damaged ({first_line(error)}): nothing to upgrade") from None
    if not isinstance(old, dict) or "model" not in old or "epoch" not in old:
        raise RunError(f"{path} is not a structinit checkpoint")
    rng = old.get("rng") or {}
    new = {k: v for k, v in old.items() if k not in ("scheduler", "rng")}
    if rng:
        new["rng"] = {
            "torch": rng["torch"],
            "numpy": rng["numpy"] if isinstance(rng["numpy"], dict) else _numpy_state(rng["numpy"]),
            "python": rng["python"] if isinstance(rng["python"], dict) else _python_state(rng["python"]),
        }
    new.setdefault("metrics", None)
    atomic_save(new, path)


def _numpy_array_globals() -> list[Any]:
    """What unpickling a numpy array (an old checkpoint's RNG state) needs, and nothing more."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def rng_state() -> dict[str, Any]:
    """Every global random stream, as tensors and plain lists."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": _numpy_state(np.random.get_state()),
        "python": _python_state(random.getstate()),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(
        (numpy["name"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"], numpy["cached"])
    )
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss_next"]))


def _numpy_state(state: tuple) -> dict[str, Any]:
    name, keys, pos, has_gauss, cached = state
    return {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached": float(cached),
    }


def _python_state(state: tuple) -> dict[str, Any]:
    version, internal, gauss_next = state
    return {"version": version, "state": list(internal), "gauss_next": gauss_next}
