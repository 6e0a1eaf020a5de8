"""The paper's Table 5 cell on one GPU: five inits trained at once on the same batches.

    python benchmarks/gpu_table5.py --data cifar10:/tmp/cifar10 --out runs/table5      # an H200: ~19 min (extrapolated)
    python benchmarks/gpu_table5.py --data cifar10:/tmp/cifar10 --minutes 10 ...       # what fits 10 minutes
    python benchmarks/gpu_table5.py --smoke --out /tmp/table5                          # any CPU: the pipeline
    python benchmarks/gpu_table5.py --collect docs/table5/*/ --out docs/table5        # runs joined: table, curves
    python benchmarks/gpu_table5.py --at-init --inits 'kaiming,qk-norm[norm=3.5]'     # the inits untrained, minutes

The cell (Zheng et al., Table 5; ../shared/FINDINGS.md): CIFAR-10, all 50,000 training images, the
full test set; the paper's v1 ViT: depth 8, width 256, 8 heads, patch 2 at 32 px (256 tokens), global
average pooling, a fixed 2-D sin-cos position table; batch 512, AdamW lr 1e-3, weight decay 0.01,
cosine schedule with 5 warm-up epochs, gradient clipping at 3, RandAugment (m9, n2) with crop and flip,
bf16 autocast. The paper trains 200 epochs: kaiming 85.16, trunc-normal (timm) 87.10, mimetic 89.45,
impulse 90.67. Here every init trains the same number of epochs (default 50), so compare with the
paper's ordering, not its numbers; the timm row checks the recipe (far under 87 at a comparable budget
means the recipe is wrong before any init comparison means anything). Measured (four inits, 28 epochs,
17.4 s an epoch on an H200): docs/studies/regimes.md.

The inits: `kaiming` (the paper's "Kaiming Uniform", the authors' baseline), `timm`, and mimetic and
impulse on the authors' base (`base=kaiming`: every layer they do not set keeps PyTorch's default), as
in the paper's table; impulse twice: the paper's bundle, and the Q/K alone at the sharpness that the
code behind its sin-cos tables reaches on this model (docs/studies/regimes.md, "What produced the paper's
sin-cos numbers"). The models see the same batches in the same order (one augmentation per
step, on the GPU), each with its own optimiser and schedule: a paired comparison, and the GPU stays
busy. Every epoch appends one line per init (train loss, img/s, test top-1 when evaluated) to
OUT/ledger.jsonl; OUT/summary.json and OUT/curves.png follow each evaluation, so a lost machine loses
little. Each model is built and initialised exactly as `structinit train` builds it for the same
settings and seed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from structinit.data.augment import BatchAugment
from structinit.data.datasets import load_data
from structinit.errors import RunError
from structinit.files import atomic_write_text, no_follow, read_json_object
from structinit.inits.labels import InitSpec, split_top_level
from structinit.scale import head_qk_norms
from structinit.schema import Bounds, Field, Schema, check, integer, json_lines, mapping, number, text
from structinit.studies.ledger import check_outputs, one_line_refusals
from structinit.training import TrainConfig
from structinit.training.device import Dist, prefer_math_attention, resolve_amp, resolve_device
from structinit.training.optimizer import create_optimizer, create_schedule
from structinit.training.recipe import evaluate, model_of

# the paper's bundle on the authors' base, and the init of the code behind the paper's sin-cos tables: the Q/K
# alone on PyTorch's base, as sharp as that code's solve makes them on this model (0.41: iclr_impulse.py)
ICLR_IMPULSE = "impulse[vproj=keep,base=kaiming,target_fidelity=0.41,pos_scale=18.0]"
INITS = [
    "kaiming",
    "timm",
    "mimetic[base=kaiming]",
    "impulse[base=kaiming,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic]",
    ICLR_IMPULSE,
]
MODEL = "vit_w256_d8_p2_gap_sincos"


# the trainer's settings for the cell (TrainConfig fields; the rest keep their defaults, no label smoothing)
RECIPE = dict(
    epochs=50,
    batch_size=512,
    lr=1e-3,
    weight_decay=0.01,
    warmup_epochs=5,
    min_lr=1e-5,
    clip_grad=3.0,
    randaugment="rand-m9-n2",
    eval_every=5,
    smoothing=0.0,
)
SMOKE = {**RECIPE, "epochs": 2, "batch_size": 20, "warmup_epochs": 0.5, "eval_every": 1}
SMOKE_MODEL = {"depth": 1, "embed_dim": 32, "num_heads": 2}
# what --collect reads of a run (its OUT): the summary's run-wide fields and each ledger line, checked before use
RUN_FIX = "restore the run's files as this script wrote them (docs/table5: from git), or leave the run out"
RUN_SUMMARY = Schema({"seed": integer(0), "device": text(), "precision": text(), "recipe": mapping()})
LOSS = Field("a number", lambda value: isinstance(value, (int, float)) and not isinstance(value, bool))  # NaN too
RUN_LINE = Schema(
    {
        "init": text(),
        **dict.fromkeys(("epoch", "step"), integer(1)),
        "train_loss": LOSS,
        "test_top1": number(0, 100, optional=True),
    }
)
RUN_LEDGER_BOUNDS = Bounds(line=1 << 16, lines=100_000, total=64 << 20)  # a line is ~200 bytes, an epoch an init


class Member:
    """One init's model, optimiser and schedule (the trainer's), trained on the batches every member shares."""

    def __init__(self, config: TrainConfig, data, device, steps: int, compile: bool):
        self.init = config.init
        self.model, self.report = model_of(config, data)
        norms = head_qk_norms(self.model)
        self.qk_norm = sum(norms) / len(norms)
        self.model.to(device)
        self.forward = torch.compile(self.model) if compile else self.model
        self.optimizer = create_optimizer(self.model, config, device)
        self.scheduler = create_schedule(self.optimizer, config, steps)
        self.curve: list[tuple[int, float]] = []
        self.loss_curve: list[tuple[int, float]] = []

    def step(self, images, labels, amp, clip: float, step: int) -> torch.Tensor:
        with torch.autocast(images.device.type, dtype=amp, enabled=amp is not None):
            loss = nn.functional.cross_entropy(self.forward(images), labels)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        self.scheduler.step_update(step)
        return loss.detach()


class Clock:
    """A member's own time: CUDA events around its steps (read once an epoch, so the host never waits
    between members and the GPU stays busy), or the wall clock on a CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda, self.spans, self.total = device.type == "cuda", [], 0.0

    def __enter__(self) -> None:
        if self.cuda:
            self.spans.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            self.spans[-1][0].record()
        else:
            self.tick = time.perf_counter()

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.spans[-1][1].record()
        else:
            self.total += time.perf_counter() - self.tick

    def seconds(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(start.elapsed_time(end) for start, end in self.spans) / 1000
        return self.total


def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = SMOKE if args.smoke else {**RECIPE, "epochs": args.epochs, "eval_every": args.eval_every}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = resolve_device(args.device, 0)
    amp = resolve_amp("auto", device)
    data = load_data(args.data, per_class=10 if args.smoke else None)
    kwargs = SMOKE_MODEL if args.smoke else {}
    common = dict(settings, data=args.data, model=MODEL, model_kwargs=kwargs, seed=args.seed, out=str(out))
    recipe = TrainConfig(**common)
    steps = len(data.train_labels) // recipe.batch_size
    compiled = args.compile if args.compile is not None else device.type == "cuda"
    members = [Member(TrainConfig(**common, init=init), data, device, steps, compiled) for init in args.inits]
    for m in members:
        prefer_math_attention(m.model, device, amp)
    mean = std = (0.5,) * data.image_shape[0]
    padding = data.image_shape[1] // 8
    augment = BatchAugment(mean, std, padding, True, randaugment=recipe.randaugment)
    images, labels = data.train_images.to(device), data.train_labels.to(device)
    test_images, test_labels = data.test_images.to(device), data.test_labels.to(device)
    ledger = out / "ledger.jsonl"
    atomic_write_text(ledger, "")
    generator = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()
    epoch = 0
    while epoch < recipe.epochs:
        order = torch.randperm(len(labels), generator=generator)[: steps * recipe.batch_size].view(steps, -1)
        order = order.to(device)  # one copy an epoch, not one a step
        losses = {m.init: torch.zeros((), device=device) for m in members}
        clocks = {m.init: Clock(device) for m in members}
        for m in members:
            m.model.train()  # evaluation leaves it in eval mode
        for i, index in enumerate(order):
            x, y = augment(images[index], labels[index], generator)
            for m in members:
                with clocks[m.init]:
                    losses[m.init] += m.step(x, y, amp, recipe.clip_grad, epoch * steps + i + 1)
        seconds = {init: clock.seconds() for init, clock in clocks.items()}
        if epoch == 0 and args.minutes:
            recipe = fit_epochs(recipe, members, args.minutes * 60, time.perf_counter() - started, steps)
        due = (epoch + 1) % recipe.eval_every == 0 or epoch + 1 == recipe.epochs
        with open(ledger, "a", opener=no_follow) as f:
            for m in members:
                line = {
                    "init": m.init,
                    "epoch": epoch + 1,
                    "step": (epoch + 1) * steps,
                    "train_loss": float(losses[m.init]) / steps,
                    "img_per_s": steps * recipe.batch_size / max(seconds[m.init], 1e-9),
                    "elapsed": time.perf_counter() - started,
                }
                m.loss_curve.append((epoch + 1, line["train_loss"]))
                if due:
                    batches = (
                        (augment.normalise(x), y) for x, y in zip(test_images.split(1000), test_labels.split(1000))
                    )
                    line["test_top1"] = evaluate(m.forward, batches, device, Dist(), amp)["test_top1"]
                    m.curve.append((epoch + 1, line["test_top1"]))
                f.write(json.dumps(line) + "\n")
        if due:
            summary = write_summary(members, recipe, data, device, amp, out, time.perf_counter() - started)
            if not args.quiet:
                done = f"epoch {epoch + 1}, {time.perf_counter() - started:.0f} s: "
                print(done + ", ".join(f"{m.init} {m.curve[-1][1]:.2f}" for m in members), flush=True)
        epoch += 1
    return summary


def fit_epochs(recipe: TrainConfig, members: list[Member], budget_s: float, first_epoch_s: float, steps: int):
    """As many epochs as fit the budget at the first epoch's pace (5 % kept for evaluation), the cosine
    schedules stretched to match: their warm-up does not depend on the total, so the first epoch is as it
    would have been had the total been known from the start."""
    epochs = max(1, int(budget_s / (first_epoch_s * 1.05)))
    print(f"first epoch {first_epoch_s:.1f} s: {epochs} epochs fit {budget_s / 60:.1f} minutes", flush=True)
    recipe = dataclasses.replace(recipe, epochs=epochs)
    for m in members:
        m.scheduler = create_schedule(m.optimizer, recipe, steps)
    return recipe


def write_summary(members, recipe: TrainConfig, data, device, amp, out: Path, seconds: float) -> dict[str, Any]:
    """OUT/summary.json (the recipe, where it ran, each init's final and best top-1) and OUT/curves.png."""
    from structinit.studies.plots import plot_curves

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    rows = [
        {
            "dataset": data.name,
            "model": MODEL,
            "heads": "",
            "per_class": "",
            "epochs": recipe.epochs,
            "split": "test",
            "recipe": "table5",
            "init": m.init,
            "seed": recipe.seed,
            "top1": m.curve[-1][1],
            "best_top1": max(t for _, t in m.curve),
            "curve": m.curve,
            "loss_curve": m.loss_curve,
        }
        for m in members
    ]
    plot_curves(rows, out / "curves.png")
    summary = {
        "recipe": {k: getattr(recipe, k) for k in RECIPE},
        "device": name,
        "seed": recipe.seed,
        "precision": str(amp).removeprefix("torch.") if amp is not None else "float32",
        "seconds": round(seconds, 1),
        "epochs_done": members[0].curve[-1][0],
        "results": {r["init"]: {"final_top1": r["top1"], "best_top1": r["best_top1"]} for r in rows},
        "fidelity": {m.init: round(m.report.mean_fidelity, 4) for m in members if m.report.mean_fidelity is not None},
        "qk_norm": {m.init: round(m.qk_norm, 3) for m in members},
    }
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2))
    return summary


