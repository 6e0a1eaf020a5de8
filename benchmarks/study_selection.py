"""The weight-selection study (issue 35, docs/selection.md): initialising a small ViT from a larger one
that was trained here, without any download.

Teachers: a ViT of width 384 (6 heads of 64, depth 6, patch 4 at 32 px: 64 tokens) trained on CIFAR-10
classes 0-4 (all their 25,000 images), once from timm's init and once from the impulse init (the
paper's Section 5.5). Students: width 192 (3 heads of 64, depth 6) on a small subset of the other
classes (5-9), every init x 3 seeds; settings are chosen on a validation split, the test set is read once.

    .venv/bin/python benchmarks/study_selection.py --part teachers --teachers timm   # then its students
    .venv/bin/python benchmarks/study_selection.py --part students   # every student whose teacher is here
    .venv/bin/python benchmarks/study_selection.py --part docs       # docs/selection.md tables and figure
    .venv/bin/python benchmarks/study_selection.py --smoke --out /tmp/selection   # the pipeline, ~1 min on 2 cores

Every finished run's row goes to docs/selection-runs.jsonl (commit it as runs finish). Teachers are run
directories under OUT/teachers, not committed: a student trains where its teacher is, so on a 2-core
CPU one session trains the timm teacher and its students (and the baselines), the next the impulse
teacher and its students.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from structinit.errors import RunError
from structinit.inits.labels import BUNDLE
from structinit.studies.grid import run_configs, run_dir
from structinit.studies.ledger import (
    check_outputs,
    is_recorded,
    ledger_and_runs,
    one_line_refusals,
    read_ledger,
    study_docs,
    write_generated_section,
    write_ledger,
)
from structinit.studies.results import REPAIR
from structinit.studies.tables import results_markdown
from structinit.training import TrainConfig
from structinit.training.config_file import read_run_config
from structinit.training.record import MetricsLog, read_summary

ROOT = Path(__file__).resolve().parent.parent
LEDGER = "selection-runs.jsonl"
FIGURE = "selection-students.png"
TEACHER_CLASSES = ["airplane", "automobile", "bird", "cat", "deer"]
STUDENT_CLASSES = ["dog", "frog", "horse", "ship", "truck"]
TEACHER_MODEL = ("vit_small_patch16_224", dict(img_size=32, patch_size=4, depth=6))  # 384 wide, 6 heads
STUDENT_MODEL = ("vit_small_patch16_224", dict(img_size=32, patch_size=4, depth=6, embed_dim=192, num_heads=3))
STUDENT_SHOWN = "ViT w192 d6, patch 4 at 32 px"  # the tables' name for it: timm's name alone would say ViT-S/16
TEACHERS = {
    "timm": "timm",
    # named by its label before structinit 0.3, when `impulse` was this bundle
    "impulse": BUNDLE,
}  # teacher name -> its init
# student init -> (label, teacher): the baselines, selection (official and head-aware), selection with the
# impulse Q/K on top, and selection from the impulse-initialised teacher
STUDENT_INITS: dict[str, tuple[str, str | None]] = {
    "timm": ("timm", None),
    "kaiming": ("kaiming", None),  # PyTorch's defaults: the authors' baseline (docs/studies/regimes.md)
    "mimetic": ("mimetic", None),
    "impulse": (BUNDLE, None),
    "select": ("select", "timm"),
    "select-heads": ("select[rule=heads]", "timm"),
    "select+impulse-qk": ("select[qk=impulse]", "timm"),
    "select-from-impulse": ("select", "impulse"),
}
SEEDS = [0, 1, 2]


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What the smoke mode shrinks: epochs, images per class, the teachers' and students' depth."""

    teacher_epochs: int = 8
    student_epochs: int = 60
    per_class: int = 100
    val_per_class: int = 50
    batch_size: int = 64
    depth: int | None = None
    classes: int = 5


FULL = Sizes()
SMOKE = Sizes(teacher_epochs=1, student_epochs=2, per_class=4, val_per_class=2, batch_size=4, depth=1, classes=2)


