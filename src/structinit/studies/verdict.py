"""The verdict of `structinit choose` on each init's validation top-1 over seeds: the init to use and its
margin against the seed-to-seed spread, "too short to tell" where the runs are near chance or all within
the noise of each other, and "scale, not structure" only where the norm-matched control both ties the
structured init and beats PyTorch's plain default beyond the noise."""

from __future__ import annotations

import dataclasses
import statistics

PLAIN = "kaiming"  # the baseline the control is PyTorch's base of


def spread(*scores: list[float]) -> float:
    """The seed-to-seed spread of one or more inits: the largest of their standard deviations."""
    return max(statistics.stdev(values) for values in scores)


def near_chance(top1: float, chance: float) -> bool:
    """Within 5 points, or a tenth of the way from chance to 100 %, of chance (top-1 in %)."""
    return top1 < chance + max(5.0, (100 - chance) / 10)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the comparison says: each init's validation top-1 over seeds, the best and the runner-up,
    the margin between them against the larger of their seed-to-seed standard deviations."""

    scores: dict[str, list[float]]
    best: str
    runner_up: str
    margin: float
    spread: float
    structured: str
    control: str | None
    chance: float | None = None  # top-1 of a guess (100 / classes), where known

    def mean(self, init: str) -> float:
        return statistics.mean(self.scores[init])

    @property
    def tie(self) -> bool:
        return self.margin <= self.spread

    @property
    def too_short(self) -> str | None:
        """Why these runs cannot tell the inits apart (None if they can)."""
        best = self.mean(self.best)
        if self.chance is not None and near_chance(best, self.chance):
            return f"the best init's {best:.2f} is near chance ({self.chance:.2f})"
        means = [self.mean(init) for init in self.scores]
        noise = spread(*self.scores.values())
        if max(means) - min(means) <= noise:
            return f"every init is within the seeds' spread ({noise:.2f}) of every other"
        return None

    @property
    def scale_not_structure(self) -> bool:
        """The control (the structured init's Q/K scale, no structure) ties or beats the structured init, and
        beats PyTorch's plain default beyond the noise: what helps is the scale."""
        if self.control is None or PLAIN not in self.scores:
            return False
        structured, control, plain = (self.scores[i] for i in (self.structured, self.control, PLAIN))
        ties = statistics.mean(control) >= statistics.mean(structured) - spread(structured, control)
        return ties and statistics.mean(control) - statistics.mean(plain) > spread(control, plain)

    def text(self) -> str:
        lines = [f"{'init':<50} {'val top-1':>16}  seeds"]
        for init in sorted(self.scores, key=lambda i: -self.mean(i)):
            values = self.scores[init]
            shown = f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"
            lines.append(f"{init:<50} {shown:>16}  {len(values)}")
        about = f"margin {self.margin:.2f} over {self.runner_up}, seed spread {self.spread:.2f}"
        if self.too_short:
            lines.append(
                f"verdict: too short to tell ({self.too_short}): train longer (--minutes or --epochs) or on more "
                "images before choosing"
            )
        elif self.tie:
            lines.append(f"verdict: a tie ({about}): {self.best} and {self.runner_up} are as good on this data")
        else:
            lines.append(f"verdict: use {self.best} ({about})")
        if self.scale_not_structure and not self.too_short:
            lines.append(
                f"the control {self.control} (the structured init's Q/K scale, no structure) ties or beats "
                f"{self.structured} and beats {PLAIN} beyond the seeds' spread: what helps on this data is the "
                "scale of the Q/K weights, not the convolutional prior"
            )
        return "\n".join(lines)


def verdict(
    scores: dict[str, list[float]], structured: str, control: str | None = None, chance: float | None = None
) -> Verdict:
    """The verdict on each init's validation top-1 per seed (at least two inits, two seeds each)."""
    if len(scores) < 2 or any(len(values) < 2 for values in scores.values()):
        raise ValueError("a verdict needs at least two inits with at least two seeds each")
    ranked = sorted(scores, key=lambda init: -statistics.mean(scores[init]))
    best, runner_up = ranked[:2]
    margin = statistics.mean(scores[best]) - statistics.mean(scores[runner_up])
    return Verdict(
        scores, best, runner_up, margin, spread(scores[best], scores[runner_up]), structured, control, chance
    )