def at_init(args: argparse.Namespace) -> str:
    """Each init on the cell's model at the seed, untrained (on a CPU, ~4 minutes for six), measured as
    docs/studies/regimes.md's "Attention at init" table: entropy, mass on the heads' offsets on the pseudo input and
    on 256 test images (per layer), the heads' mean Q/K norm (what a norm-matched control needs)."""
    from structinit.data.batches import normalised_test_images
    from study_regimes import ATTENTION_HEADER, attention_at_init, attention_row  # a script beside this one

    data = load_data(args.data, per_class=10)  # the model needs the classes and the image size only
    rows = list(ATTENTION_HEADER)
    kwargs = SMOKE_MODEL if args.smoke else {}
    for init in args.inits:
        config = TrainConfig(**RECIPE, data=args.data, model=MODEL, model_kwargs=kwargs, seed=args.seed, init=init)
        model, _ = model_of(config, data)
        model.eval()
        rows.append(attention_row(f"`{init}`", attention_at_init(model, normalised_test_images(model, data, 256))))
    return "\n".join(rows) + "\n"


def read_run(run: Path) -> list[dict[str, Any]]:
    """One run of this script (its OUT) as a row per init: seed, device, precision, recipe, last and best
    test top-1, epochs, steps, the test and loss curves."""
    if not (run / "summary.json").is_file() or not (run / "ledger.jsonl").is_file():
        raise SystemExit(f"--collect: {run} has no summary.json and ledger.jsonl (not an OUT of this script)")
    summary = check(read_json_object(run / "summary.json", RUN_FIX), RUN_SUMMARY, f"{run}/summary.json", RUN_FIX)
    lines = run_ledger(run / "ledger.jsonl")
    rows = []
    for init in dict.fromkeys(line["init"] for line in lines):
        mine = [line for line in lines if line["init"] == init]
        curve = [(x["epoch"], x["test_top1"]) for x in mine if "test_top1" in x]
        if not curve:
            raise RunError(f"{run}/ledger.jsonl holds no evaluated epoch of {init}: {RUN_FIX}")
        rows.append(
            {
                "init": init,
                "seed": summary["seed"],
                "device": summary["device"],
                "precision": summary["precision"],
                "recipe": summary["recipe"],
                "top1": curve[-1][1],
                "best_top1": max(t for _, t in curve),
                "epochs": mine[-1]["epoch"],
                "steps": mine[-1]["step"],
                "curve": curve,
                "loss_curve": [(x["epoch"], x["train_loss"]) for x in mine],
            }
        )
    return rows


