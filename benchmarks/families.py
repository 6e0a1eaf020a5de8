"""Beyond the plain ViT: the impulse init against the defaults on other families, on a CIFAR-10 subset.

Every model has the study ViT's budget (6 blocks, 8 x 8 tokens of width 192 at the end, 32 px) and
trains with the study's recipe (cpu-quick, 200 images per class, 20 epochs: ~300 steps; full test set),
two seeds, through `structinit compare`; finished runs are skipped, so a rerun only fills the gaps.
`--part new-converge` trains issue 52's families at the calibrated regime's size and recipe instead
(docs/studies/regimes.md: width 96, 6 heads, depth 6, patch 2 = 256 tokens; 500 images per class, 40 epochs,
~3,100 steps). Each part is its own section of docs/families.md (the text around them is kept), curves
in docs/figures/curves-<family>.png:

    .venv/bin/python benchmarks/families.py                  # Swin and MLP-Mixer: timm, impulse (8 runs)
    .venv/bin/python benchmarks/families.py --part new       # BEiT (relative-position bias) and a rotary
                                                             # ViT: kaiming, timm, impulse (12 runs)
    .venv/bin/python benchmarks/families.py --part new-converge --jobs 8   # the same, calibrated regime
    .venv/bin/python benchmarks/families.py --smoke [--part new]  # tiny models, 1 epoch: the pipeline
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from structinit.files import read_json_object
from structinit.models import create_model
from structinit.schema import Schema, check, number, text
from structinit.studies.grid import compare, run_configs, run_dir
from structinit.studies.ledger import check_outputs, one_line_refusals, write_generated_section
from structinit.studies.results import collect
from structinit.studies.tables import results_markdown
from structinit.training import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
INITS = ["timm", "impulse"]
SEEDS = [0, 1]
PER_CLASS, EPOCHS = 200, 20
# name -> (model preset, model kwargs); smoke: the same families, one block or stage, 1 epoch
FAMILIES = {"swin": ("swin_d6_p2_w4", {}), "mixer": ("mixer_d6_p4", {})}
SMOKE = {"swin": ("swin_d6_p2_w4", {"depths": (2,), "num_heads": (3,)}), "mixer": ("mixer_d6_p4", {"num_blocks": 2})}
# issue 52's families at the study ViT's size: BEiT (its bias table per block) and timm's axial-RoPE ViT
STUDY_VIT = dict(img_size=32, patch_size=4, embed_dim=192, depth=6, num_heads=3)
NEW = {"beit": ("beit_base_patch16_224", STUDY_VIT), "rope": ("vit_small_patch16_rope_224", STUDY_VIT)}
SMOKE_NEW = {name: (model, {**kwargs, "depth": 1}) for name, (model, kwargs) in NEW.items()}
REGIME_VIT = dict(img_size=32, patch_size=2, embed_dim=96, depth=6, num_heads=6)  # the calibrated regime's size
CONVERGE = {f"{name}-converge": (model, REGIME_VIT) for name, (model, _) in NEW.items()}
SMOKE_CONVERGE = {f"{name}-converge": (model, {**REGIME_VIT, "depth": 1}) for name, (model, _) in NEW.items()}
# each part: its families (full, smoke), its inits, the docs section it writes
PARTS = {
    "swin-mixer": (FAMILIES, SMOKE, INITS, "tables"),
    "new": (NEW, SMOKE_NEW, ["kaiming", "timm", "impulse"], "new-families"),
    "new-converge": (CONVERGE, SMOKE_CONVERGE, ["kaiming", "timm", "impulse"], "new-families-converge"),
}


def converge_configs(name: str, model: str, kwargs: dict[str, Any], data: str, out: Path, smoke: bool, inits):
    """The family's runs in the calibrated regime's recipe (study_regimes.Regime.config: the same preset,
    data size, batch, lr, warm-up and evaluation), test set."""
    from study_regimes import CALIBRATED, REGIMES, SMOKE_REGIME

    regime = dataclasses.replace(SMOKE_REGIME if smoke else REGIMES[CALIBRATED], model=model, model_kwargs=kwargs)
    return [
        regime.config(init, seed, False, data, run_dir(out / name, regime.per_class, init, seed), smoke)
        for init in inits
        for seed in (SEEDS[:1] if smoke else SEEDS)
    ]


def run_family(name: str, model: str, kwargs: dict[str, Any], data: str, out: Path, smoke: bool, inits, pool) -> None:
    recipe = dict(epochs=1, batch_size=8, eval_every=1) if smoke else dict(epochs=EPOCHS, eval_every=10)
    base = TrainConfig.from_preset("cpu-quick", data=data, model=model, model_kwargs=kwargs, quiet=True, **recipe)
    compare(base, inits, SEEDS[:1] if smoke else SEEDS, [8 if smoke else PER_CLASS], out / name, **pool)


# what the fidelity table reads of a run's init_report.json, checked before use
REPORT = Schema(
    {
        "measured_on": text(),
        "unit": text(optional=True),
        **dict.fromkeys(("mean_fidelity", "min_fidelity", "seconds"), number(0)),
    }
)
REPORT_FIX = "restore it, or train the run again (its start writes it)"


def fidelity_table(grid: Path, rows: list[dict[str, Any]]) -> str:
    """Mean and worst fidelity of each init at step 0, as its first run's init report measured it (read within
    bounds and checked: one line where it is damaged)."""
    lines = ["| init | measured on | mean fidelity | worst | init seconds |", "|---|---|---|---|---|"]
    for init in dict.fromkeys(r["init"] for r in rows):
        row = next(r for r in rows if r["init"] == init)
        path = run_dir(grid, row["per_class"], init, row["seed"]) / "init_report.json"
        report = check(read_json_object(path, REPORT_FIX), REPORT, str(path), REPORT_FIX)
        unit = report.get("unit", "head")
        lines.append(
            f"| {init} | {report['measured_on']} (per {unit}) | {report['mean_fidelity']:.3f} | "
            f"{report['min_fidelity']:.3f} | {report['seconds']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def write_docs(out: Path, docs: Path, families: dict[str, tuple[str, dict[str, Any]]], section: str) -> None:
    from structinit.studies.plots import plot_curves

    (docs / "figures").mkdir(parents=True, exist_ok=True)
    sections = []
    for name, (model, kwargs) in families.items():
        rows = collect(out / name) if (out / name).exists() else []
        if not rows:
            continue
        plot_curves(rows, docs / "figures" / f"curves-{name}.png")
        built = create_model(model, num_classes=10, in_chans=3, data_size=32, **kwargs)
        millions = sum(p.numel() for p in built.parameters()) / 1e6
        sections.append(
            f"### {name} ({model}, {millions:.2f} M parameters at 32 px, 10 classes)\n\n"
            f"{results_markdown(rows, wide=True)}\n"
            f"At init:\n\n{fidelity_table(out / name, rows)}\n"
            f"![curves of {name}](figures/curves-{name}.png)\n"
        )
    write_generated_section(
        docs / "families.md", "\n".join(sections) or "No finished runs yet.\n", "benchmarks/families.py", section
    )


@one_line_refusals("families.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="cifar10:../shared/datasets/cifar10", help="structinit --data spec")
    parser.add_argument("--out", default="runs/families", help="run directories (resumable)")
    parser.add_argument("--docs", default=None, help="where families.md goes (default docs/; with --smoke, OUT/docs)")
    parser.add_argument("--smoke", action="store_true", help="tiny models and subsets, 1 epoch: checks the pipeline")
    parser.add_argument("--part", choices=list(PARTS), default="swin-mixer", help="which families (default swin-mixer)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one process each")
    parser.add_argument("--threads", type=int, help="torch threads a run (default: the cores shared among --jobs)")
    args = parser.parse_args(argv)
    pool = dict(parallel=args.jobs, threads=args.threads)
    out = Path(args.out)
    docs = Path(args.docs) if args.docs else (out / "docs" if args.smoke else ROOT / "docs")
    full, smoke, inits, section = PARTS[args.part]
    families = smoke if args.smoke else full
    check_outputs(docs, [Path("families.md"), *(Path("figures", f"curves-{name}.png") for name in families)])
    if args.part == "new-converge":  # every family's runs in one pool
        configs = [
            c for n, (m, k) in families.items() for c in converge_configs(n, m, k, args.data, out, args.smoke, inits)
        ]
        print(f"[{', '.join(families)}] {len(configs)} runs, {args.jobs} at a time", flush=True)
        run_configs(configs, root=out, **pool)
    else:
        for name, (model, kwargs) in families.items():
            print(f"[{name}] {model}: {', '.join(inits)}", flush=True)
            run_family(name, model, kwargs, args.data, out, args.smoke, inits, pool)
    write_docs(out, docs, families, section)
    print(f"done: {docs / 'families.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
