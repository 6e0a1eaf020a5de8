"""What a `choose` comparison says and leaves in its folder: the verdict's own table (results.md and results.csv:
every run at the epoch the verdict read, the same scores after the same steps; curves.png and summary.png of
those epochs), and verdict.md, what the command said (the comparison, the verdict, what is left, the command
that trains the winner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ..files import atomic_write_text, remove_temporaries
from ..training.settings import TrainConfig
from .choose_pace import Pace
from .choose_plan import Plan
from .grid import RESULT_FILES
from .results import row_at, time_to_accuracy
from .tables import write_results
from .verdict import Verdict

VERDICT_FILE = "verdict.md"
REPORT_FILES = (*RESULT_FILES, VERDICT_FILE)


@dataclasses.dataclass(frozen=True)
class Choice:
    """A comparison as far as it went: its verdict (None where some run has no epoch yet), the epoch it was
    read at, every run's result row at that epoch (results.md's), the config the runs trained and the plan."""

    verdict: Verdict | None
    epoch: int
    rows: list[dict[str, Any]]
    config: TrainConfig
    plan: Plan

    def minutes_left(self) -> float:
        """About the minutes the comparison needs to reach its plan from where it is."""
        pace = Pace(*self.plan.pace)
        runs = len(self.plan.inits) * len(self.plan.seeds)
        return runs * pace.seconds_for(self.plan.epochs - self.epoch) / 60

    def lines(self) -> list[str]:
        """What was compared, the verdict, what is left to do and the command that trains the winner."""
        config, plan, verdict = self.config, self.plan, self.verdict
        images = f"{config.per_class} images a class" if config.per_class else "every training image"
        lines = [
            f"compared: {len(plan.inits)} inits x seeds {','.join(map(str, plan.seeds))} on {config.data} ({images}, "
            f"{config.val_per_class} a class held out for validation), epoch {self.epoch} of {plan.epochs} "
            f"({self.epoch * plan.steps} steps at batch {config.batch_size}; {plan.sized()}) of {plan.model}"
        ]
        if verdict is not None:
            lines.append(verdict.text())
        if self.epoch < plan.epochs:
            left = f"about {self.minutes_left():.1f} minutes more at the pace measured"
            lines.append(
                f"the budget ended at epoch {self.epoch} of the {plan.epochs} planned: the same command goes on "
                f"({left})" + ("" if verdict is not None else "; no verdict before every run has trained")
            )
        elif verdict is not None and verdict.too_short:
            lines.append("to tell: a longer budget (--minutes M --rerun: from scratch), more images, or another --out")
        if verdict is not None and not verdict.too_short and not verdict.tie:
            kwargs = ",".join(f"{k}={v}" for k, v in config.model_kwargs.items())
            model = f" --model {config.model}" + (f" --model-kwargs {kwargs}" if kwargs else "")
            lines.append(
                f"train it: structinit train --data {config.data}{model} --init '{verdict.best}' -b {config.batch_size}"
            )
        return lines


def write_report(out: Path, configs: list[TrainConfig], choice: Choice) -> list[dict[str, Any]]:
    """results.md and results.csv (every run at the verdict's epoch), their figures and verdict.md, each written
    whole; none where no epoch every run reached (there is no verdict). Returns the rows."""
    remove_temporaries(out, REPORT_FILES)  # what an interrupted write of them left
    if choice.epoch == 0:
        return []
    rows = [row_at(Path(config.out), choice.epoch) for config in configs]
    time_to_accuracy(rows)
    steps = choice.epoch * choice.plan.steps
    heading = (
        f"`structinit choose`'s table: every run at epoch {choice.epoch} of the {choice.plan.epochs} planned, "
        f"{steps} steps, as the verdict ({VERDICT_FILE}) read them.\n\n"
    )
    write_results(rows, out, heading=heading)
    from .plots import plot_curves, plot_summary  # matplotlib: only once there is something to draw

    plot_curves(rows, out / "curves.png")
    plot_summary(rows, out / "summary.png")
    said = "\n".join(choice.lines())
    atomic_write_text(
        out / VERDICT_FILE, f"# `structinit choose`'s verdict\n\n```\n{said}\n```\n\nIts table: results.md\n"
    )
    return rows