def run_ledger(path: Path) -> list[dict[str, Any]]:
    """A run's ledger.jsonl, its lines read within RUN_LEDGER_BOUNDS and each checked (RUN_LINE): one line
    (RunError) naming the file and the line where one is damaged."""
    lines = []
    for at, line in json_lines(path, RUN_LEDGER_BOUNDS, RUN_FIX):
        if line.strip():
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, not UTF-8 text, nested too deep to read
                raise RunError(f"{path} line {at} is damaged (not JSON): {RUN_FIX}") from None
            lines.append(check(record, RUN_LINE, f"{path} line {at}", RUN_FIX))
    return lines


def collect(runs: list[Path], out: Path) -> str:
    """Joins runs of the cell (each an OUT of this script, same recipe) into OUT/curves.png and OUT/table.md:
    per init, the last epoch's test top-1 as mean +- std over its seeds. An (init, seed) met again in a
    later run is a repeat: listed with both devices, not averaged."""
    from structinit.studies.plots import plot_curves

    check_outputs(out, ["table.md", "curves.png"])
    rows, repeats, recipes = {}, [], {}
    for run in runs:
        for row in read_run(run):
            recipes[str(run)] = row["recipe"]
            if (row["init"], row["seed"]) in rows:
                repeats.append((rows[(row["init"], row["seed"])], row))
            else:
                rows[(row["init"], row["seed"])] = row
    if len({json.dumps(r, sort_keys=True) for r in recipes.values()}) > 1:
        raise SystemExit(f"--collect: the runs' recipes differ: {recipes}")
    out.mkdir(parents=True, exist_ok=True)
    extra = {"dataset": "cifar10", "model": MODEL, "heads": "", "per_class": "", "split": "test", "recipe": "table5"}
    plot_curves([{**r, **extra} for r in rows.values()], out / "curves.png")
    table = ["| init | seeds | test top-1, last epoch | per seed (device) | train loss, last epoch |"]
    table.append("|---|---|---|---|---|")
    by_init = {}
    for r in rows.values():
        by_init.setdefault(r["init"], []).append(r)
    for mine in by_init.values():
        mine.sort(key=lambda r: r["seed"])
    for init, mine in sorted(by_init.items(), key=lambda kv: -sum(r["top1"] for r in kv[1]) / len(kv[1])):
        tops = torch.tensor([r["top1"] for r in mine], dtype=torch.float64)
        spread = f" ± {tops.std().item():.2f}" if len(mine) > 1 else ""
        seeds = ", ".join(f"{r['seed']}: {r['top1']:.2f} ({r['device']})" for r in mine)
        loss = sum(r["loss_curve"][-1][1] for r in mine) / len(mine)
        table.append(f"| `{init}` | {len(mine)} | {tops.mean().item():.2f}{spread} | {seeds} | {loss:.3f} |")
    if repeats:
        table += ["", "Repeats (the same init and seed again, not averaged):", ""]
        table += [
            f"- `{a['init']}` seed {a['seed']}: {a['top1']:.2f} on {a['device']}, {b['top1']:.2f} on {b['device']}"
            for a, b in repeats
        ]
    text = "\n".join(table) + "\n"
    atomic_write_text(out / "table.md", text)
    return text


