"""The paper's solve (structinit/inits/paper_solve.py), full, on a grid of shapes and on timm's registered
ViTs: the table `impulse` ships, and the evidence for its shortcut (docs/bench_solve.md).

Each shape is solved for all 10,000 steps with the mass recorded at every check (each 100 steps); the
shortcut (stop once saturated, paper_solve.saturated) is read off the same trace, so the ledger holds the
full solve's value beside the fast one. Resumable: every finished shape is a line of the ledger
(docs/solve-grid.jsonl), and a shape already there is not solved again; shapes run cheapest first.

    .venv/bin/python benchmarks/solve_grid.py --part grid --max-gflop 2000     # what 2 CPU cores do in ~1 h
    .venv/bin/python benchmarks/solve_grid.py --part table --device cuda      # timm's ViTs, on a GPU
    .venv/bin/python benchmarks/solve_grid.py --write                          # the package table and the page
    .venv/bin/python benchmarks/solve_grid.py --part grid --smoke --ledger /tmp/l.jsonl   # CI: two tiny shapes
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
import warnings
from pathlib import Path

import timm
import torch

from structinit.adapters.base import is_sincos_table
from structinit.inits import sharpness
from structinit.inits.paper_solve import RENORM_EVERY, STEPS, paper_solve, saturated
from structinit.models import PRESETS, create_model

ROOT = Path(__file__).resolve().parents[1]
LEDGER = ROOT / "docs" / "solve-grid.jsonl"
PAGE = ROOT / "docs" / "bench_solve.md"
SIDES = (4, 8, 14, 16, 24, 32, 48)  # tokens 16 ... 2,304
WIDTHS = (64, 192, 384, 768, 1024)
VIT_PRESETS = [name for name, (arch, _) in PRESETS.items() if str(arch).startswith("vit_")]
VIT_NAMES = ["*vit*", "deit*", "eva*", "beit*"]  # the names of timm's VisionTransformer models (and some others)
README_MODEL = ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4))


def grid_shapes() -> list[dict]:
    """Sin-cos and learned tables; per width 1 head, heads of 64 and 16 heads; kernel 5 at one head count."""
    shapes = []
    for kind in ("learned", "sincos"):
        for side in SIDES:
            for width in WIDTHS:
                heads = sorted({1, max(1, width // 64), 16})
                shapes += [_shape(kind, side, width, h, 3, 1e-6) for h in heads]
                shapes.append(_shape(kind, side, width, max(1, width // 64), 5, 1e-6))
    return shapes


def table_shapes() -> list[dict]:
    """One shape per distinct (grid, width, heads, LayerNorm eps) of timm's registered VisionTransformers with a
    learned position embedding, and of structinit's ViT presets and the README's model."""
    found: dict[tuple, dict] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in timm.list_models(VIT_NAMES):
            try:
                with torch.device("meta"):
                    model = timm.create_model(name)
            except Exception:  # a model timm cannot build without its extras
                continue
            _add(found, name, model)
        for name in VIT_PRESETS:
            _add(found, name, create_model(name, num_classes=10, in_chans=3, data_size=None))
        readme = timm.create_model(README_MODEL[0], **README_MODEL[1])
        _add(found, "README: vit_tiny_patch16_224 at 32 px, patch 4", readme)
    return list(found.values())


def _add(found: dict, name: str, model: torch.nn.Module) -> None:
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(model, VisionTransformer) or model.pos_embed is None or not hasattr(model.blocks[0], "attn"):
        return
    norm = model.blocks[0].norm1
    if type(norm) is not torch.nn.LayerNorm and type(norm).__name__ != "LayerNorm":
        return
    grid = tuple(model.patch_embed.grid_size)
    kind = "sincos" if not model.pos_embed.is_meta and is_sincos_table(model.pos_embed, grid) else "learned"
    shape = _shape(kind, grid, model.embed_dim, model.blocks[0].attn.num_heads, 3, norm.eps)
    found.setdefault(_key(shape), shape).setdefault("models", []).append(name)


def _shape(kind: str, side, width: int, heads: int, kernel: int, eps: float) -> dict:
    grid = [side, side] if isinstance(side, int) else list(side)
    return dict(kind=kind, grid=grid, width=width, heads=heads, kernel=kernel, eps=eps)


def _key(shape: dict) -> tuple:
    return (shape["kind"], *shape["grid"], shape["width"], shape["heads"], shape["kernel"], shape["eps"])


def gflop(shape: dict) -> float:
    """The full solve's work: 10,000 steps of four (T, D) x (D, D) products and three of (T, T) maps."""
    tokens, width = shape["grid"][0] * shape["grid"][1], shape["width"]
    return STEPS * 2 * (4 * tokens * width * width + 3 * tokens * tokens * width) / 1e9


