"""The regime study: the paper's method measured where the paper claims it works.

The 64-token convergence protocol (docs/studies/convergence.md) does not reproduce the published ordering of
the baselines (mimetic ties timm's init there, 2-4 points above it in two papers), so it cannot tell
whether a locality prior helps. This study first finds a regime on a 2-core CPU that does, then
compares the inits in it and takes the impulse bundle apart (docs/studies/regimes.md):

    .venv/bin/python benchmarks/study_regimes.py --part calibrate   # baselines on a validation split
    .venv/bin/python benchmarks/study_regimes.py --part compare     # the inits, 3 seeds, test set
    .venv/bin/python benchmarks/study_regimes.py --part ablate      # the bundle, one part at a time
    .venv/bin/python benchmarks/study_regimes.py --part search      # settings of impulse, validation split
    .venv/bin/python benchmarks/study_regimes.py --part docs        # docs/regimes.csv and tables
    .venv/bin/python benchmarks/study_regimes.py --smoke --out /tmp/regimes   # the pipeline, ~2 min on 2 cores
    .venv/bin/python benchmarks/study_regimes.py --part sizing      # why this model: img/s (idle machine)

Calibration. A regime qualifies when, on its validation split (2 seeds), mimetic on the authors' base
(`mimetic[base=kaiming]`, the mimetic of the published tables) is at least 1.5 points above `kaiming`
(PyTorch's default init, the authors' baseline) and 1 point above timm's init. Candidates follow the
knobs the literature points to: 256 tokens (patch 2 at 32 px), the paper's v1 ViT (global average
pooling, fixed 2-D sin-cos position table), more images per class; each fits about an hour of a
2-core CPU per run. They are tried in order, and the first that qualifies is the comparison's.

Every finished run's row goes to docs/regimes-runs.jsonl (the ledger the docs are made from; a run it
holds is not trained again, one from another recipe is refused): commit it as runs finish. Runs use
bf16 autocast where the CPU has it (`amp: auto`), which every row records.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import statistics
import sys
import time
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

from structinit.cachefiles import keep, read_kept
from structinit.inits.labels import BUNDLE, label_before
from structinit.scale import head_qk_norms
from structinit.schema import Schema, listing, number, problem
from structinit.studies.grid import run_configs, run_dir
from structinit.studies.ledger import (
    check_outputs,
    is_recorded,
    ledger_and_runs,
    one_line_refusals,
    read_ledger,
    study_docs,
    write_csv,
    write_generated_section,
    write_ledger,
)
from structinit.studies.results import epochs_to_reach
from structinit.studies.tables import results_markdown
from structinit.training import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
LEDGER = "regimes-runs.jsonl"
PAGE = Path("studies") / "regimes.md"  # the study's page, under --docs
ATTENTION_CACHE = "regimes-attention.json"  # the attention-at-init table's measurements, by weights


@dataclasses.dataclass(frozen=True)
class Regime:
    """A model, a data size and a recipe: what one row of the "which init for which regime" table means."""

    model: str
    model_kwargs: dict[str, Any]
    per_class: int
    epochs: int
    batch_size: int
    lr: float
    warmup: float  # fraction of the run
    preset: str = "cpu-quick"  # crop + flip, label smoothing 0.1, AdamW, weight decay 0.05
    val_per_class: int = 250
    eval_every: int = 4
    tokens: int = 256

    def config(self, init: str, seed: int, val: bool, data: str, out: Path, smoke: bool) -> TrainConfig:
        epochs = 2 if smoke else self.epochs
        return TrainConfig.from_preset(
            self.preset,
            data=data,
            model=self.model,
            model_kwargs={**self.model_kwargs, **({"depth": 1} if smoke else {})},
            per_class=self.per_class,
            val_per_class=(2 if smoke else self.val_per_class) if val else None,
            init=init,
            seed=seed,
            epochs=epochs,
            batch_size=4 if smoke else self.batch_size,
            lr=self.lr,
            warmup_epochs=round(self.warmup * epochs, 2),
            eval_every=1 if smoke else self.eval_every,
            eval_batch_size=250,
            amp="auto",
            quiet=True,
            out=str(out),
        )


# The paper's v1 ViT (Table 5/7: patch 2 at 32 px = 256 tokens, GAP, sin-cos) at the width a 2-core
# CPU trains: width 96, depth 6, 6 heads of dimension 16 (64 img/s of training on a 2-core AMD EPYC
# with AVX-512, bf16, batch 128; width 64 / depth 8 / 8 heads: 46). 500 images per class, 40 epochs
# at batch 64 (~3,100 steps, as the 64-token protocol), lr 1e-3 at batch 128 scaled to 5e-4.
REGIMES: dict[str, Regime] = {
    "p2-w96-d6-500": Regime("vit_w96_d6_p2_gap_sincos", {}, 500, 40, 64, 5e-4, 0.05),
}
# The default rule's guard (docs/studies/default-rule.md): the calibrated regime's model and recipe with a
# learned position embedding and a class token (timm's ViT), as most users' ViTs have; test set, 3 seeds.
LEARNED = {"pos_embed": "learn", "class_token": True, "global_pool": "token"}
REGIMES["p2-w96-d6-500-learned"] = dataclasses.replace(REGIMES["p2-w96-d6-500"], model_kwargs=LEARNED, tokens=257)
GUARD_INITS = ["impulse", "mimetic[base=kaiming]", "kaiming", "timm"]  # impulse: the paper's text
# Calibrated in turn: the next candidate joins the list (REGIMES defines it) once the last one's verdict
# is "no"; candidates already run stay, so their rows stay in the docs.
CANDIDATES = ["p2-w96-d6-500"]
CALIBRATION_INITS = ["kaiming", "timm", "mimetic[base=kaiming]"]
CALIBRATION_SEEDS = [0, 1]
MIMETIC_OVER_KAIMING, MIMETIC_OVER_TIMM = 1.5, 1.0
SMOKE_REGIME = Regime("vit_w96_d6_p2_gap_sincos", {}, 4, 2, 4, 5e-4, 0.05)
SMOKE_LEARNED = dataclasses.replace(SMOKE_REGIME, model_kwargs=LEARNED, tokens=257)
# The regime of the comparison: set by hand to the first candidate whose calibration reads "yes" (or, if
# none does within the budget, to the closest one, and docs/studies/regimes.md says so). None: not decided yet.
CALIBRATED: str | None = "p2-w96-d6-500"  # calibrated: docs/studies/regimes.md
SEEDS = [0, 1, 2]
MIMETIC = "mimetic[base=kaiming]"  # the mimetic of the published tables (the authors' code, their base)
# `impulse` before structinit 0.3: sharp, x18, V/proj mimetic
BUNDLE = BUNDLE
# The search's choice, set by hand (docs/studies/regimes.md): the candidates that cleared `kaiming` on the
# validation split; each joins the comparison (test set, 3 seeds) as "the best setting found".
SEARCH_CHOICE: list[str] = ["impulse[vproj=keep,base=kaiming,target_fidelity=0.09,pos_scale=18.0]"]  # val 61.52, seed 0
# the soft settings' norm-matched controls (each head's Q/K at the setting's norm at init, on its base, no
# structure), on the test set: does a lead over the base come from the structure or from the Q/K scale?
SOFT_CONTROLS: list[str] = ["qk-norm[norm=2.8,base=kaiming]", "qk-norm[norm=4.0]"]  # SEARCH_CHOICE's, impulse-soft's


# the data-free inits published since the paper (inits/rivals.py), last: the GPU queue trains them (issue 69)
RIVALS = ["conditioned", "sinusoidal", "mimetic-vo"]


def main_inits(control_norm: float) -> list[str]:
    """The comparison: the authors' baseline, timm's, mimetic, the paper's impulse (on timm's base, and the
    authors' own code on theirs), the 64-token soft setting, and the bundle without its structure at
    the impulse init's own per-head Q/K norm; the search's choice; the soft settings' norm-matched
    controls. Listed in the order they train within a seed: the paper's method (and the best setting
    found) and the baselines it must beat first, so that a partial grid answers the main question."""
    others = [MIMETIC, "kaiming", "timm", control(control_norm), "impulse-neurips", "impulse-soft"]
    return [BUNDLE, *SEARCH_CHOICE, *others, *SOFT_CONTROLS, *RIVALS]


def control(norm: float) -> str:
    return f"qk-norm[norm={norm},pos_scale=18,vproj=mimetic]"


def bundle_parts(control_norm: float) -> dict[str, str]:
    """The paper's bundle, one part at a time: part -> the label that sets it alone (on the model's base).
    The position-embedding part does nothing to a fixed sin-cos table; it runs all the same (a check
    that it is a no-op there)."""
    return {
        "the impulse Q/K": "impulse[pos_scale=None,vproj=keep]",  # as first run (structinit 0.2): on_base
        "the position-embedding scale (x18)": "qk-norm[norm=None,pos_scale=18]",
        "the V/proj form (mimetic)": "qk-norm[norm=None,vproj=mimetic]",
        f"the Q/K norm ({control_norm})": f"qk-norm[norm={control_norm}]",
    }


# Settings of the paper's init that keep its impulse in every layer on images, where the bundle keeps it
# in layer 0 only (docs/studies/regimes.md, "Attention at init"): chosen among on the validation split, seed 0,
# against the calibration's baselines there; the best goes to the test set as "the best setting found".
SEARCH_INITS = [
    # the Q/K alone: 0.81-0.83 on the offset in every layer at init
    "impulse[vproj=keep,target_fidelity=0.98,pos_scale=18.0,base=keep]",
    "impulse[vproj=keep,target_fidelity=0.7,pos_scale=18.0,base=keep]",  # softer maps: 0.47-0.52
    # the bundle, each layer solved on the previous block's output
    "impulse[propagate=True,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
    "impulse[vproj=keep,base=kaiming,target_fidelity=0.98,pos_scale=18.0]",  # the Q/K alone on the authors' base
    # the init of the code behind the paper's sin-cos tables (structured_init@9c2d0e0): Q/K alone, on PyTorch's
    # base, as soft as that code's solve makes them on this model (0.088 on the pseudo input: iclr_impulse.py)
    "impulse[vproj=keep,base=kaiming,target_fidelity=0.09,pos_scale=18.0]",
    # the control of the search's choice: its per-head Q/K norm (2.8 in docs' attention-at-init table; kaiming 2.3),
    # same base, no structure: does the choice's lead over kaiming come from its prior or a 20 % larger Q/K?
    "qk-norm[norm=2.8,base=kaiming]",
]

BASES = {"timm": "timm", "kaiming": "kaiming"}  # base option -> the plain init of that base


def on_base(label: str, base: str) -> str:
    """A part of the bundle on `base`, named as its ledger rows are: the label it was first run with
    (structinit 0.2) as it is written now (labels.label_before)."""
    return label_before(f"{label[:-1]},base={base}]")


def ablation_inits(control_norm: float) -> list[str]:
    """Each part of the bundle alone, on timm's base and on the authors' (PyTorch's defaults)."""
    return [on_base(label, base) for base in BASES for label in bundle_parts(control_norm).values()]


def close_parts(control_norm: float) -> list[str]:
    """The ablations whose seed-0 runs are within a seed's spread of each other, which a second seed
    decides between (the issue: one seed each, two where close): on timm's base, the impulse Q/K alone
    (57.06) against the Q/K norm alone (57.55): is the Q/K's gain there its structure or its norm?"""
    return [
        on_base(bundle_parts(control_norm)["the impulse Q/K"], "timm"),
        on_base(f"qk-norm[norm={control_norm}]", "timm"),
    ]


def repeats_its_base(regime: Regime, data: str, control_norm: float) -> frozenset[str]:
    """The ablation labels that initialise the regime's model (seed 0) bit for bit as their base's plain
    init does: their run would repeat the base's, so it is not trained (the position-embedding scale on
    a fixed sin-cos table). Once per process: each label builds the model."""
    import torch

    from structinit.training.recipe import model_of

    def weights(label: str) -> dict[str, Any]:
        config = regime.config(label, 0, False, data, Path("unused"), False)
        return model_of(config, dataset(data))[0].state_dict()

    key = (repr(regime), data, control_norm)
    if key not in _REPEATS:
        same = set()
        for base, plain in BASES.items():
            reference = weights(plain)
            for label in bundle_parts(control_norm).values():
                ours = weights(on_base(label, base))
                if all(torch.equal(ours[k], reference[k]) for k in reference):
                    same.add(on_base(label, base))
        _REPEATS[key] = frozenset(same)
    return _REPEATS[key]


_REPEATS: dict[tuple, frozenset[str]] = {}  # repeats_its_base's answers, by regime, data and control norm


def bundle_table(
    rows: list[dict[str, Any]], grid: str, control_norm: float, repeats: AbstractSet[str] = frozenset()
) -> str:
    """Which part of the bundle carries the gain: each part alone minus its base's plain init, seed 0 of
    the test grid (empty until a part has run); a part in `repeats` (its init is its base's) reads the
    base's run, marked."""
    top1 = {r["init"]: r["top1"] for r in rows if r["grid"] == grid and r["seed"] == 0}
    lines = [
        "| part alone | on timm's base | minus timm | on PyTorch's (kaiming) | minus kaiming |",
        "|---|---|---|---|---|",
    ]
    for part, label in bundle_parts(control_norm).items():
        cells = []
        for base, plain in BASES.items():
            theirs, repeat = top1.get(plain), on_base(label, base) in repeats
            ours = theirs if repeat else top1.get(on_base(label, base))
            cells.append("-" if ours is None else f"{ours:.2f}" + (" (its base's init: its run)" if repeat else ""))
            cells.append("-" if ours is None or theirs is None else f"{ours - theirs:+.2f}")
        if any(c != "-" for c in cells):
            lines.append(f"| {part} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


@functools.cache
def dataset(spec: str):
    """The data of a --data spec, loaded once per process (the norm and the entropies read it)."""
    from structinit.data.datasets import load_data

    return load_data(spec)


def matched_norm(regime: Regime, data: str) -> float:
    """The impulse init's mean per-head Frobenius norm of W_q and W_k on the regime's model (seed 0),
    rounded to 0.1: the norm of the control that has its scale and not its structure."""
    from structinit.training.recipe import model_of

    config = regime.config(BUNDLE, 0, False, data, Path("unused"), False)
    model, _ = model_of(config, dataset(data))
    return round(statistics.mean(head_qk_norms(model)), 1)


@dataclasses.dataclass(frozen=True)
class Grid:
    """Runs of one regime: every init x seed, on the validation split or the test set."""

    regime: str
    inits: list[str]
    seeds: list[int]
    val: bool

    @property
    def name(self) -> str:
        return self.regime + ("-val" if self.val else "")


def calibration_grids(regimes: list[str]) -> list[Grid]:
    return [Grid(name, CALIBRATION_INITS, CALIBRATION_SEEDS, val=True) for name in regimes]


def calibration(rows: list[dict[str, Any]], regimes: dict[str, Regime]) -> str:
    """Per candidate regime, the baselines' seed means on the validation split and whether mimetic (on
    the authors' base) clears kaiming + 1.5 and timm + 1; 'pending' until both seeds of all three ran."""
    lines = [
        "| regime | model | tokens | per class | epochs | kaiming | timm | mimetic (authors' base) "
        "| mimetic − kaiming | mimetic − timm | calibrated |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, regime in regimes.items():
        grid = [r for r in rows if r["grid"] == f"{name}-val"]
        runs = {i: [r["top1"] for r in grid if r["init"] == i] for i in CALIBRATION_INITS}
        if not any(runs.values()):
            continue
        means = {i: statistics.mean(v) if v else float("nan") for i, v in runs.items()}
        kaiming, timm, mimetic = (means[i] for i in CALIBRATION_INITS)
        done = min(len(v) for v in runs.values())
        if done < len(CALIBRATION_SEEDS):
            verdict = f"pending ({sum(map(len, runs.values()))}/{len(CALIBRATION_SEEDS) * 3} runs)"
        else:
            met = mimetic >= kaiming + MIMETIC_OVER_KAIMING and mimetic >= timm + MIMETIC_OVER_TIMM
            verdict = "**yes**" if met else "no"

        def cell(values: list[float]) -> str:
            return " / ".join(f"{v:.2f}" for v in values) or "-"

        seeds = " | ".join(cell(runs[i]) for i in CALIBRATION_INITS)
        lines.append(
            f"| {name} | {regime.model} | {regime.tokens} | {regime.per_class} | {regime.epochs} | {seeds} "
            f"| {gap(mimetic, kaiming)} | {gap(mimetic, timm)} | {verdict} |"
        )
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def gap(a: float, b: float) -> str:
    """a - b as '+1.23', '-' while either has no runs (NaN)."""
    return "-" if a != a or b != b else f"{a - b:+.2f}"


CSV_COLUMNS = [
    "regime",
    "dataset",
    "model",
    "tokens",
    "per_class",
    "recipe",
    "init",
    "seed",
    "epochs",
    "steps",
    "split",
    "final_top1",
    "best_top1",
    "epochs_to_baseline",
    "device",
    "precision",
]


def csv_rows(rows: list[dict[str, Any]], regimes: dict[str, Regime]) -> list[dict[str, Any]]:
    """docs/regimes.csv: one row per run; epochs_to_baseline is the epochs to reach the better of timm's
    and kaiming's mean final top-1 over seeds in the same grid (a seed run again, on another GPU, counts
    once: its runs' mean; empty: never, or no baseline ran). A row that carries its tokens (the GPU
    cell's) is not one of `regimes`."""
    finals: dict[tuple[str, str], dict[int, list[float]]] = {}  # (grid, baseline) -> seed -> its runs' top-1
    for r in rows:
        if r["init"] in ("timm", "kaiming"):
            finals.setdefault((r["grid"], r["init"]), {}).setdefault(r["seed"], []).append(r["top1"])
    targets: dict[str, float] = {}
    for (grid, _), by_seed in finals.items():
        mean = statistics.mean(statistics.mean(tops) for tops in by_seed.values())
        targets[grid] = max(mean, targets.get(grid, mean))
    out = []
    for r in rows:
        target = targets.get(r["grid"])
        reached = epochs_to_reach(r["curve"], target) if target is not None and r["curve"] else None
        out.append(
            {
                **r,
                "regime": r["grid"].removesuffix("-val"),
                "tokens": r["tokens"] if "tokens" in r else regimes[r["grid"].removesuffix("-val")].tokens,
                "final_top1": r["top1"],
                "epochs_to_baseline": "" if reached is None else reached,
            }
        )
    return out


def table5_rows(folder: Path) -> list[dict[str, Any]]:
    """The GPU Table 5 cell's runs (gpu_table5.py's OUTs, folder/<run>/) as rows of a grid "table5": all of
    CIFAR-10, the cell's model and recipe, the test set."""
    runs = sorted(summary.parent for summary in folder.glob("*/summary.json"))
    if not runs:
        return []
    from gpu_table5 import MODEL, read_run  # a script beside this one

    cell = {"grid": "table5", "dataset": "cifar10", "model": MODEL, "tokens": 256, "per_class": 5000}
    return [{**row, **cell, "recipe": "table5", "split": "test"} for run in runs for row in read_run(run)]


def init_attention(inits: list[str], regime: Regime, data: str, smoke: bool, cache: Path) -> str:
    """A table of what each init's attention does at init (seed 0) on 256 test images: its entropy (over
    log T: 1 uniform, 0 one-hot), the mass on each head's best 3x3 offset on the pseudo input and on the
    images (per layer, and their mean; chance is 1/T), and the mean per-head Q/K Frobenius norm.

    The measurements are kept in `cache` (JSON) under the digest of the initialised weights and the data
    spec: an init is measured again only when its weights change (the measurement code is assumed fixed:
    delete the file after changing it)."""
    from structinit.data.batches import normalised_test_images
    from structinit.files import weights_sha256
    from structinit.training.recipe import model_of

    loaded = dataset(data)
    known = kept_attention(cache)
    kept = {}
    lines = list(ATTENTION_HEADER)
    for init in inits:
        model, _ = model_of(regime.config(init, 0, False, data, Path("unused"), smoke), loaded)
        model.eval()
        key = hashlib.sha256(f"{weights_sha256(model.state_dict())} {data}".encode()).hexdigest()
        if key not in known:
            known[key] = attention_at_init(model, normalised_test_images(model, loaded, 256))
        kept[key] = known[key]
        lines.append(attention_row(init, known[key]))
    why = keep(cache, kept)  # only this table's: no stale entries
    if why:
        print(f"study_regimes.py: note: {why}: the table is measured again next time", file=sys.stderr)
    return "\n".join(lines) + "\n"


ATTENTION_CACHE_BYTES = 1 << 20  # ~400 bytes an init
MEASURES = Schema(
    {
        **dict.fromkeys(("entropy", "pseudo", "images", "qk_norm"), number(0)),
        "images_per_layer": listing(number(0), at_least=1),
    }
)


def kept_attention(cache: Path) -> dict[str, dict[str, Any]]:
    """The measurements kept in `cache` (cachefiles.read_kept: a regular file, bounded), by key, those well formed
    only; a file the table could not have written is said in one line, and its inits measured again."""
    known, why = read_kept(cache, ATTENTION_CACHE_BYTES)
    if why is None and known is not None and not isinstance(known, dict):
        why = f"{cache} is not a JSON object"
    if why:
        print(f"study_regimes.py: note: {why}: the attention at init is measured again", file=sys.stderr)
    known = known if isinstance(known, dict) else {}
    return {key: measures for key, measures in known.items() if problem(measures, MEASURES) is None}


ATTENTION_HEADER = (
    "| init | entropy | best-offset mass, pseudo input | on images, per layer | on images, mean | Q/K norm |",
    "|---|---|---|---|---|---|",
)


def attention_row(init: str, m: dict[str, Any]) -> str:
    """A row of the attention-at-init table from attention_at_init's measurements, rounded."""
    layers = " ".join(f"{x:.2f}" for x in m["images_per_layer"])
    return f"| {init} | {m['entropy']:.3f} | {m['pseudo']:.3f} | {layers} | {m['images']:.3f} | {m['qk_norm']:.1f} |"


def attention_at_init(model, images) -> dict[str, Any]:
    """One row of the attention-at-init table, unrounded (what the cache keeps)."""
    from structinit.measure import attention_entropy, fidelity

    real = fidelity(model, images)
    return {
        "entropy": attention_entropy(model, images),
        "pseudo": fidelity(model).mean_fidelity,
        "images_per_layer": [statistics.mean(h.fidelity for h in layer.heads) for layer in real.layers],
        "images": real.mean_fidelity,
        "qk_norm": statistics.mean(head_qk_norms(model)),
    }


def write_docs(
    rows: list[dict[str, Any]], docs: Path, regimes: dict[str, Regime], data: str, smoke: bool, bundle: tuple | None
) -> None:
    """The ledger, docs/regimes.csv, a curves figure per grid and the generated tables of docs/studies/regimes.md;
    `bundle`: (the comparison's grid, the control's norm) once a regime is calibrated."""
    from structinit.studies.plots import plot_curves

    figures = docs / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    write_ledger(docs / LEDGER, rows)
    write_csv(docs / "regimes.csv", CSV_COLUMNS, csv_rows(rows + table5_rows(docs / "table5"), regimes))
    sections = []
    for name in dict.fromkeys(r["grid"] for r in rows):
        grid_rows = [r for r in rows if r["grid"] == name]
        plot_curves(grid_rows, figures / f"regimes-{name}.png")
        figure = f"![curves of {name}](../figures/regimes-{name}.png)"
        regime = regimes[name.removesuffix("-val")]
        sections.append(f"### {name}\n\n{results_markdown(grid_rows, wide=True)}\n{figure}\n")
    hours = sum(r["wall_secs"] for r in rows) / 3600
    table = calibration(rows, regimes)
    parts = bundle_table(rows, *bundle) if bundle else ""
    at_init = ""
    if bundle:  # every init of the comparison and the ablation, run or not: what each does at init
        regime, norm = regimes[bundle[0]], bundle[1]
        inits = list(dict.fromkeys([*main_inits(norm), *ablation_inits(norm), *SEARCH_INITS]))
        chance = f"{regime.tokens} tokens: chance is {1 / regime.tokens:.4f}"
        attention = init_attention(inits, regime, data, smoke, docs / ATTENTION_CACHE)
        heading = f"### Attention at init\n\nSeed 0, on the {bundle[0]} model, 256 test images ({chance}):"
        at_init = f"{heading}\n\n{attention}\n"
    body = (
        f"Finished runs: {len(rows)}, {hours:.1f} h of run wall-clock.\n\n"
        + (f"### Calibration\n\nThe baselines on the validation split (seed 0 / seed 1):\n\n{table}\n" if table else "")
        + (f"### The bundle, one part at a time\n\nSeed 0, test set:\n\n{parts}\n" if parts else "")
        + at_init
        + ("\n".join(sections) or "No finished runs yet.\n")
    )
    (docs / PAGE).parent.mkdir(parents=True, exist_ok=True)
    write_generated_section(docs / PAGE, body, "benchmarks/study_regimes.py")


def unfinished(grids: list[Grid], regimes: dict[str, Regime], data: str, out: Path, docs: Path, smoke: bool):
    """The TrainConfigs of the grids' runs that the ledger lacks, seed-major (a partial run answers every
    init for the first seed)."""
    ledger = read_ledger(docs / LEDGER)
    runs = sorted(
        ((seed, i, k) for k, g in enumerate(grids) for seed in g.seeds for i in range(len(g.inits))),
    )
    todo = []
    for seed, i, k in runs:
        grid, init = grids[k], grids[k].inits[i]
        regime = regimes[grid.regime]
        folder = run_dir(out / grid.name, regime.per_class, init, seed)
        config = regime.config(init, seed, grid.val, data, folder, smoke)
        if not is_recorded(ledger, (grid.name, regime.per_class, init, seed), config, docs / LEDGER):
            todo.append(config)
    return todo, len(runs)


def rows_of(out: Path, grids: list[Grid], regimes: dict[str, Regime], docs: Path) -> list[dict[str, Any]]:
    cells = [(g.name, regimes[g.regime].per_class) for g in grids]
    return ledger_and_runs(read_ledger(docs / LEDGER), out, cells, {g.name: g.regime for g in grids})


# (width, depth, heads, patch) of the sizes the candidates were chosen among: 256 tokens at patch 2
SIZES = [(64, 8, 8, 2), (96, 6, 6, 2), (128, 6, 8, 2), (64, 6, 4, 2), (192, 6, 3, 4)]


def sizing(steps: int = 10) -> None:
    """Training img/s of the v1 ViT (GAP, sin-cos) at each size: bf16 autocast where the CPU has it, batch
    128, all cores, math attention as the trainer picks it on a CPU (idle machine)."""
    import os
    import platform

    import torch

    from structinit.models import create_model
    from structinit.training.device import prefer_math_attention, resolve_amp

    amp = resolve_amp("auto", torch.device("cpu"))
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} cores, autocast {amp}\n")
    print("| width | depth | heads | patch | tokens | img/s |\n|---|---|---|---|---|---|")
    for width, depth, heads, patch in SIZES:
        kwargs = dict(patch_size=patch, embed_dim=width, depth=depth, num_heads=heads)
        model = create_model("vit_w96_d6_p2_gap_sincos", num_classes=10, in_chans=3, data_size=32, **kwargs)
        prefer_math_attention(model, torch.device("cpu"), amp)
        optimizer = torch.optim.AdamW(model.parameters(), 1e-3)
        images, labels = torch.randn(128, 3, 32, 32), torch.randint(0, 10, (128,))
        for i in range(3 + steps):
            if i == 3:
                start = time.perf_counter()
            with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
                loss = torch.nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        rate = steps * 128 / (time.perf_counter() - start)
        print(f"| {width} | {depth} | {heads} | {patch} | {(32 // patch) ** 2} | {rate:.0f} |", flush=True)


def outputs(regimes: dict[str, Regime]) -> list[Path]:
    """The files the study writes under its docs (checked before it builds a model: check_outputs); a grid's
    figure is named by its regime, on the test set or the validation split."""
    figures = [Path("figures", f"regimes-{name}{val}.png") for name in regimes for val in ("", "-val")]
    return [Path(LEDGER), Path("regimes.csv"), PAGE, Path(ATTENTION_CACHE), *figures]


def study_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="cifar10:../shared/datasets/cifar10", help="structinit --data spec")
    parts = ["calibrate", "compare", "ablate", "search", "guard", "docs", "sizing"]
    parser.add_argument("--part", choices=parts, default="calibrate")
    parser.add_argument("--out", default="runs/regimes", help="run directories (resumable)")
    parser.add_argument("--docs", default=None, help="where the docs go (default docs/; with --smoke, OUT/docs)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process each")
    parser.add_argument(
        "--threads", type=int, help="torch threads a run (default: the cores shared among --jobs; runs so far: 1)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny model and subsets, 2 epochs: checks the pipeline")
    parser.add_argument("--only", nargs="+", metavar="INIT", help="train only the runs of these init labels (exact)")
    return parser


@one_line_refusals("study_regimes.py")
def main(argv: list[str] | None = None) -> int:
    parser = study_parser()
    args = parser.parse_args(argv)
    if args.part == "sizing":
        sizing()
        return 0
    out = Path(args.out)
    docs = study_docs(out, args, ROOT / "docs", Path(__file__).name)
    regimes = {"smoke": SMOKE_REGIME, "smoke-learned": SMOKE_LEARNED} if args.smoke else REGIMES
    check_outputs(docs, outputs(regimes))
    learned = "smoke-learned" if args.smoke else "p2-w96-d6-500-learned"
    guard = [Grid(learned, GUARD_INITS, SEEDS[:1] if args.smoke else SEEDS, val=False)]
    chosen = "smoke" if args.smoke else CALIBRATED
    calibrating = calibration_grids(["smoke"] if args.smoke else CANDIDATES)
    comparison: list[Grid] = []
    ablations: list[Grid] = []
    search: list[Grid] = []
    bundle = None
    if chosen is not None:
        norm = matched_norm(regimes[chosen], args.data)
        comparison = [Grid(chosen, main_inits(norm), SEEDS[:1] if args.smoke else SEEDS, val=False)]
        repeats = repeats_its_base(regimes[chosen], args.data, norm)
        ablations = [
            Grid(chosen, [init for init in ablation_inits(norm) if init not in repeats], [0], val=False),
            Grid(chosen, close_parts(norm), [1], val=False),
        ]
        search = [Grid(chosen, SEARCH_INITS, [0], val=True)]
        bundle = (chosen, norm, repeats)
    elif args.part in ("compare", "ablate", "search"):
        parser.error("no regime is calibrated yet (CALIBRATED is None): run --part calibrate, then set it")
    grids = {"calibrate": calibrating, "compare": comparison, "ablate": ablations, "search": search, "guard": guard}
    grids = grids.get(args.part, [])
    configs, total = unfinished(grids, regimes, args.data, out, docs, args.smoke)
    if args.only:
        known = {init for grid in grids for init in grid.inits}
        if unknown := sorted(set(args.only) - known):
            listed = ", ".join(sorted(known))
            parser.error(f"--only: {', '.join(unknown)} is not an init of --part {args.part} ({listed})")
        configs = [c for c in configs if c.init in args.only]
    start = time.perf_counter()
    if grids:
        print(f"{args.part}: {len(configs)} of {total} runs to train, {args.jobs} at a time", flush=True)
    if configs:
        run_configs(configs, parallel=args.jobs, threads=args.threads, root=out)
    every = calibrating + comparison + ablations + search + guard
    write_docs(rows_of(out, every, regimes, docs), docs, regimes, args.data, args.smoke, bundle)
    print(f"done in {time.perf_counter() - start:.0f} s; {docs / PAGE}, {docs / 'regimes.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
