"""Training from Python: `train` one run and `compare` inits on a grid, through the code that
`structinit train` and `structinit compare` run, with what they did returned as objects to read
(the top-1, the run's directory, the results table) rather than lines printed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import read_json_object
from .studies import grid
from .training import run
from .training.settings import TrainConfig


@dataclass(frozen=True)
class RunResult:
    """A run: its settings and its summary (summary.json: the last epoch's metrics, `finished`,
    `epochs_done`, and the init's method and fidelity under "init")."""

    config: TrainConfig
    summary: dict[str, Any]

    @property
    def out(self) -> Path:
        """The run's directory: config.yaml, metrics.jsonl, init_report.json, last.pt, summary.json."""
        return Path(self.config.out)

    @property
    def split(self) -> str:
        """What the run was evaluated on: 'test', or 'val' with a validation split (val_per_class)."""
        return self.config.eval_split

    @property
    def top1(self) -> float | None:
        """The last epoch's top-1 (%) on `split`; None if that epoch was not evaluated (eval_every)."""
        return self.summary.get(f"{self.split}_top1")

    @property
    def finished(self) -> bool:
        """Whether the run did all its epochs (not if it stopped early: stop_after)."""
        return self.summary["finished"]

    @property
    def init_report(self) -> dict[str, Any]:
        """What the init did, per layer and head (init_report.json: `structinit.Report.to_dict`)."""
        return read_json_object(self.out / "init_report.json", "train the run again: its start writes it")


@dataclass(frozen=True)
class GridResult:
    """A grid: its directory and a row per finished run in it (the rows of results.csv, with each
    run's curve), which results.md tabulates."""

    out: Path
    rows: list[dict[str, Any]]

    @property
    def table(self) -> str:
        """results.md, the grid's table (`structinit.studies.results.results_markdown`)."""
        return (self.out / "results.md").read_text()

    def top1(self, init: str, per_class: int | None = None) -> list[float]:
        """The final top-1 (%) of each seed's run of `init`, by seed, at `per_class` images per class
        (which a grid of one subset size needs not name)."""
        runs = [row for row in self.rows if row["init"] == init]
        if per_class is not None:
            runs = [row for row in runs if row["per_class"] == per_class]
        sizes = sorted({row["per_class"] or 0 for row in runs})  # a row's per_class: "" for the whole set
        if len(sizes) > 1:
            named = ", ".join(str(size or "all") for size in sizes)
            raise ValueError(f"{self.out} trained {init} at per_class {named}: give per_class")
        return [row["top1"] for row in sorted(runs, key=lambda row: row["seed"])]


def train(config: TrainConfig) -> RunResult:
    """Train one run in `config.out` (or resume it: `config.resume`), as `structinit train` does."""
    return RunResult(config, run.train(config))


def compare(
    base: TrainConfig,
    inits: Sequence[str],
    seeds: Sequence[int] = (0,),
    *,
    out: str | Path,
    per_class: Sequence[int | None] | None = None,
    **how: Any,
) -> GridResult:
    """Train `base` once per init label, seed and subset size (`per_class`, default base's) into `out`
    and tabulate the grid, as `structinit compare` does: finished runs are skipped, interrupted ones
    resumed. `how`: parallel, rerun, threads, cluster (`structinit.studies.grid.compare`)."""
    sizes = [base.per_class] if per_class is None else list(per_class)
    rows = grid.compare(base, list(inits), list(seeds), sizes, out, **how)
    return GridResult(Path(out), rows)