@one_line_refusals("gpu_table5.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", help="structinit --data spec (default: ../shared's CIFAR-10; digits with --smoke)")
    parser.add_argument("--out", default="runs/table5")
    parser.add_argument("--epochs", type=int, default=RECIPE["epochs"], help="the same for every init")
    parser.add_argument("--minutes", type=float, help="as many epochs as fit (set after the first; overrides --epochs)")
    parser.add_argument("--eval-every", type=int, default=RECIPE["eval_every"], help="epochs between test evaluations")
    parser.add_argument("--inits", default=",".join(INITS), help="comma-separated init labels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, help="torch.compile each model (default: on CUDA only)"
    )
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a 1-block model, 100 images, 2 epochs: the pipeline")
    parser.add_argument("--collect", nargs="+", type=Path, metavar="RUN", help="join these runs' OUTs into --out")
    parser.add_argument("--at-init", action="store_true", help="each init's fidelity and Q/K norm, untrained")
    args = parser.parse_args(argv)
    if args.collect:
        print(collect(args.collect, Path(args.out)), end="")
        return 0
    args.inits = split_top_level(args.inits)
    args.data = args.data or ("digits" if args.smoke else "cifar10:../shared/datasets/cifar10")
    if args.epochs < 1 or args.eval_every < 1:
        parser.error("--epochs and --eval-every must be >= 1")
    if args.minutes is not None and args.minutes <= 0:
        parser.error("--minutes must be > 0")
    for label in args.inits:
        try:
            InitSpec.parse(label)
        except (TypeError, ValueError) as error:
            parser.error(f"--inits: {error}")
    if args.at_init:
        print(at_init(args), end="")
        return 0
    check_outputs(Path(args.out), ["ledger.jsonl", "summary.json", "curves.png"])  # before it trains
    summary = run(args)
    print(json.dumps(summary["results"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
