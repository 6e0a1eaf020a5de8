"""The `structinit` command: init, train, compare, attention, rank, demo, upgrade-checkpoint."""

from .commands import main

__all__ = ["main"]
