"""`structinit choose`: which init for the user's own data. A short comparison (the structured init, mimetic
on PyTorch's base, PyTorch's default, timm's own init and the structured init's norm-matched control) on a
validation split carved from the training images, at least two seeds, within a time budget (sized from the
measured pace: choose_pace.py; checked before anything long runs, a one-off solve counted in it, and refused
with what fits: choose_fit.py; kept to as it goes: choose_runs.py), planned in its directory so that it goes
on where it stopped and never pools or reprints another comparison (choose_plan.py), and a verdict that claims
no more than the runs show (verdict.py), kept beside its table (choose_report.py). One `choose` at a time in a
directory."""

from __future__ import annotations

import dataclasses
import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from ..data.datasets import fingerprint
from ..errors import RunError
from ..files import folders_kept_only_if_used, read_json_object, refuse_link
from ..inits.labels import AUTO, label_method, read_label
from ..inits.labels import BASELINES as BASELINE_METHODS
from ..scale import head_qk_norms
from ..training.device import Dist, usable_cores
from ..training.lock import RunLock
from ..training.ownership import replaced_aside
from ..training.recipe import Recipe, data_of
from ..training.settings import TrainConfig
from ..training.startup import batch_for_steps, eval_images, process_batch
from . import choose_pace
from .choose_fit import Budget, sized_to, solve_counted
from .choose_pace import OVERRUN, RESERVE_SECONDS, Pace, warmup_for
from .choose_plan import MAX_BYTES, PLAN_FILE, RERUN, Plan, check_same, read_plan, recipe_of, write_plan
from .choose_report import REPORT_FILES, VERDICT_FILE, Choice, write_report
from .choose_runs import check_trained_on_plan, run_configs_of, scores_at, train_runs
from .grid import check_grid_directory, recover_set_aside, run_dir
from .grid_checks import own_files_of
from .verdict import Evidence, verdict

STRUCTURED = "impulse"  # the paper's text: Q/K alone at its solve's sharpness, on PyTorch's base
BASELINES = ("mimetic[base=kaiming]", "kaiming", "timm")
# the model compared where none is given: the digits' own ViT, else timm's ViT-Ti with a patch that gives
# the images an 8 x 8 grid of tokens or more (models.py)
DIGITS_MODEL, IMAGES_MODEL = "vit_digits", "vit_tiny_fit"
MAX_MINUTES = 1e6  # about two years


def default_model(data: str) -> str:
    return DIGITS_MODEL if data == "digits" else IMAGES_MODEL


def check_structured(label: str) -> str:
    """`label` if it is a structured init (not a baseline, 'auto' or the scale control); ValueError otherwise."""
    read_label(label)  # an unknown method or option: its own error
    method = label_method(label)
    if method in (*BASELINE_METHODS, AUTO, "qk-norm"):
        raise ValueError(
            f"--structured {label}: {method} is not a structured init (it is a baseline or the control choose adds "
            "itself); give impulse, impulse-neurips, impulse-soft or impulse[...]"
        )
    return label


def check_minutes(minutes: float) -> float:
    if not (math.isfinite(minutes) and 0 < minutes <= MAX_MINUTES):
        raise ValueError(f"--minutes must be a finite number > 0 and at most {MAX_MINUTES:,.0f}, got {minutes}")
    return minutes


def check_seeds(seeds: list[int]) -> list[int]:
    """The seeds as a set (sorted): at least two, each once."""
    twice = sorted({s for s in seeds if seeds.count(s) > 1})
    if twice:
        raise ValueError(f"--seeds lists {', '.join(map(str, twice))} twice: each seed once")
    if len(seeds) < 2:
        raise ValueError("--seeds: give at least two, so that a margin can be held against the seed spread")
    return sorted(seeds)


def control_of(config: TrainConfig, data: Any, structured: str) -> tuple[str, float]:
    """The norm-matched control (PyTorch's base with each head's Q/K at the structured init's mean norm), and
    the seconds a run's build of the structured init takes: timed again where the first build took over a
    second, which may have solved and cached what the runs' builds then read (impulse's sharpness)."""
    config = dataclasses.replace(config, init=structured, compile=False)
    started = time.perf_counter()
    recipe = Recipe(config, data, torch.device("cpu"), Dist())
    built = time.perf_counter() - started
    norms = head_qk_norms(recipe.model)
    if built > 1.0:
        started = time.perf_counter()
        Recipe(config, data, torch.device("cpu"), Dist())
        built = time.perf_counter() - started
    return f"qk-norm[norm={sum(norms) / len(norms):.3g},base=kaiming]", built


