"""Checkpoints that are safe to open and never half-written.

A checkpoint holds only tensors and plain containers (RNG states included), so it loads with
`torch.load(weights_only=True)`: opening a run directory never runs code planted in it. It is
written to a temporary file, fsynced, and renamed over last.pt, whose previous version is kept as
prev.pt; a failed write (a full disk) removes the temporary file and says so in one line.
"""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from .rundir import RunError


def atomic_save(
    obj: Any, path: Path, keep_previous: bool = False, write: Callable[[Any, BinaryIO], Any] | None = None
) -> None:
    """`write` (default torch.save) to a temporary file, fsync, then rename over `path` (the old file becomes
    prev.pt with `keep_previous`). A crash leaves the old file intact; a failure leaves no temporary
    file and says in one line what to do."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            (write or torch.save)(obj, f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous and path.exists():
            previous = path.with_name("prev.pt")
            link = previous.with_name(f".{previous.name}.tmp{os.getpid()}")
            link.unlink(missing_ok=True)
            os.link(path, link)  # last.pt stays in place until the new one replaces it
            os.replace(link, previous)
        os.replace(tmp, path)
        sync_directory(path.parent)
    except OSError as error:
        tmp.unlink(missing_ok=True)
        if error.errno == errno.ENOSPC:
            then = " and --resume" if keep_previous else ""  # a run's checkpoint, or a file written once
            raise RunError(f"no space left on the device holding {path}: free some{then}") from None
        raise RunError(f"cannot write {path}: {error.strerror or error}") from None


def sync_directory(folder: Path) -> None:
    """Make a rename in `folder` durable (a no-op where directories cannot be opened, as on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """A checkpoint written by `atomic_save`, loaded with weights_only=True; one-line errors for a
    missing, truncated or unsafe file."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            raise RunError(
                f"{path} holds Python objects beyond tensors and plain containers, so structinit will not "
                "open it (unpickling can run code). If you wrote it yourself with an older structinit, "
                f"convert it once: structinit upgrade-checkpoint {path}"
            ) from None
        raise RunError(f"{path} is damaged ({error}); prev.pt, if present, holds the epoch before") from None
    except (RuntimeError, EOFError, OSError) as error:
        raise RunError(
            f"{path} is truncated or damaged ({error}); prev.pt, if present, holds the epoch before"
        ) from None


def upgrade_checkpoint(path: Path) -> None:
    """Rewrite a checkpoint of structinit < 0.2 (numpy RNG state pickled as an object, a scheduler
    state) in the safe format. It unpickles the file, so only for files you trust."""
    path = Path(path)
    old = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(old, dict) or "model" not in old or "epoch" not in old:
        raise RunError(f"{path} is not a structinit checkpoint")
    rng = old.get("rng") or {}
    new = {k: v for k, v in old.items() if k not in ("scheduler", "rng")}
    if rng:
        new["rng"] = {
            "torch": rng["torch"],
            "numpy": _numpy_state(rng["numpy"]),
            "python": _python_state(rng["python"]),
        }
    new.setdefault("metrics", None)
    atomic_save(new, path)


def weights_sha256(state: dict[str, torch.Tensor]) -> str:
    """A digest of a state dict's names, dtypes, shapes and bytes: two inits are the same weights
    exactly when their digests are equal, without keeping both models."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        tensor = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


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
