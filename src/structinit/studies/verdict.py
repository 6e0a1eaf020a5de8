"""The verdict of `structinit choose` on each init's validation top-1 over seeds, at one step of training: the
init to use and its margin against the seed-to-seed spread, only where the runs are evidence (they trained
MIN_STEPS steps, past their warm-up, away from chance, and the margin is worth several validation images);
"too short to tell" otherwise, with why; the inits behind the best beyond the spread, named wherever the runs
are evidence; and "scale, not structure" only where the norm-matched control both ties the structured init and
beats PyTorch's plain default beyond the noise."""

from __future__ import annotations

import dataclasses
import statistics

from .choose_pace import MIN_STEPS

PLAIN = "kaiming"  # the baseline the control is PyTorch's base of
IMAGES_IN_A_MARGIN = 3  # a winner's margin is worth at least this many validation images


def spread(*scores: list[float]) -> float:
    """The seed-to-seed spread of one or more inits: the largest of their standard deviations."""
    return max(statistics.stdev(values) for values in scores)


def near_chance(top1: float, chance: float) -> bool:
    """Within 5 points, or a tenth of the way from chance to 100 %, of chance (top-1 in %)."""
    return top1 < chance + max(5.0, (100 - chance) / 10)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the scores rest on: the optimiser steps every run had trained when they were read, the steps of
    their warm-up, and the validation images each score counts (None: not known)."""

    steps: int
    warmup_steps: int = 0
    images: int | None = None

    @property
    def one_image(self) -> float | None:
        """The points of top-1 one validation image is worth."""
        return 100 / self.images if self.images else None


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
    evidence: Evidence
    chance: float | None = None  # top-1 of a guess (100 / classes), where known

    def mean(self, init: str) -> float:
        return statistics.mean(self.scores[init])

    @property
    def tie(self) -> bool:
        return self.margin <= self.spread

    @property
    def not_evidence(self) -> str | None:
        """Why these runs say nothing of the inits (None if they are evidence): too few steps, in the warm-up,
        or near chance."""
        steps, warmup = self.evidence.steps, self.evidence.warmup_steps
        if steps < MIN_STEPS:
            return f"the runs trained {steps} steps, fewer than the {MIN_STEPS} a verdict needs"
        if steps <= warmup:
            return f"the runs are still in their warm-up ({steps} of its {warmup} steps)"
        best = self.mean(self.best)
        if self.chance is not None and near_chance(best, self.chance):
            return f"the best init's {best:.2f} is near chance ({self.chance:.2f})"
        return None

    @property
    def too_short(self) -> str | None:
        """Why these runs cannot tell the inits apart (None if they can): not evidence, every init within the
        noise of every other, or a lead of fewer than IMAGES_IN_A_MARGIN validation images."""
        if self.not_evidence:
            return self.not_evidence
        means = [self.mean(init) for init in self.scores]
        noise = spread(*self.scores.values())
        if max(means) - min(means) <= noise:
            return f"every init is within the seeds' spread ({noise:.2f}) of every other"
        one = self.evidence.one_image
        if not self.tie and one is not None and self.margin < IMAGES_IN_A_MARGIN * one:
            return (
                f"{self.best}'s margin, {self.margin:.2f}, is {self.margin / one:.1f} validation images (one is "
                f"{one:.2f} points of {self.evidence.images}); a winner needs {IMAGES_IN_A_MARGIN}: hold out more "
                "images (--val-per-class)"
            )
        return None

    @property
    def behind(self) -> list[tuple[str, float]]:
        """The inits behind the best beyond the seeds' spread (the larger of the two inits') and by at least
        IMAGES_IN_A_MARGIN validation images, each with its points under the best, furthest first; none where
        the runs are no evidence."""
        if self.not_evidence:
            return []
        best, least = self.scores[self.best], IMAGES_IN_A_MARGIN * (self.evidence.one_image or 0.0)
        gaps = [(init, self.mean(self.best) - self.mean(init)) for init in self.scores if init != self.best]
        far = [(init, gap) for init, gap in gaps if gap > spread(best, self.scores[init]) and gap >= least]
        return sorted(far, key=lambda item: -item[1])

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
        steps = f"after {self.evidence.steps} steps"
        about = f"by {self.margin:.2f} over {self.runner_up} {steps}, seed spread {self.spread:.2f}"
        if self.too_short:
            lines.append(f"verdict: too short to tell {steps} ({self.too_short})")
        elif self.tie:
            lines.append(
                f"verdict: no winner {steps}: {self.best} led {self.runner_up} by {self.margin:.2f}, within the "
                f"seeds' spread ({self.spread:.2f})"
            )
        else:
            lines.append(f"verdict: use {self.best}: it led {about}")
        if self.behind:
            under = ", ".join(f"{init} {gap:.2f} points under" for init, gap in self.behind)
            lines.append(f"behind {self.best} beyond the seeds' spread: {under}")
        if self.scale_not_structure and not self.too_short:
            lines.append(
                f"the control {self.control} (the structured init's Q/K scale, no structure) ties or beats "
                f"{self.structured} and beats {PLAIN} beyond the seeds' spread: what helped here is the "
                "scale of the Q/K weights, not the convolutional prior"
            )
        return "\n".join(lines)


def verdict(
    scores: dict[str, list[float]],
    structured: str,
    evidence: Evidence,
    control: str | None = None,
    chance: float | None = None,
) -> Verdict:
    """The verdict on each init's validation top-1 per seed (at least two inits, two seeds each), read after
    `evidence.steps` steps of every run."""
    if len(scores) < 2 or any(len(values) < 2 for values in scores.values()):
        raise ValueError("a verdict needs at least two inits with at least two seeds each")
    ranked = sorted(scores, key=lambda init: -statistics.mean(scores[init]))
    best, runner_up = ranked[:2]
    margin = statistics.mean(scores[best]) - statistics.mean(scores[runner_up])
    return Verdict(
        scores, best, runner_up, margin, spread(scores[best], scores[runner_up]), structured, control, evidence, chance
    )
