"""The paper's theory, measured: frozen ConvMixer filters, stable rank, and heads as a filter basis.

1. ConvMixer (depth 8; width 128 / 256; kernel 3 / 5) whose depthwise filters are learned
   ("trained"), or frozen at random, impulse or box values. The claim: random and impulse filters
   (f^2 independent filters span the f x f space) train nearly as well as learned ones; box
   filters (one direction) do not.
2. A ViT of the same depth and width 128 with 4 / 8 / 16 heads, timm vs mimetic vs impulse init.
   The claim: more heads = more filters of the basis, so the impulse init should help most there.
3. Stable rank of the patch embeddings and of every block's output (trained models, 256 test
   images): the claim is that patch embeddings are low-rank, far below min(N, D).

CIFAR-10 from ../shared/datasets/cifar10, 200 images per class, the full test set, the cpu-quick
recipe for 15 epochs, seed 0 (more with --seeds). Resumable (finished runs are skipped):

    .venv/bin/python benchmarks/theory.py              # 26 min on 2 cores (one seed)
    .venv/bin/python benchmarks/theory.py --smoke      # ~1.5 min on 2 cores; writes under --out only

Writes the tables into docs/theory.md (between its markers) and docs/figures/theory*.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from structinit.files import save_figure
from structinit.studies.grid import compare, run_dir
from structinit.studies.ledger import check_outputs, one_line_refusals, write_generated_section
from structinit.training import TrainConfig

ROOT = Path(__file__).resolve().parent.parent
FILTERS = {  # the column of the table -> the init label
    "trained": "default",
    "random (frozen)": "random[freeze=True]",
    "impulse (frozen)": "impulse[freeze=True]",
    "box (frozen)": "box[freeze=True]",
}
VIT_INITS = ["timm", "mimetic", "impulse"]  # impulse: the paper's form


def settings(smoke: bool) -> dict[str, Any]:
    if smoke:
        return dict(dims=[16], kernels=[3], heads=[2, 4], depth=2, vit_dim=16, per_class=8, epochs=1, batch_size=8)
    return dict(dims=[128, 256], kernels=[3, 5], heads=[4, 8, 16], depth=8, vit_dim=128, per_class=200, epochs=15)


def base_config(data: str, s: dict[str, Any], model: str, model_kwargs: dict[str, Any]) -> TrainConfig:
    recipe = dict(epochs=s["epochs"], eval_every=10, per_class=s["per_class"])
    if "batch_size" in s:
        recipe["batch_size"] = s["batch_size"]
    return TrainConfig.from_preset("cpu-quick", data=data, model=model, model_kwargs=model_kwargs, quiet=True, **recipe)


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f}" + (f" ({len(values)})" if len(values) > 1 else "")


@one_line_refusals("theory.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="cifar10:../shared/datasets/cifar10", help="structinit --data spec")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--out", default="runs/theory", help="run directories (resumable)")
    parser.add_argument(
        "--docs", default=None, help="where theory.md and figures go (default docs/; --smoke: OUT/docs)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny models, 1 epoch: checks the pipeline")
    args = parser.parse_args(argv)
    s = settings(args.smoke)
    seeds = [int(x) for x in args.seeds.split(",")]
    out = Path(args.out)
    docs = Path(args.docs) if args.docs else (out / "docs" if args.smoke else ROOT / "docs")
    figures = [Path("figures", name) for name in ("theory.png", "theory-rank-0.png", "theory-rank-1.png")]
    check_outputs(docs, [Path("theory.md"), *figures])
    start = time.perf_counter()

    convmixer: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for dim in s["dims"]:
        for kernel in s["kernels"]:
            name = f"convmixer-d{dim}-k{kernel}"
            print(f"[{time.perf_counter() - start:.0f} s] {name}", flush=True)
            kwargs = dict(dim=dim, depth=s["depth"], kernel_size=kernel)
            base = base_config(args.data, s, "convmixer_d6_p4", kwargs)
            convmixer[dim, kernel] = compare(base, list(FILTERS.values()), seeds, [s["per_class"]], out / name)
    vits: dict[int, list[dict[str, Any]]] = {}
    for heads in s["heads"]:
        name = f"vit-d{s['vit_dim']}-h{heads}"
        print(f"[{time.perf_counter() - start:.0f} s] {name}", flush=True)
        kwargs = dict(embed_dim=s["vit_dim"], depth=s["depth"], num_heads=heads)
        vits[heads] = compare(
            base_config(args.data, s, "vit_d6_p4", kwargs), VIT_INITS, seeds, [s["per_class"]], out / name
        )

    figures = docs / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    conv_table = convmixer_table(convmixer)
    heads_table = vit_table(vits, s["vit_dim"])
    rank_table = ranks(out, s, figures)
    plot_theory(convmixer, vits, figures / "theory.png")
    body = (
        f"#### ConvMixer, depth {s['depth']}: test top-1 (%) by depthwise filters\n\n{conv_table}\n"
        f"#### ViT, depth {s['depth']}, width {s['vit_dim']}: test top-1 (%) by heads and init\n\n{heads_table}\n"
        f"#### Stable rank (mean over 256 test images) of the trained models' features\n\n{rank_table}\n"
        "![theory](figures/theory.png)\n"
    )
    write_generated_section(docs / "theory.md", body, "benchmarks/theory.py")
    print(f"done in {time.perf_counter() - start:.0f} s; {docs / 'theory.md'}")
    return 0


def convmixer_table(results: dict[tuple[int, int], list[dict[str, Any]]]) -> str:
    cells = sorted(results)
    lines = ["| filters | " + " | ".join(f"width {d}, {k}x{k}" for d, k in cells) + " |"]
    lines.append("|---|" + "---|" * len(cells))
    for column, label in FILTERS.items():
        values = [mean_std([r["top1"] for r in results[cell] if r["init"] == label]) for cell in cells]
        lines.append(f"| {column} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def vit_table(results: dict[int, list[dict[str, Any]]], dim: int) -> str:
    heads = sorted(results)
    lines = ["| init | " + " | ".join(f"{h} heads (dim {dim // h})" for h in heads) + " |"]
    lines.append("|---|" + "---|" * len(heads))
    for init in VIT_INITS:
        values = [mean_std([r["top1"] for r in results[h] if r["init"] == init]) for h in heads]
        lines.append(f"| {init} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def ranks(out: Path, s: dict[str, Any], figures: Path) -> str:
    """Stable ranks of two trained models (seed 0) and their PNGs."""
    from structinit.inspection.rank import rank_figure

    dim, kernel, heads, vit_dim = s["dims"][-1], s["kernels"][0], s["heads"][1], s["vit_dim"]
    runs = [
        (f"ConvMixer width {dim}, {kernel}x{kernel}, trained filters", f"convmixer-d{dim}-k{kernel}", "default"),
        (f"ViT width {vit_dim}, {heads} heads, impulse init", f"vit-d{vit_dim}-h{heads}", "impulse"),
    ]
    lines = ["| model | patch embedding | block 1 | last block | min(N, D) |", "|---|---|---|---|---|"]
    for i, (title, grid, init) in enumerate(runs):
        run = run_dir(out / grid, s["per_class"], init, 0)
        if not (run / "last.pt").exists():
            continue
        result, _ = rank_figure(str(run), images=256, out=figures / f"theory-rank-{i}.png")
        lines.append(
            f"| {title} | {result[0].stable_rank:.2f} | {result[1].stable_rank:.2f} | {result[-1].stable_rank:.2f} "
            f"| {result[0].bound} |"
        )
    return "\n".join(lines) + "\n"


def plot_theory(convmixer, vits, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    cells = sorted(convmixer)
    width = 0.8 / len(FILTERS)
    for i, (column, label) in enumerate(FILTERS.items()):
        means = [statistics.mean([r["top1"] for r in convmixer[c] if r["init"] == label] or [0]) for c in cells]
        left.bar(np.arange(len(cells)) + i * width, means, width, label=column)
    left.set_xticks(np.arange(len(cells)) + 0.4 - width / 2, [f"w{d}, {k}x{k}" for d, k in cells])
    left.set_ylabel("test top-1 (%)")
    left.set_title("ConvMixer: frozen vs learned depthwise filters")
    left.legend(fontsize=8)
    heads = sorted(vits)
    for init in VIT_INITS:
        right.plot(
            heads,
            [statistics.mean([r["top1"] for r in vits[h] if r["init"] == init] or [0]) for h in heads],
            "o-",
            label=init,
        )
    right.set_xscale("log", base=2)
    right.set_xticks(heads, [str(h) for h in heads])
    right.set_xlabel("heads")
    right.set_ylabel("test top-1 (%)")
    right.set_title("ViT: heads as a filter basis")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, 120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