def config(model: tuple[str, dict], classes: list[str], epochs: int, sizes: Sizes, **settings: Any) -> TrainConfig:
    """A run of the study: the light recipe on `classes`, the model at the sizes' depth, bf16 where it runs."""
    name, kwargs = model
    return TrainConfig.from_preset(
        "cpu-quick",
        classes=classes[: sizes.classes],
        model=name,
        model_kwargs={**kwargs, **({"depth": sizes.depth} if sizes.depth else {})},
        epochs=epochs,
        amp="auto",
        quiet=True,
        **settings,
    )


def teacher_config(name: str, data: str, out: Path, sizes: Sizes) -> TrainConfig:
    return config(
        TEACHER_MODEL,
        TEACHER_CLASSES,
        sizes.teacher_epochs,
        sizes,
        data=data,
        per_class=sizes.per_class if sizes is SMOKE else None,
        init=TEACHERS[name],
        seed=0,
        batch_size=sizes.batch_size * 2,
        eval_every=max(1, sizes.teacher_epochs // 5),
        out=str(out / "teachers" / name),
    )


def grid_of(init: str, val: bool) -> str:
    """Students of the impulse-initialised teacher are a grid of their own: their label is `select` too."""
    teacher = STUDENT_INITS[init][1]
    return f"students{'-impulse-teacher' if teacher == 'impulse' else ''}{'-val' if val else ''}"


def student_config(init: str, seed: int, val: bool, data: str, out: Path, sizes: Sizes) -> TrainConfig:
    label, teacher = STUDENT_INITS[init]
    return config(
        STUDENT_MODEL,
        STUDENT_CLASSES,
        sizes.student_epochs,
        sizes,
        data=data,
        per_class=sizes.per_class,
        val_per_class=sizes.val_per_class if val else None,
        init=label,
        teacher=str((out / "teachers" / teacher).resolve()) if teacher else None,
        seed=seed,
        batch_size=sizes.batch_size,
        eval_every=max(1, sizes.student_epochs // 10),
        out=str(run_dir(out / grid_of(init, val), sizes.per_class, label, seed)),
    )


def teacher_of(config: TrainConfig) -> str | None:
    """The teacher a student config selects from (its name), or None for the baselines: every
    teacher's students can train as soon as it exists."""
    return Path(config.teacher).name if config.teacher else None


def student_runs(smoke: bool) -> list[tuple[bool, int, str]]:
    """(validation?, seed, init): every init on the validation split (seed 0), then on the test set
    (every seed), seed-major."""
    seeds = SEEDS[:1] if smoke else SEEDS
    return [(True, 0, init) for init in STUDENT_INITS] + [(False, s, init) for s in seeds for init in STUDENT_INITS]


def student_configs(data: str, out: Path, docs: Path, sizes: Sizes, smoke: bool) -> list[TrainConfig]:
    """The student runs the ledger lacks."""
    ledger = read_ledger(docs / LEDGER)
    todo = []
    for val, seed, init in student_runs(smoke):
        config = student_config(init, seed, val, data, out, sizes)
        key = (grid_of(init, val), sizes.per_class, config.init, seed)
        if not is_recorded(ledger, key, config, docs / LEDGER):
            todo.append(config)
    return todo


def rows_of(out: Path, docs: Path, sizes: Sizes) -> list[dict[str, Any]]:
    """The ledger's rows and those of the run directories, in the study's order."""
    grids = list(dict.fromkeys(grid_of(init, val) for val, _, init in student_runs(False)))
    cells = [(g, sizes.per_class) for g in grids]
    return ledger_and_runs(read_ledger(docs / LEDGER), out, cells, {g: g for g in grids})


def tables(rows: list[dict[str, Any]], docs: Path) -> str:
    """results.md's table per split, students of the impulse teacher shown as 'select (impulse teacher)'
    and counted in the same cell, the model by its sizes (STUDENT_SHOWN); the test set's curves as a
    figure in docs/figures."""
    from structinit.studies.plots import plot_curves

    shown = []
    for row in rows:
        impulse_teacher = row["grid"].startswith("students-impulse-teacher")
        init = "select (impulse teacher)" if impulse_teacher else row["init"]
        shown.append({**row, "init": init, "recipe": row["split"], "model": STUDENT_SHOWN})
    parts = []
    for split, name in (("val", "validation split (seed 0): to choose"), ("test", "test set: read once")):
        chosen = [r for r in shown if r["split"] == split]
        if chosen:
            parts.append(f"On the {name}:\n\n{results_markdown(chosen, wide=True)}")
    tested = [r for r in shown if r["split"] == "test"]
    if tested:
        (docs / "figures").mkdir(exist_ok=True)
        plot_curves(tested, docs / "figures" / FIGURE)
        parts.append(f"![the students' test curves: mean over seeds, band +-1 std](figures/{FIGURE})\n")
    return "\n".join(parts) or "No student has finished yet.\n"


def teacher_table(out: Path) -> str:
    """Each teacher's test top-1 on its own classes and its cost (the price of a selected init), where it ran."""
    lines = [
        "| teacher | init | epochs | test top-1 (classes 0-4) | hours | device |",
        "|---|---|---|---|---|---|",
    ]
    for name, init in TEACHERS.items():
        path = out / "teachers" / name / "summary.json"
        if not path.exists():
            lines.append(f"| {name} | {init} | - | not trained yet | - | - |")
            continue
        summary = read_summary(path, REPAIR)  # read within bounds and checked, as every run's record
        curve = MetricsLog(path.parent).epochs()
        if "test_top1" not in summary:
            raise RunError(f"{path} has no test top-1, as a teacher's has: {REPAIR}")
        hours = sum(m["epoch_seconds"] for m in curve) / 3600
        ran = read_run_config(path.parent / "config.yaml")[1] or {}
        device = ran.get("device_name", "")
        lines.append(
            f"| {name} | {init} | {summary['epochs_done']} | {summary['test_top1']:.2f} | {hours:.3f} | {device} |"
        )
    return "\n".join(lines) + "\n"


@one_line_refusals("study_selection.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="cifar10:../shared/datasets/cifar10", help="structinit --data spec")
    parser.add_argument("--part", choices=["teachers", "students", "docs"], default="teachers")
    parser.add_argument("--out", default="runs/selection", help="run directories (resumable)")
    parser.add_argument("--docs", default=None, help="where the docs go (default docs/; with --smoke, OUT/docs)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one process each")
    parser.add_argument("--threads", type=int, help="torch threads a run (default: the cores shared among --jobs)")
    parser.add_argument(
        "--teachers", default="timm,impulse", help="the teachers to train (one a session fits a 2-core CPU)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny models and subsets, 1-2 epochs: the pipeline")
    args = parser.parse_args(argv)
    out, sizes = Path(args.out), SMOKE if args.smoke else FULL
    docs = study_docs(out, args, ROOT / "docs", Path(__file__).name)
    check_outputs(docs, [Path(LEDGER), Path("selection.md"), Path("figures", FIGURE)])
    docs.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    unknown = set(args.teachers.split(",")) - set(TEACHERS)
    if unknown:
        parser.error(f"--teachers: no teacher {', '.join(sorted(unknown))}; the teachers are {', '.join(TEACHERS)}")
    if args.part == "teachers":
        configs = [teacher_config(name, args.data, out, sizes) for name in args.teachers.split(",")]
        run_configs(
            [c for c in configs if not (Path(c.out) / "summary.json").exists()],
            args.jobs,
            root=out,
            threads=args.threads,
        )
    elif args.part == "students":
        ready = {n for n in TEACHERS if (out / "teachers" / n / "summary.json").exists()} | {None}
        if ready == {None}:
            parser.error(f"train a teacher first (--part teachers): none under {out / 'teachers'}")
        todo = [c for c in student_configs(args.data, out, docs, sizes, args.smoke) if teacher_of(c) in ready]
        teachers = ", ".join(sorted(n for n in ready if n))
        print(f"students: {len(todo)} runs to train (teachers here: {teachers})", flush=True)
        run_configs(todo, args.jobs, root=out, threads=args.threads)
    rows = rows_of(out, docs, sizes)
    write_ledger(docs / LEDGER, rows)
    body = f"### The teachers\n\n{teacher_table(out)}\n### The students\n\n{tables(rows, docs)}"
    write_generated_section(docs / "selection.md", body, "benchmarks/study_selection.py")
    print(f"done in {time.perf_counter() - start:.0f} s; {docs / 'selection.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