def solve(shape: dict, device: str) -> dict:
    pseudo = sharpness.standard_pseudo(shape["kind"], tuple(shape["grid"]), shape["width"], shape["eps"])
    start = time.perf_counter()
    grid = tuple(shape["grid"])
    out = paper_solve(pseudo, grid, shape["heads"], shape["kernel"], device=device, stop_saturated=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    stop = next((i for i in range(len(out.trace)) if saturated(out.trace[: i + 1])), None)
    fast = out.mass if stop is None else out.trace[stop]
    return {
        **shape,
        "reached": round(out.mass, 6),
        "mass": sharpness.rounded(out.mass),
        "fast": sharpness.rounded(fast),
        "fast_steps": STEPS if stop is None else (stop + 1) * RENORM_EVERY,
        "trace": [round(m, 5) for m in out.trace],
        "seconds": round(seconds, 1),
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else _cpu(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "commit": _commit(),
    }


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else ():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        git = ["git", "rev-parse", "--short", "HEAD"]
        return subprocess.run(git, cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def read_ledger(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run(part: str, ledger: Path, device: str, max_gflop: float, smoke: bool, only: list[str]) -> None:
    done = {(row["part"], *_key(row)) for row in read_ledger(ledger)}
    shapes = grid_shapes() if part == "grid" else table_shapes()
    if only:
        shapes = [s for s in shapes if set(only) & set(s.get("models", ()))]
    if smoke:
        shapes = [s for s in shapes if s["grid"] == [4, 4] and s["width"] == 64][:2]
    todo = sorted((s for s in shapes if (part, *_key(s)) not in done), key=gflop)
    skipped = [s for s in todo if gflop(s) > max_gflop]
    todo = [s for s in todo if gflop(s) <= max_gflop]
    print(f"{part}: {len(shapes)} shapes, {len(done)} solved, {len(todo)} to solve, {len(skipped)} over --max-gflop")
    for shape in todo:
        row = {"part": part, **solve(shape, device)}
        with ledger.open("a") as f:
            f.write(json.dumps(row) + "\n")
        fast = f"fast {row['fast']} ({row['fast_steps']} steps)"
        print(f"{_key(shape)}: full {row['mass']} {fast} {row['seconds']} s", flush=True)


def write_table(ledger: Path) -> None:
    """The package table: every solved shape of the `table` part, its full solve's value."""
    rows = [r for r in read_ledger(ledger) if r["part"] == "table"]
    keys = ("kind", "grid", "width", "heads", "kernel", "eps", "mass", "reached", "models")
    entries = sorted(({k: r[k] for k in keys} for r in rows), key=lambda e: (e["grid"], e["width"], e["heads"]))
    about = "the paper's solve, 10,000 steps, on timm's registered ViTs: benchmarks/solve_grid.py --part table"
    sharpness.TABLE.write_text(json.dumps({"about": about, "entries": entries}, indent=1) + "\n")
    print(f"{sharpness.TABLE}: {len(entries)} shapes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("grid", "table"))
    parser.add_argument("--ledger", type=Path, default=LEDGER)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-gflop", type=float, default=float("inf"), help="leave larger shapes (for a GPU)")
    parser.add_argument("--only", default="", help="the table's shapes of these models (comma-separated) alone")
    parser.add_argument("--smoke", action="store_true", help="two tiny shapes (CI)")
    parser.add_argument("--write", action="store_true", help="write the package table and docs/bench_solve.md")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.part:
        run(args.part, args.ledger, args.device, args.max_gflop, args.smoke, [n for n in args.only.split(",") if n])
    if args.write:
        write_table(args.ledger)


if __name__ == "__main__":
    main()
