"""Training from Python: `train` one run and `compare` inits on a grid, through the code that
`structinit train` and `structinit compare` run, with what they did returned as objects to read
(the top-1, the run's directory, the results table) rather than lines printed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import quiet_notices
from .files import read_json_object
from .schema import Field, Schema, check, integer, listing, mapping, number, text
from .studies import grid
from .studies.grid_checks import RECORDED_OPTIONS
from .training import run
from .training.settings import TrainConfig

REPORT_FIX = "train the run again: its start writes it"


def _fidelities_of_its_heads(report: dict[str, Any]) -> str | None:
    """Its mean and worst fidelity are those of its heads' (Report.mean_fidelity, min_fidelity)."""
    values = [h["fidelity"] for layer in report["layers"] for h in layer["heads"] if h["fidelity"] is not None]
    mean, worst = (sum(values) / len(values), min(values)) if values else (None, None)
    if (report["mean_fidelity"], report["min_fidelity"]) != (mean, worst):
        return "its 'mean_fidelity' and 'min_fidelity' are not those of its layers' heads"
    return None


FIDELITY = number(0, 1, null=True)
STEPS = Field("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))  # an offset's, up or down
OFFSET = Field("[dy, dx] or null", lambda v: v is None or (isinstance(v, list) and len(v) == 2), items=STEPS)
HEAD = Schema({"offset": OFFSET, "fidelity": FIDELITY})
LAYER = Schema({"index": integer(0), "seconds": number(0), "heads": listing(mapping(HEAD), at_least=1)})
# a run's init_report.json: Report.to_dict (an older one lacks its `unit`) and the lines the run's start printed
INIT_REPORT = Schema(
    {
        **RECORDED_OPTIONS.fields,
        "model": text(),
        "seed": integer(0, null=True),
        "source": mapping(Schema({}, patterns={r".+": text()}), optional=True),
        "constructor": mapping(optional=True),
        "measured_on": text(),
        "unit": text(optional=True),
        "mean_fidelity": FIDELITY,
        "min_fidelity": FIDELITY,
        "on_images": mapping(
            Schema({"images": integer(1), **dict.fromkeys(("mean", "min", "uniform"), number(0, 1))}), optional=True
        ),
        "seconds": number(0),
        "layers": listing(mapping(LAYER)),
        "startup": listing(text(), optional=True),
    },
    rules=(*RECORDED_OPTIONS.rules, _fidelities_of_its_heads),
)


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
        """What the init did, per layer and head (init_report.json: `structinit.Report.to_dict`), checked against
        its schema: RunError naming the file and the first damaged field."""
        path = self.out / "init_report.json"
        return check(read_json_object(path, REPORT_FIX), INIT_REPORT, str(path), REPORT_FIX)


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
    """Train one run in `config.out` (or resume it: `config.resume`), as `structinit train` does; notices
    (one line each) not shown where `config.quiet`."""
    with quiet_notices(config.quiet):
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
    with quiet_notices(base.quiet):
        rows = grid.compare(base, list(inits), list(seeds), sizes, out, **how)
    return GridResult(Path(out), rows)
