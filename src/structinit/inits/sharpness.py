"""The sharpness `impulse` takes: the mass on each head's offset that the paper's own solve
(paper_solve.py) reaches on the model's pseudo input, to 0.01 and within [0.01, 0.99] (a target the
closed form can meet). Found, in order: in the table shipped with structinit (the full solve of timm's
registered ViTs and structinit's presets, benchmarks/solve_grid.py --part table), matched by the pseudo
input itself; in the cache (~/.cache/structinit/paper-sharpness/, one file per pseudo input); else solved
once, with a notice of its expected time and a progress bar on a terminal.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import json
import os
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from timm.layers import build_sincos2d_pos_embed

from ..adapters.base import timm_embeddings_
from ..cachefiles import keep, read_kept
from ..errors import Notice
from .paper_solve import STEPS, PaperSolve, paper_solve
from .progress import NOTICE_SECONDS, duration, progress_bar
from .threads import available_threads

DECIMALS = 2  # the solve's mass is kept to 0.01 (docs/methods.md: its spread over the solve's seeds), in [0.01, 0.99]
TABLE = Path(__file__).with_name("paper_sharpness.json")
TABLE_TOLERANCE = 1e-4  # a float32 pseudo input within it of an entry's standard one takes the entry's value
CACHE_FOLDER = "paper-sharpness"
KEPT_LIMIT = 4096  # bytes: a kept value is a few lines

# where the solve runs (the model's device, api.initialize sets it)
SOLVE_DEVICE: contextvars.ContextVar[torch.device | None] = contextvars.ContextVar("solve_device", default=None)
# called with the solve's arguments before a one-off solve starts; it may raise to refuse it (choose: its budget)
BEFORE_SOLVE: contextvars.ContextVar[Callable[..., None] | None] = contextvars.ContextVar("before_solve", default=None)


def paper_sharpness(pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int) -> tuple[float, str]:
    """The sharpness for the grid tokens `pseudo` (T, D), and where it was found ("structinit's table",
    "the cache", "solved here")."""
    tolerance = max(TABLE_TOLERANCE, 8 * torch.finfo(pseudo.dtype).eps)  # a half model's rounding: fp16 8e-3
    pseudo = pseudo.detach().to("cpu", torch.float32).contiguous()
    tabled = table_value(pseudo, grid, heads, kernel_size, tolerance)
    if tabled is not None:
        return tabled, "structinit's table"
    digest = hashlib.sha256(pseudo.numpy().tobytes()).hexdigest()[:16]
    path = cache_home() / CACHE_FOLDER / f"{digest}-{pseudo.shape[0]}x{pseudo.shape[1]}-g{grid[0]}x{grid[1]}"
    path = path.with_name(f"{path.name}-h{heads}-f{kernel_size}-{STEPS}.json")
    kept, why = read_kept(path, KEPT_LIMIT)
    value = kept.get("mass") if isinstance(kept, dict) else None
    if is_sharpness(value):
        return value, "the cache"
    if why or kept is not None:
        why = why or f"{path} holds no sharpness the solve writes ({json.dumps(kept)[:40]})"
        warnings.warn(f"impulse: {why}: solved again", Notice, stacklevel=3)
    if (before := BEFORE_SOLVE.get()) is not None:
        before(pseudo, grid, heads, kernel_size)
    solve, seconds = _solve(pseudo, grid, heads, kernel_size, path)
    value = rounded(solve.mass)
    record = {"mass": value, "reached": round(solve.mass, 6), "steps": solve.steps, "seconds": round(seconds, 2)}
    why = keep(path, record)
    if why:
        warnings.warn(f"impulse: {value} not kept ({why}); impulse[target_fidelity={value}] skips the solve", Notice, 3)
    return value, "solved here"


def rounded(mass: float) -> float:
    return min(max(round(mass, DECIMALS), 0.01), 0.99)


def is_sharpness(value: Any) -> bool:
    """A value the solve writes: a float in [0.01, 0.99] on the 0.01 grid."""
    return type(value) is float and 0.01 <= value <= 0.99 and round(value, DECIMALS) == value


def cache_home() -> Path:
    """~/.cache/structinit, or $STRUCTINIT_CACHE where set."""
    return Path(os.environ.get("STRUCTINIT_CACHE") or Path.home() / ".cache" / "structinit").expanduser()


def standard_pseudo(kind: str, grid: tuple[int, int], width: int, eps: float) -> torch.Tensor:
    """The layer-normalised grid tokens of a kind of position embedding: "learned" (impulse solves on a
    trunc-normal draw of its shape, seed 0) or "sincos" (timm's 2-D sin-cos table)."""
    if kind == "learned":
        tokens = torch.empty(grid[0] * grid[1], width)
        timm_embeddings_(tokens, [], torch.Generator().manual_seed(0))
    else:
        tokens = build_sincos2d_pos_embed(list(grid), width).float()
    return F.layer_norm(tokens, (width,), eps=eps)


def table_value(
    pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int, tolerance: float = 1e-4
) -> float | None:
    """The shipped table's value for this pseudo input (equal to its entry's standard one within
    `tolerance`: 1e-4, or the rounding of the dtype the model holds it in)."""
    for entry in _shipped()["entries"]:
        same = (entry["grid"], entry["width"], entry["heads"], entry["kernel"])
        if same != ([*grid], pseudo.shape[1], heads, kernel_size) or pseudo.shape[0] != grid[0] * grid[1]:
            continue
        standard = standard_pseudo(entry["kind"], grid, entry["width"], entry["eps"])
        if torch.allclose(pseudo, standard, rtol=0.0, atol=tolerance):
            return entry["mass"]
    return None


def shortcut(tokens: int, width: int) -> bool:
    """Whether the solve of this shape may stop once saturated: the full solves of benchmarks/solve_grid.py
    cover it (a shape of at most as many tokens and as wide as one of the table's "shortcut" corners:
    every solve of that many tokens and that width ended where the shortcut did)."""
    return any(tokens <= most_tokens and width <= widest for most_tokens, widest in _shipped()["shortcut"])


@functools.cache
def _shipped() -> dict:
    """The shipped table: its entries and the shortcut's corners, read once."""
    return json.loads(TABLE.read_text())


def _solve(
    pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int, path: Path
) -> tuple[PaperSolve, float]:
    """The paper's solve of this pseudo input, and its seconds."""
    device = SOLVE_DEVICE.get() or torch.device("cpu")
    shape = f"{pseudo.shape[0]} tokens, width {pseudo.shape[1]}, {heads} heads, kernel {kernel_size}"
    start = time.perf_counter()
    stops = shortcut(*pseudo.shape)
    what = shape + ("; stops early once saturated" if stops else "")
    threads = min(heads, available_threads()) if device.type == "cpu" else 1
    with _progress(what, device, threads, path) as on_step:
        solve = paper_solve(
            pseudo, grid, heads, kernel_size, device=device, threads=threads, stop_saturated=stops, on_step=on_step
        )
    return solve, time.perf_counter() - start


@contextlib.contextmanager
def _progress(what: str, device: torch.device, threads: int, path: Path) -> Iterator[Callable[[int], None]]:
    """on_step for the solve: after 5 timed steps, a notice of the expected time where it is over
    NOTICE_SECONDS, and the progress bar (progress.progress_bar)."""
    where = f"{threads} CPU thread{'s' * (threads > 1)}" if device.type == "cpu" else str(device)
    state: dict[str, Any] = {"bar": None}

    def on_step(step: int) -> None:
        if step == 1:
            state["start"], state["done"] = time.perf_counter(), 1  # the first step pays for the allocations
            return
        if step == 6:
            expected = (time.perf_counter() - state["start"]) / 5 * (STEPS - 6)
            if expected > NOTICE_SECONDS:
                warnings.warn(
                    f"impulse: the paper's solve for this model, once: up to {duration(expected)} on {where}; "
                    f"impulse[target_fidelity=X] skips it; {what}; kept in {path.parent}",
                    Notice,
                    stacklevel=5,
                )
                state["bar"] = progress_bar(STEPS, "impulse: the paper's solve")
                state["done"] = 0
        if state["bar"] is not None:
            state["bar"].update(step - state["done"])
        state["done"] = step

    try:
        yield on_step
    finally:
        if state["bar"] is not None:
            state["bar"].close()
