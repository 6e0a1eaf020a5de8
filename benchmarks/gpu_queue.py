"""The GPU work queue: the one thing a lent GPU window runs (DEVELOPERS.md). The jobs are committed, in
order, in benchmarks/gpu_queue.json; docs/gpu-queue-state.json says which are done. On the device:

    python3 benchmarks/gpu_queue.py start --minutes 12    # the next jobs that fit 12 minutes, in the background
    python3 benchmarks/gpu_queue.py poll 500              # wait up to 500 s; each job's small files to $OUT

and here, with the files that came back:

    .venv/bin/python benchmarks/gpu_queue.py absorb FILES_AT    # results to each job's `keep`, the state updated
    .venv/bin/python benchmarks/gpu_queue.py status             # what is done and what comes next
    .venv/bin/python benchmarks/gpu_queue.py --smoke            # start, poll and absorb on a CPU (CI), ~1 min

`start` unpacks the carried .gpu-data (cifar_pack.py: its own pack or ../shared/tools/gpu_data.py's) where
CIFAR-10 lies here, then a driver in the background runs the jobs not done, in order, each while the minutes
left hold its `minutes`; a job longer than what is left, or whose init this checkout lacks, waits (later jobs go
on). `--minutes`: the device time left (`status`'s budget_left_s) less the start-up: a Table 5 job needs 12.
Every poll copies to $OUT/gpu-queue/: the driver's log, each job's small files (no checkpoints) and the state
with the jobs that ended well, so a machine lost midway loses one job at most, and the next window goes on where
this one stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUEUE = ROOT / "benchmarks" / "gpu_queue.json"
STATE = ROOT / "docs" / "gpu-queue-state.json"
DATA = "../shared/datasets/cifar10"
SMALL = 5_000_000  # bytes: what comes back of a job (its ledgers, summaries, curves; no checkpoints)


def read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.is_file() else default


def runnable(job: dict[str, Any]) -> bool:
    """Whether this checkout has the job's inits (a queue may name an init before it is built)."""
    from structinit.inits.labels import InitSpec
    from structinit.inits.registry import METHODS

    if "--inits" not in job["args"]:
        return True
    labels = job["args"][job["args"].index("--inits") + 1].split(",")
    try:
        return all(InitSpec.parse(label).method in METHODS for label in labels)
    except ValueError:  # a name this checkout does not know yet
        return False


def pending(state: dict[str, Any], smoke: bool = False) -> list[dict[str, Any]]:
    """The queue's jobs not done, in order; with `smoke`, the first runnable job of each script."""
    jobs = [job for job in read_json(QUEUE, {})["jobs"] if job["id"] not in state.get("done", {})]
    if smoke:
        firsts: dict[str, dict[str, Any]] = {}
        for job in filter(runnable, jobs):
            if job.get("smoke") is not None:
                firsts.setdefault(job["script"], job)
        jobs = list(firsts.values())
    return jobs


def command(job: dict[str, Any], out: Path, smoke: bool) -> list[str]:
    args = [a.replace("{out}", str(out)) for a in job["smoke" if smoke else "args"]]
    data = [] if smoke or "gpu_table5" not in job["script"] else ["--data", f"cifar10:{DATA}"]
    return [sys.executable, str(ROOT / job["script"]), *args, *data]


def drive(work: Path, minutes: float, smoke: bool) -> None:
    """Run the pending jobs in order, each one whose minutes the window still holds (a longer one waits for a
    longer window; the shorter ones after it go on); log each end in work/ended.json."""
    deadline = time.monotonic() + 60 * minutes
    ended = read_json(work / "ended.json", {})
    for job in pending(read_json(work / "state.json", {}), smoke):
        left = (deadline - time.monotonic()) / 60
        if job["id"] in ended or not runnable(job):
            continue
        if job["minutes"] > left and not smoke:
            print(f"{job['id']}: needs {job['minutes']} min, {left:.1f} left: waits for a longer window", flush=True)
            continue
        out = work / job["id"]
        out.mkdir(parents=True, exist_ok=True)
        for source, name in job.get("copy", {}).items():  # e.g. the ledgers of what is done already
            copy = shutil.copytree if (ROOT / source).is_dir() else shutil.copy
            copy(ROOT / source, out / name)
        print(f"{job['id']}: {' '.join(command(job, out, smoke))}", flush=True)
        started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        rc = subprocess.call(command(job, out, smoke), env=env, cwd=ROOT)
        ended[job["id"]] = {"rc": rc, "minutes": round((time.monotonic() - started) / 60, 2), "smoke": smoke}
        (work / "ended.json").write_text(json.dumps(ended, indent=1))
        print(f"{job['id']}: exit {rc} after {ended[job['id']]['minutes']} min", flush=True)