def batch_for(base: TrainConfig, images: int, fit: bool, say) -> TrainConfig:
    """`base` with a batch that gives at least FEW_STEPS steps an epoch when `fit` (said through `say`);
    ValueError where the batch asked exceeds the training images."""
    batch = min(base.batch_size, batch_for_steps(images))
    if fit and batch < base.batch_size:
        say(f"batch size {batch} (not {base.batch_size}): {images} training images, {images // batch} steps an epoch")
        base = dataclasses.replace(base, batch_size=batch)
    elif base.batch_size > images:
        raise ValueError(
            f"--batch-size {base.batch_size} exceeds the {images} training images: give -b {images} or less, or "
            "leave -b out (choose fits it to the data)"
        )
    process_batch(base, 1, images)  # the trainer's own checks (an odd batch mixup pairs), before the pace is timed
    return base


def validation_size(base: TrainConfig) -> int:
    """Images a class to hold out when none are asked: a fifth of the smallest class, 2 to 100."""
    data = data_of(dataclasses.replace(base, val_per_class=None))
    smallest = int(torch.bincount(data.train_labels).min())
    return max(2, min(100, smallest // 5))


def choose(
    base: TrainConfig,
    minutes: float,
    seeds: list[int],
    out: str | Path,
    structured: str = STRUCTURED,
    parallel: int = 1,
    epochs: int | None = None,
    fit_batch: bool = True,
    say=print,
    rerun: bool = False,
    started: float | None = None,
    show: bool = True,
) -> Choice:
    """Compare the inits into `out` within `minutes` from `started` (time.monotonic(); default: now), or for
    `epochs` where given, on a validation split of base.val_per_class images a class (validation_size's
    where None), and give the verdict. A comparison already in `out` goes on as planned when asked again with
    the same flags on the same data, and is refused otherwise; `rerun`: compare again from scratch (what it
    replaces is deleted once the new plan is written); `fit_batch`: batch_for's; `show`: a bar over the epochs."""
    started = time.monotonic() if started is None else started
    check_minutes(minutes)
    seeds, out = check_seeds(list(seeds)), Path(out)
    check_structured(structured)
    if parallel < 1:
        raise ValueError(f"--parallel must be >= 1, got {parallel}")
    if base.cooldown_epochs:
        raise ValueError(
            "--cooldown-epochs: choose sizes every run's epochs to its budget, the lr decaying over them; leave the "
            "cool-down to the run you train after it"
        )
    check_grid_directory(out)
    refuse_link(out / VERDICT_FILE)
    with folders_kept_only_if_used(out), RunLock(out, "choose"):
        recover_set_aside(out)
        sizing = (minutes, epochs, started, parallel)
        return _choose(base, seeds, out, structured, sizing, fit_batch, say, rerun, show)


def _choose(base, seeds, out, structured, sizing, fit_batch, say, rerun, show) -> Choice:
    minutes, epochs, started, parallel = sizing
    # the runs are sized to end by the budget, less the reserve; they may run on past it by OVERRUN of it
    deadline = None if epochs is not None else started + minutes * 60 * (1 + OVERRUN) - RESERVE_SECONDS
    loading = time.perf_counter()
    base = dataclasses.replace(base, eval_every=1, eval_per_class=None, quiet=True)
    if not base.val_per_class:
        base = dataclasses.replace(base, val_per_class=validation_size(base))
    data = data_of(base)
    loading = time.perf_counter() - loading
    base = batch_for(base, len(data.train_labels), fit_batch, say)
    plan = _plan(out, base, data, structured, seeds, (minutes, epochs, started, parallel, loading), rerun, say)
    config = dataclasses.replace(base, epochs=plan.epochs, warmup_epochs=warmup_for(base, plan.epochs))
    say(f"model: {plan.model}; {plan.threads} torch thread(s) a run, the fastest here now")
    say(
        f"comparing {', '.join(plan.inits)} x seeds {','.join(map(str, plan.seeds))}: {plan.epochs} epochs a run, "
        f"{plan.epochs * plan.steps} steps at batch {config.batch_size}"
        + (f" (sized to {plan.minutes:g} minutes)" if plan.minutes is not None else "")
        + f", into {out}"
    )
    configs = run_configs_of(plan, config, out)
    check_trained_on_plan(plan, configs, out)  # runs of a previous call
    epoch = train_runs(plan, configs, out, parallel, deadline, Pace(*plan.pace), show)
    check_trained_on_plan(plan, configs, out)  # images replaced while they trained
    result = None
    if epoch > 0:
        evidence = Evidence(
            epoch * plan.steps, math.ceil(config.warmup_epochs * plan.steps), eval_images(data, config.eval_split)
        )
        scores = scores_at(configs, epoch)
        result = verdict(scores, plan.structured, evidence, plan.control, chance=100 / data.num_classes)
    choice = Choice(result, epoch, [], config, plan)
    return dataclasses.replace(choice, rows=write_report(out, configs, choice))


def _plan(out: Path, base: TrainConfig, data: Any, structured: str, seeds: list[int], sizing, rerun: bool, say):
    """The comparison's plan: the one in `out` if it is the comparison asked, else (where `out` holds none, or
    `rerun` replaces it) a new one, sized to the budget from the pace measured here. What `rerun` replaces is
    deleted only once the new plan is written (replaced_aside): a refusal before then leaves `out` as it was."""
    minutes, epochs, started, parallel, loading = sizing
    try:
        plan = read_plan(out)
    except RunError:
        if not rerun or not os.path.lexists(out / PLAN_FILE):  # no plan: the runs are another grid's
            raise
        plan = None
    asked = dict(
        seeds=seeds, structured=structured, per_class=base.per_class, val_per_class=base.val_per_class,
        batch_size=base.batch_size, recipe=recipe_of(base), data=fingerprint(data),
        minutes=None if epochs is not None else minutes,
    )  # fmt: skip
    if plan is not None and not rerun:
        now = dataclasses.replace(
            plan, **asked, epochs=epochs or plan.epochs, steps=len(data.train_labels) // base.batch_size
        )
        check_same(plan, now, out / PLAN_FILE)
        say(f"going on with the comparison planned in {out / PLAN_FILE}")
        return plan
    timing, model, threads = choose_pace.measure(base, data, loading)
    threads = threads if parallel == 1 else max(1, usable_cores() // parallel)
    counts = [int(n) for n in torch.bincount(data.train_labels) if n > 0]
    budget = Budget(
        minutes, started, len(BASELINES) + 2, seeds, parallel, base, counts, eval_images(data, base.eval_split)
    )
    if epochs is None:
        sized_to(budget, timing)  # refused before the structured init is built where the runs alone do not fit
    with solve_counted(lambda seconds: sized_to(budget, timing, seconds)) if epochs is None else nullcontext():
        control, building = control_of(base, data, structured)  # a one-off solve: counted in the budget first
    timing = dataclasses.replace(timing, setup=timing.setup + max(0.0, building - timing.built))
    pace, steps = budget.pace(timing)  # K runs at once share the cores
    plan = Plan(
        inits=[structured, *BASELINES, control],
        epochs=epochs or sized_to(budget, timing),
        control=control,
        steps=steps,
        model=model,
        threads=threads,
        pace=list(dataclasses.astuple(pace)),
        **asked,
    )
    with replaced_aside(out, _replaced_by(out, plan) if rerun else []):
        write_plan(out, plan)
    return plan


def _replaced_by(out: Path, plan: Plan) -> list[list[Path]]:
    """What `plan`, asked with --rerun, replaces in `out`, checked before anything moves (grid_checks.own_files_of):
    the plan and results there, and the own files of the runs the plan there names and of those `plan` trains
    into; a folder no plan names (a user's own run) is left as it is."""
    refuse_link(out / PLAN_FILE)
    runs = [*_planned_runs(out), *(run_dir(out, plan.per_class, i, s) for i in plan.inits for s in plan.seeds)]
    files = [out / name for name in (PLAN_FILE, *REPORT_FILES) if (out / name).exists()]
    return [files, *own_files_of(list(dict.fromkeys(runs)), out)]


def _planned_runs(out: Path) -> list[Path]:
    """The run folders the plan in `out` names (its inits x seeds), read leniently: a plan damaged elsewhere (or
    of 0.4.0) still names its runs where its inits, seeds and per_class are well formed; none otherwise."""
    try:
        record = read_json_object(out / PLAN_FILE, RERUN, MAX_BYTES)
    except (RunError, OSError):
        return []
    inits, seeds, per_class = record.get("inits"), record.get("seeds"), record.get("per_class")
    if not (isinstance(inits, list) and all(isinstance(i, str) for i in inits)):
        return []
    if not (isinstance(seeds, list) and all(type(s) is int for s in seeds)):
        return []
    if per_class is not None and not (type(per_class) is int and per_class >= 1):
        return []
    return [run_dir(out, per_class, init, seed) for init in inits for seed in seeds]
