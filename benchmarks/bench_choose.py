"""`structinit choose` against its budget, on folders of real photographs, idle and beside a busy process.

    python benchmarks/bench_choose.py                 # 4 rows of 5 minutes (~22 min on 2 cores)
    python benchmarks/bench_choose.py --minutes 3 --rows textures-fit-idle
    python benchmarks/bench_choose.py --smoke         # one tiny row, to check the script (~1 min)
    python benchmarks/bench_choose.py --pace          # what a CPU buys: steps a run per budget (~1 min)

The folders are crops of the photographs scikit-image ships (pip install scikit-image): `textures` (brick,
grass, gravel: 3 classes, 40 to train and 10 to test a class) and `scenes` (a cat, a cup, a rocket, a
motorcycle, a galaxy field: 5 classes, 30 and 8), each image a random square crop of a quarter to a half of
its photograph's side, resized to 96-128 px, half of them mirrored. Each row runs the command as a user
would (`structinit choose DIR --minutes M`, a new --out) and records the minutes asked and taken (wall clock
of the whole command, start to verdict), the epochs and steps planned and reached, and the verdict; `busy`
rows run beside one process that keeps a core busy, `late` rows beside one that starts a minute in, after
the comparison was sized (it must re-size as it goes). Rows are appended to --ledger as they finish.

`--pace` answers what a CPU buys instead: choose's own timing of a run (choose_pace.measure) of its default
model on folders of generated images at 32, 64 and 96 px (4 classes, 60 training images a class, 12 held out
for validation), and for 3, 10 and 30 minutes the steps every run of a comparison (5 inits x 2 seeds) then
trains at each batch from 8 to 128 (0: not the 100 a verdict needs), with the load average as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from structinit.files import no_follow, read_json_object, refuse_link, refuse_replacing
from structinit.studies.ledger import one_line_refusals

ROOT = Path(__file__).resolve().parent.parent
SETS = {
    "textures": (("brick.png", "grass.png", "gravel.png"), 40, 10),
    "scenes": (("chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "hubble_deep_field.jpg"), 30, 8),
}
# the model flags of a row: choose's default (no --model), and a timm ViT named as a timm user would
MODELS = {"fit": [], "timm": ["--model", "vit_tiny_patch16_224", "--model-kwargs", "img_size=96,patch_size=12"]}
ROWS = ["textures-fit-idle", "textures-fit-busy", "scenes-timm-idle", "scenes-timm-busy"]
LOADS = ("idle", "busy", "late")
LATE_SECONDS = 60


def photo_folder(name: str, root: Path, seed: int = 0) -> Path:
    """The folder `name` of SETS under `root`, made once: built whole in a new hidden folder beside it, then
    renamed into place, so that an interrupted build leaves no half-made set to be taken for the whole."""
    import skimage.data

    sources, train, test = SETS[name]
    folder = root / name
    refuse_link(folder)
    if folder.is_dir():
        return folder
    rng = np.random.default_rng(seed)
    where = Path(os.path.dirname(skimage.data.__file__))
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{name}.") as scratch:
        for source in sources:
            photo = Image.open(where / source).convert("RGB")
            width, height = photo.size
            for split, count in (("train", train), ("test", test)):
                (Path(scratch, name) / split / Path(source).stem).mkdir(parents=True)
                for i in range(count):
                    side = int(rng.integers(min(width, height) // 4, min(width, height) // 2 + 1))
                    x, y = int(rng.integers(0, width - side + 1)), int(rng.integers(0, height - side + 1))
                    size = int(rng.integers(96, 129))
                    crop = photo.crop((x, y, x + side, y + side)).resize((size, size), Image.BICUBIC)
                    if rng.random() < 0.5:
                        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
                    crop.save(Path(scratch, name) / split / Path(source).stem / f"{i:03d}.jpg", quality=90)
        os.rename(Path(scratch, name), folder)  # refused where a folder appeared meanwhile
    return folder


def run_row(row: str, minutes: float, data: Path, out: Path, extra: list[str]) -> dict:
    name, model, load = row.split("-")
    folder = photo_folder(name, data)
    command = [sys.executable, "-m", "structinit", "choose", str(folder), *MODELS[model], *extra]
    command += ["--minutes", f"{minutes:g}", "--out", str(out / row), "--quiet"]
    # busy: beside a process that keeps a core busy from the start; late: from LATE_SECONDS in (after sizing)
    burn = [sys.executable, "-c", f"import time; time.sleep({LATE_SECONDS if load == 'late' else 0})\nwhile True: pass"]
    busy = subprocess.Popen(burn) if load in ("busy", "late") else None
    try:
        started = time.monotonic()
        done = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}
        )
        taken = (time.monotonic() - started) / 60
    finally:
        if busy is not None:
            busy.kill()
    text = done.stdout + done.stderr
    plan_file = out / row / "choose.json"
    plan = read_json_object(plan_file, "run the row again with a new --out") if plan_file.exists() else {}
    reached = re.search(r"epoch (\d+) of (\d+) \((\d+) steps", text)
    verdict = re.search(r"^(verdict: .*|structinit choose: error: .*)$", text, re.M)
    return {
        "row": row,
        "minutes": minutes,
        "taken": round(taken, 2),
        "ratio": round(taken / minutes, 2),
        "rc": done.returncode,
        "model": plan.get("model", ""),
        "epochs_planned": plan.get("epochs"),
        "epoch_reached": int(reached.group(1)) if reached else None,
        "steps": int(reached.group(3)) if reached else None,
        "verdict": verdict.group(1) if verdict else text[-300:],
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
    }


PACE_SIZES, PACE_MINUTES, PACE_BATCHES = (32, 64, 96), (3, 10, 30), (8, 16, 32, 64, 128)


def generated_folder(size: int, root: Path, classes: int = 4, per_class: int = 72) -> Path:
    """A folder of `classes` classes of `per_class` training images of `size` px (noise over a class colour)."""
    folder = root / f"generated-{size}"
    rng = np.random.default_rng(size)
    for split, count in (("train", per_class), ("test", 4)):
        for label in range(classes):
            (folder / split / f"c{label}").mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (size, size, 3)) // 2 + 40 * label
                Image.fromarray(pixels.astype(np.uint8)).save(folder / split / f"c{label}" / f"{i}.png")
    return folder


def pace_row(size: int, root: Path) -> dict:
    """choose's timing of its default model at `size` px here, and the steps a run each budget and batch buys."""
    import dataclasses

    import torch

    from structinit.studies import choose_pace
    from structinit.studies.choose import BASELINES, IMAGES_MODEL
    from structinit.studies.choose_fit import Budget
    from structinit.training.recipe import data_of
    from structinit.training.settings import TrainConfig
    from structinit.training.startup import eval_images

    base = TrainConfig(data=f"imagefolder:{generated_folder(size, root)}", model=IMAGES_MODEL, val_per_class=12)
    base = dataclasses.replace(base, quiet=True, eval_every=1, batch_size=max(PACE_BATCHES))
    data = data_of(base)
    timing, model, threads = choose_pace.measure(base, data, 0.0)
    counts = torch.bincount(data.train_labels).tolist()
    steps = {}
    for minutes in PACE_MINUTES:
        budget = Budget(
            minutes, time.monotonic(), len(BASELINES) + 2, [0, 1], 1, base, counts, eval_images(data, "val")
        )
        for batch in PACE_BATCHES:
            pace, each = budget.pace(timing, batch)
            seconds = minutes * 60 - choose_pace.RESERVE_SECONDS
            epochs = choose_pace.sized_epochs(pace, budget.waves(), seconds)
            enough = epochs >= choose_pace.fewest_epochs(each, base)
            steps[f"{minutes}min-b{batch}"] = epochs * each if enough else 0
    return {
        "size": size,
        "model": model,
        "threads": threads,
        "images": sum(counts),
        "step_b128": round(timing.step, 3),
        "step_b8": round(timing.small[1], 3),
        "steps_a_run": steps,
        "load": [round(x, 1) for x in os.getloadavg()],
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
    }


