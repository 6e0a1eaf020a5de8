"""How structinit's common calls hold up on a busy machine (issue 68): the demo, one `train` epoch, and
`mimetic` and `impulse` on ViT-B, each run as a user runs it (a fresh process), idle and beside one and two
busy processes (each multiplying matrices on every core, as a training beside it would). Wall and CPU time
of each, as ratios to idle, in one run; `--against SRC` times the inits of another checkout (PYTHONPATH=SRC)
under the same loads, interleaved.

    .venv/bin/python benchmarks/bench_contention.py                  # ~25 min on 2 cores
    .venv/bin/python benchmarks/bench_contention.py --demo-epochs 3 --against ../wt-80c85a9/src
    .venv/bin/python benchmarks/bench_contention.py --smoke          # the whole path in ~2 min

Goals (issue 68): beside two busy processes on 2 cores each call within 3x its idle wall time (a third of
the machine is a fair share) and within 1.3x its idle CPU time (threads that wait do not spin).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_init import start_busy_process
from structinit.files import atomic_write_text
from structinit.training.provenance import cpu_model

ROOT = Path(__file__).resolve().parents[1]

# an init timed inside its process, model creation excluded; prints wall and CPU seconds as JSON
INIT = """
import json, sys, time, timm, structinit
model, initialize = timm.create_model("vit_base_patch16_224"), structinit.initialize  # its lazy import untimed
wall, cpu = time.perf_counter(), time.process_time()
initialize(model, sys.argv[1])
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}))
"""


# the same init twice in one process: its first call and its second (what is paid once a process)
TWICE = """
import json, sys, time, timm, structinit
initialize, seconds = structinit.initialize, []
for _ in range(2):
    model = timm.create_model("vit_base_patch16_224")
    started = time.perf_counter()
    initialize(model, sys.argv[1])
    seconds.append(time.perf_counter() - started)
print(json.dumps(seconds))
"""


def first_and_second(rounds: int, against: Path, scratch: Path) -> str:
    """mimetic on ViT-B, its first and second call in a fresh process, this checkout and `against`
    interleaved, idle: medians."""
    times: dict[str, list[list[float]]] = {"this": [], "against": []}
    for _ in range(rounds):
        for label, source in (("this", ROOT / "src"), ("against", against)):
            shown = subprocess.run(
                [sys.executable, "-c", TWICE, "mimetic"], env=environment(source, scratch, []), capture_output=True
            )
            times[label].append(json.loads(shown.stdout.decode().splitlines()[-1]))
    return "\n".join(
        f"mimetic, ViT-B, {label}: first call {statistics.median(t[0] for t in runs):.2f} s, second "
        f"{statistics.median(t[1] for t in runs):.2f} s (medians of {rounds})"
        for label, runs in times.items()
    )


def timed(command: list[str], env: dict[str, str]) -> dict[str, float]:
    """Wall and CPU seconds of a child process (its threads and the children it waited for); an init's
    own JSON line, where it prints one, gives the init's alone (model creation excluded)."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    child = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    if child.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({child.returncode}):\n{child.stderr[-2000:]}")
    lines = [line for line in child.stdout.splitlines() if line.startswith("{")]
    if lines:
        return json.loads(lines[-1])
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall": wall, "cpu": cpu}


def workloads(args: argparse.Namespace) -> dict[str, list[str]]:
    python, epochs = sys.executable, str(args.demo_epochs)
    return {
        f"demo, {epochs} epochs": [python, "-m", "structinit", "demo", "--quiet", "--epochs", epochs],
        "train, 1 epoch of digits": [
            python,
            "-m",
            "structinit",
            "train",
            "--data",
            "digits",
            "--epochs",
            "1",
            "--quiet",
        ],
        "mimetic, ViT-B": [python, "-c", INIT, "mimetic"],
        "impulse, ViT-B": [python, "-c", INIT, "impulse"],
    }


def environment(source: Path, scratch: Path, extra: list[str]) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(source), "STRUCTINIT_CACHE": str(scratch / "cache")}
    env.update(item.split("=", 1) for item in extra)
    return env


def measure(args: argparse.Namespace, scratch: Path) -> list[dict]:
    """Every workload (and, with --against, its inits from the other checkout) at every load, interleaved
    within a load so that both see the same machine."""
    rows, runs = [], 0
    checkouts = [("this", ROOT / "src")] + ([("against", Path(args.against).resolve())] if args.against else [])
    for busy in args.loads:
        helpers = [start_busy_process() for _ in range(busy)]
        try:
            for name, command in workloads(args).items():
                if name.split(",")[0] not in args.calls:
                    continue
                for label, source in checkouts:
                    if label == "against" and command[1] != "-c":
                        continue
                    for _ in range(args.repeats):
                        runs += 1
                        out = [*command, "--out", str(scratch / f"run{runs}")] if command[1] == "-m" else command
                        result = timed(out, environment(source, scratch, args.env))
                        rows.append({"workload": name, "checkout": label, "busy": busy, **result})
                        print(json.dumps(rows[-1]), flush=True)
        finally:
            for helper in helpers:
                helper.kill()
                helper.wait()
    return rows


