"""What reading records back costs the commands that read them most: `compare` on a finished grid (every run's
records checked, its data's fingerprint taken again, then tabulated) and `train --resume` of a finished run, in
CPU seconds (user + system: steadier than the clock on a shared machine), against another source tree.

    .venv/bin/python benchmarks/bench_records.py --against /tmp/old/src   # e.g. `git worktree add /tmp/old f0a228a`
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2", "--per-class", "20", "-b", "25", "--quiet"]
GRID += ["--epochs", "2", "--inits", "timm,impulse,kaiming", "--seeds", "0,1", "--out", "grid"]
COMMANDS = {
    "compare a finished grid": ["compare", *GRID],
    "train --resume a finished run": ["train", "--resume", "--quiet", "--out", "grid/per_class_20/timm-seed0"],
}


def cpu_seconds(argv: list[str], source: Path, cwd: Path) -> float:
    """User + system seconds of `structinit ARGV` with `source` first on the path, one torch thread."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONPATH": str(source), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "structinit", *argv], cwd=cwd, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another structinit source tree (its src/), timed alternately")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    sources = {"this": ROOT / "src", **({"against": args.against} if args.against else {})}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        cpu_seconds(COMMANDS["compare a finished grid"], ROOT / "src", work)  # trains the grid
        print("| command | " + " | ".join(f"{name} (CPU s, median of {args.repeats})" for name in sources) + " |")
        print("|---|" + "---|" * len(sources))
        for what, command in COMMANDS.items():
            times = {name: [] for name in sources}
            for _ in range(args.repeats):
                for name, source in sources.items():
                    times[name].append(cpu_seconds(command, source, work))
            cells = " | ".join(f"{statistics.median(t):.2f} ({min(t):.2f}-{max(t):.2f})" for t in times.values())
            print(f"| {what} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