def _cpu() -> str:
    lines = Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    name = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    flags = next((line for line in lines if line.startswith("flags")), "")
    return (name or platform.processor() or platform.machine()) + (" (AVX-512)" if "avx512f" in flags else "")


@one_line_refusals("bench_choose.py")
def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument(
        "--rows",
        nargs="+",
        default=ROWS,
        choices=[f"{n}-{m}-{load}" for n in SETS for m in MODELS for load in LOADS],
    )
    parser.add_argument("--data", type=Path, default=ROOT / "runs" / "bench_choose" / "photos")
    parser.add_argument(
        "--out", type=Path, default=None, help="where the comparisons go (default: a new temporary folder)"
    )
    parser.add_argument("--ledger", type=Path, default=ROOT / "runs" / "bench_choose" / "rows.jsonl")
    parser.add_argument("--smoke", action="store_true", help="one row of a tiny model on textures, to check the script")
    parser.add_argument("--pace", action="store_true", help="what a CPU buys: steps a run per budget and batch")
    args = parser.parse_args(argv)
    if args.pace:
        return _pace_rows(args.data, args.ledger.with_name("pace.jsonl"))
    extra: list[str] = []
    if args.smoke:
        args.rows, args.minutes = ["textures-fit-idle"], 1.2
        extra = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--seeds", "0,1"]
    refuse_replacing(args.ledger)  # before the rows run: appended to, never through a link
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_choose-"))
    args.ledger.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for row in args.rows:
        result = run_row(row, args.minutes, args.data, out, extra)
        rows.append(result)
        with open(args.ledger, "a", opener=no_follow) as ledger:
            ledger.write(json.dumps(result) + "\n")
        print(
            f"{row}: {result['taken']:.2f} of {args.minutes:g} min ({result['ratio']:.2f}x), epoch "
            f"{result['epoch_reached']} of {result['epochs_planned']}, {result['steps']} steps; {result['verdict']}",
            flush=True,
        )
    return rows


def _pace_rows(data: Path, ledger: Path) -> list[dict]:
    refuse_replacing(ledger)
    ledger.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in PACE_SIZES:
        rows.append(pace_row(size, data))
        with open(ledger, "a", opener=no_follow) as file:
            file.write(json.dumps(rows[-1]) + "\n")
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    main()
