"""The invariant harness: every `structinit` command, with flag values and file states generated from the command's
own parser and the init registry (a new flag, init or option is covered the day it lands), run in a scratch tree in
a forked child (zygote.py) under a memory limit and a timeout. Every case must keep the rules:

- it ends: no hang past the timeout;
- exit 0, or 2 with one line saying why (`structinit CMD: error: ...`), never a traceback;
- a refusal leaves every file byte-identical;
- nothing is written or removed outside the outputs the command names (and the shared cache);
- its memory stays within what a small request implies (refusing a big one is fine).

    .venv/bin/python benchmarks/invariants.py --deep --hours 2   # random cases, every failure to invariants.jsonl
    .venv/bin/python benchmarks/invariants.py --examples 40       # a quick run; tests/test_invariants.py: CI's sample
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from invariant_cases import COMMANDS, Case, cases
from invariant_checks import TIMEOUT_S, Outcome, Scratch, Zygote, check

DEEP_TIMEOUT_S = 900.0  # torch.compile of ten runs on a CPU


def run_cases(examples: int, commands: tuple[str, ...], seed: int | None, record, budget_s: float | None = None):
    """Draw `examples` cases (derandomised where `seed` is None; otherwise with the long switches and timeout of
    --deep) and check each; `record(case, outcome)` is called for every case; returns the cases checked."""
    root = Path(record.folder)
    zygote = Zygote(root / "cache")
    scratch = Scratch(root, zygote)
    done, started = [0], time.monotonic()

    @settings(
        max_examples=examples,
        derandomize=seed is None,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases(commands, long=seed is not None))
    def one(case: Case) -> None:
        if budget_s is not None and time.monotonic() - started > budget_s:
            return
        record(case, check(case, scratch, zygote, DEEP_TIMEOUT_S if seed is not None else TIMEOUT_S))
        done[0] += 1

    if seed is not None:
        one = hypothesis_seed(seed)(one)
    try:
        one()
    finally:
        zygote.close()
    return done[0]


class Recorder:
    """Every case's outcome, its failures to a JSONL file (and the console)."""

    def __init__(self, folder: Path, log: Path | None, verbose: bool = True):
        self.folder, self.log, self.verbose = folder, log, verbose
        self.failures: list[dict] = []
        self.count = 0
        self.exits: dict[int, int] = {}

    def __call__(self, case: Case, outcome: Outcome) -> None:
        self.count += 1
        self.exits[outcome.rc] = self.exits.get(outcome.rc, 0) + 1
        failures = outcome.failures
        if failures:
            entry = {"argv": case.argv, "states": case.states, "failures": failures}
            self.failures.append(entry)
            if self.log is not None:
                with open(self.log, "a") as f:
                    f.write(json.dumps(entry) + "\n")
        if self.verbose:
            mark = "FAIL " + "; ".join(failures)[:300] if failures else "ok"
            line = f"[{self.count}] {' '.join(case.argv)[:160]}  {case.states}"
            print(
                f"{line}  -> exit {outcome.rc} in {outcome.seconds:.1f} s: {outcome.said[:120]!r}  {mark}", flush=True
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deep", action="store_true", help="random cases (not the CI sample) until --hours pass")
    parser.add_argument("--hours", type=float, default=1.0, help="with --deep: how long")
    parser.add_argument("--examples", type=int, default=40, help="cases to draw (with --deep: at most)")
    parser.add_argument("--seed", type=int, help="with --deep: hypothesis's seed (default: the clock)")
    parser.add_argument("--commands", default=",".join(COMMANDS), help="comma-separated commands to exercise")
    parser.add_argument("--folder", default="runs/invariants", help="scratch trees and the shared cache")
    parser.add_argument("--log", default="runs/invariants/invariants.jsonl", help="failures, one JSON line each")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    record = Recorder(folder, Path(args.log))
    commands = tuple(args.commands.split(","))
    started = time.monotonic()
    if args.deep:
        seed = args.seed if args.seed is not None else int(time.time())
        budget = args.hours * 3600
        while time.monotonic() - started < budget:
            run_cases(max(args.examples, 10_000), commands, seed, record, budget - (time.monotonic() - started))
            seed += 1
    else:
        run_cases(args.examples, commands, None, record)
    minutes = (time.monotonic() - started) / 60
    exits = ", ".join(f"exit {rc}: {n}" for rc, n in sorted(record.exits.items()))
    print(f"{record.count} cases ({exits}) in {minutes:.1f} min, {len(record.failures)} failing (log: {args.log})")
    return 1 if record.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
