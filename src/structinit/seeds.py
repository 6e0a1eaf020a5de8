"""Seeds as the library and the command take them: an int in numpy's range."""

from __future__ import annotations

from typing import Any

MAX_SEED = 2**32 - 1  # numpy's largest seed: build_model and the trainer seed numpy with it too


def check_seed(seed: Any, name: str = "seed") -> None:
    """A seed is an int in 0..MAX_SEED, in the library as on the command line (`name`: its flag)."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{name} must be an int or None, got {seed!r}")
    if not 0 <= seed <= MAX_SEED:
        raise ValueError(f"{name} must lie in 0..{MAX_SEED} (numpy's seeds), got {seed}")