def start(work: Path, minutes: float, smoke: bool) -> None:
    if (work / "pid").is_file() and alive(int((work / "pid").read_text())):
        raise SystemExit(f"gpu_queue.py: a driver is still running (pid {(work / 'pid').read_text()}): poll it")
    if not smoke and not (ROOT / DATA / "train").is_dir():
        subprocess.check_call([sys.executable, str(ROOT / "benchmarks" / "cifar_pack.py"), "unpack", ".gpu-data", DATA])
    work.mkdir(parents=True, exist_ok=True)
    if STATE.is_file() and not smoke:  # the jobs done in earlier windows (a smoke test runs from none)
        shutil.copy(STATE, work / "state.json")
    else:
        (work / "state.json").write_text("{}")
    flags = ["--smoke"] * smoke
    driver = [sys.executable, __file__, "drive", "--work", str(work), "--minutes", str(minutes), *flags]
    with open(work / "queue.log", "a") as log:
        child = subprocess.Popen(driver, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    (work / "pid").write_text(str(child.pid))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout[:1] != "Z"


def poll(work: Path, seconds: float, out: Path) -> str:
    """Wait until the driver ends or `seconds` pass; copy the log, each job's small files and the state
    with the jobs that ended well to OUT/gpu-queue/. Returns 'running' or 'ended'."""
    pid = int((work / "pid").read_text())
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(2)
    back = out / "gpu-queue"
    back.mkdir(parents=True, exist_ok=True)
    shutil.copy(work / "queue.log", back / "queue.log")
    ended = read_json(work / "ended.json", {})
    state = read_json(work / "state.json", {})
    state.setdefault("done", {}).update({k: v for k, v in ended.items() if v["rc"] == 0})
    (back / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    for job in pending({}):
        folder = work / job["id"]
        found = [p for pattern in job.get("returns", ["**/*"]) for p in folder.glob(pattern)] if folder.is_dir() else []
        for path in found:
            if path.is_file() and path.suffix != ".pt" and path.stat().st_size <= SMALL:
                target = back / job["id"] / path.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, target)
    return "running" if alive(pid) else "ended"


def absorb(files_at: Path, state_path: Path = STATE, root: Path = ROOT) -> list[str]:
    """The jobs that came back done: their files to each job's `keep`, the state's done jobs added."""
    back = files_at / "gpu-queue"
    returned = read_json(back / "state.json", None)
    if returned is None:
        raise SystemExit(f"gpu_queue.py absorb: {back}/state.json is missing: not a poll's $OUT")
    state = read_json(state_path, {})
    new = sorted(set(returned.get("done", {})) - set(state.get("done", {})))
    jobs = {job["id"]: job for job in read_json(QUEUE, {})["jobs"]}
    for name in new:
        if (back / name).is_dir():
            shutil.copytree(back / name, root / jobs[name]["keep"], dirs_exist_ok=True)
    state.setdefault("done", {}).update({name: returned["done"][name] for name in new})
    state_path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    return new


def smoke() -> int:
    """start, poll and absorb on a CPU, the jobs at their --smoke size, into a scratch state and folders."""
    with tempfile.TemporaryDirectory() as scratch:
        work, out, root = Path(scratch) / "work", Path(scratch) / "out", Path(scratch) / "repo"
        start(work, 60, smoke=True)
        while poll(work, 120, out) == "running":
            pass
        done = absorb(out, Path(scratch) / "state.json", root)
        jobs = [job["id"] for job in pending({}, smoke=True)]
        print((work / "queue.log").read_text())
        if done != sorted(jobs):
            raise SystemExit(f"gpu_queue.py --smoke: {sorted(set(jobs) - set(done))} did not end well")
        print(f"smoke: {len(done)} jobs ran, came back and were absorbed")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", nargs="?", choices=("start", "poll", "drive", "absorb", "status"), default="status")
    parser.add_argument("target", nargs="?", help="poll: seconds (default 500); absorb: the folder that came back")
    parser.add_argument("--minutes", type=float, default=12.0, help="start: device minutes this window has left")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gpu-queue"), help="where the jobs run")
    parser.add_argument("--smoke", action="store_true", help="start, poll and absorb on a CPU, jobs at --smoke size")
    args = parser.parse_args(argv)
    if args.smoke and args.action == "status":
        return smoke()
    if args.action == "start":
        start(args.work, args.minutes, args.smoke)
        print(poll(args.work, 60, Path(os.environ.get("OUT", "/tmp/gpu-queue-out"))))  # a job failing at once says so
    elif args.action == "drive":
        drive(args.work, args.minutes, args.smoke)
    elif args.action == "poll":
        print(poll(args.work, float(args.target or 500), Path(os.environ.get("OUT", "/tmp/gpu-queue-out"))))
    elif args.action == "absorb":
        print(f"absorbed: {', '.join(absorb(Path(args.target))) or 'nothing new'}")
    else:
        state = read_json(STATE, {})
        for job in read_json(QUEUE, {})["jobs"]:
            mark = "done" if job["id"] in state.get("done", {}) else "ready" if runnable(job) else "waits (no init)"
            print(f"{job['id']:<34} {job['minutes']:>3} min  {mark}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