def median(rows: list[dict], key: tuple, field: str) -> float:
    return statistics.median_high(row[field] for row in rows if (row["workload"], row["checkout"], row["busy"]) == key)


def table(rows: list[dict], loads: list[int]) -> str:
    """Median wall and CPU seconds idle, and each load's ratios to them."""
    head = ["call", "checkout", "idle wall s (CPU s)"] + [f"beside {b}: wall, CPU" for b in loads[1:]]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for workload, checkout in dict.fromkeys((row["workload"], row["checkout"]) for row in rows):
        idle_wall, idle_cpu = (median(rows, (workload, checkout, 0), field) for field in ("wall", "cpu"))
        cells = [
            f"{median(rows, (workload, checkout, b), 'wall') / idle_wall:.2f}x, "
            f"{median(rows, (workload, checkout, b), 'cpu') / idle_cpu:.2f}x"
            for b in loads[1:]
        ]
        lines.append("| " + " | ".join([workload, checkout, f"{idle_wall:.1f} ({idle_cpu:.1f})", *cells]) + " |")
    return "\n".join(lines)


def idle_throughput(rounds: int, scratch: Path) -> str:
    """Training img/s on an idle machine with OpenMP's spin at structinit's 3,000 turns and at libgomp's
    300,000, interleaved (epochs 2-3 of `train --data digits --epochs 3`, each round a fresh process): the
    spin's cost where nothing else runs. The machine's noise is large (one run: 1,000-1,800 img/s)."""
    speeds: dict[str, list[int]] = {"3000": [], "300000": []}
    for n in range(rounds):
        for spin, values in speeds.items():
            env = {**environment(ROOT / "src", scratch, []), "GOMP_SPINCOUNT": spin}
            command = [sys.executable, "-m", "structinit", "train", "--data", "digits", "--epochs", "3"]
            shown = subprocess.run([*command, "--out", str(scratch / f"t{n}-{spin}")], env=env, capture_output=True)
            values += [int(m) for m in re.findall(rb"epoch [23]/3: .* (\d+) img/s", shown.stdout)]
    return "\n".join(
        f"GOMP_SPINCOUNT={spin}: median {statistics.median(v):.0f} img/s over {len(v)} epochs (range {min(v)}-{max(v)})"
        for spin, v in speeds.items()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--demo-epochs", type=int, default=30, help="the demo's epochs (30: the README's `make demo`)")
    parser.add_argument("--loads", default="0,1,2", help="busy processes beside each call (0 first: idle)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each call at each load (median)")
    parser.add_argument("--against", help="another checkout's src/ whose inits are timed beside this one's")
    parser.add_argument("--calls", default="demo,train,mimetic,impulse", help="which calls (comma-separated)")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE in the calls' environment")
    parser.add_argument("--smoke", action="store_true", help="one demo epoch, loads 0 and 1: the path, not numbers")
    parser.add_argument("--json", help="write every run here too")
    parser.add_argument(
        "--idle-throughput", type=int, metavar="ROUNDS", help="only: training img/s by spin count, idle"
    )
    parser.add_argument("--first-and-second", type=int, metavar="ROUNDS", help="only: mimetic's 1st/2nd call")
    args = parser.parse_args()
    if args.first_and_second and not args.against:
        parser.error("--first-and-second compares with --against SRC")
    args.loads, args.calls = [int(item) for item in args.loads.split(",")], args.calls.split(",")
    if args.loads[0] != 0:
        parser.error("--loads must start with 0 (idle: the ratios' base)")
    if args.smoke:
        args.demo_epochs, args.loads = 1, [0, 1]
    print(f"# {cpu_model()}, {os.cpu_count()} cores; command: {' '.join(sys.argv)}")
    print(f"# environment: {args.env or 'as given'}; busy process: 1024x1024 matmuls on every core\n")
    if args.idle_throughput or args.first_and_second:
        with tempfile.TemporaryDirectory() as scratch:
            if args.idle_throughput:
                print(idle_throughput(args.idle_throughput, Path(scratch)))
            else:
                print(first_and_second(args.first_and_second, Path(args.against).resolve(), Path(scratch)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        rows = measure(args, Path(scratch))
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(rows, indent=1))
    print("\n" + table(rows, args.loads))


if __name__ == "__main__":
    main()
