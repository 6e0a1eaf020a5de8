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

The files it keeps follow the library's rules (structinit.files): a damaged state, pid or queue file is refused
in one line, every file is written whole and never through a link, a link among a job's files is left out of
what a poll returns and absorb files (and said), and a refusal leaves every file as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))  # the device's python3 runs the checkout
from structinit.errors import RunError, one_line, quoted, reason
from structinit.files import (
    atomic_write,
    atomic_write_text,
    no_follow,
    read_json_object,
    refuse_link,
    refuse_replacing,
    regular_file,
)

ROOT = Path(__file__).resolve().parent.parent
QUEUE = ROOT / "benchmarks" / "gpu_queue.json"
STATE = ROOT / "docs" / "gpu-queue-state.json"
DATA = "../shared/datasets/cifar10"
SMALL = 5_000_000  # bytes: what comes back of a job (its ledgers, summaries, curves; no checkpoints)
JOB_FIELDS = {"id": str, "minutes": (int, float), "script": str, "args": list, "keep": str}
OPTIONAL_FIELDS = {"copy": dict, "returns": list, "smoke": (list, type(None))}
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # a job's folder, on the device and in $OUT
PID = re.compile(rb"\s*[1-9][0-9]{0,8}\s*")
AGAIN = "start the queue again in a new --work folder"


def read_queue() -> list[dict[str, Any]]:
    """The committed queue's jobs; one line where the file or a job is damaged."""
    fix = "mend it (git diff benchmarks/gpu_queue.json says what changed)"
    jobs = read_json_object(QUEUE, fix).get("jobs")
    for number, job in enumerate(jobs if isinstance(jobs, list) else [None], 1):
        fault = job_fault(job)
        if fault:
            raise RunError(f"{QUEUE} is damaged (its job {number}, {quoted(job, 60)}: {fault}): {fix}")
    return jobs


def job_fault(job: Any) -> str | None:
    """What makes `job` no job of the queue's (a field missing, a path leading out of its folder), or None."""
    if not isinstance(job, dict):
        return "not a JSON object"
    wrong = [key for key, kind in JOB_FIELDS.items() if not isinstance(job.get(key), kind)]
    wrong += [key for key, kind in OPTIONAL_FIELDS.items() if key in job and not isinstance(job[key], kind)]
    if wrong:
        return f"{', '.join(wrong)} missing or of another type"
    if not JOB_ID.fullmatch(job["id"]):
        return "its id names no folder"
    paths = [job["keep"], *job.get("copy", {}), *job.get("copy", {}).values(), *job.get("returns", [])]
    if not all(
        isinstance(path, str) and path and not os.path.isabs(path) and ".." not in path.split("/") for path in paths
    ):
        return "a path of keep, copy or returns leads out of its folder"
    return None


def read_jobs(path: Path, fix: str, key: str | None = "done") -> dict[str, dict[str, Any]]:
    """The jobs a state records under "done" (ended.json: `key` None, at its top), each an object with its exit
    code: {} where there is no file; one line where the file is damaged."""
    if not os.path.lexists(path):
        return {}
    found = read_json_object(path, fix)
    jobs = found.get(key, {}) if key else found
    if not isinstance(jobs, dict) or not all(isinstance(v, dict) and type(v.get("rc")) is int for v in jobs.values()):
        raise RunError(f"{path} is damaged (not a record of jobs, each with its exit code): {fix}")
    return jobs


def write_state(path: Path, done: dict[str, dict[str, Any]]) -> None:
    atomic_write_text(path, json.dumps({"done": done}, indent=1, sort_keys=True) + "\n")


def read_pid(work: Path) -> int | None:
    """The driver's process id; None where none was started here; one line where work/pid is damaged."""
    path = work / "pid"
    if not os.path.lexists(path):
        return None
    regular_file(path)  # a FIFO would hang the reader
    with open(path, "rb") as f:
        text = f.read(64)
    if not PID.fullmatch(text):
        raise RunError(f"{path} is damaged (not a process id): {AGAIN}, or remove it once no driver runs")
    return int(text)


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


def pending(done: dict[str, Any], smoke: bool = False) -> list[dict[str, Any]]:
    """The queue's jobs not done, in order; with `smoke`, the first runnable job of each script."""
    jobs = [job for job in read_queue() if job["id"] not in done]
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


class Copies:
    """Files to copy, each found without following a link (a link met is left out, and said), written once the
    way to every target is checked (no link, no file where a folder goes, only a regular file replaced)."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Path, Path]] = []
        self.links: set[Path] = set()

    def add(self, folder: Path, patterns: list[str], target: Path, start: Path | None = None, small: bool = False):
        """The regular files below `folder` that `patterns` match (`small`: no checkpoint, none over SMALL), each
        to its place below `start` (default `folder`) put below `target`."""
        if folder.is_symlink():
            self.links.add(folder)
        for path in sorted({p for pattern in patterns for p in folder.glob(pattern)}) if folder.is_dir() else ():
            parts = path.relative_to(folder).parts
            way = (folder.joinpath(*parts[:n]) for n in range(1, len(parts) + 1))
            link = next((step for step in way if step.is_symlink()), None)
            if link is not None:
                self.links.add(link)
            elif path.is_file() and not (small and (path.suffix == ".pt" or path.stat().st_size > SMALL)):
                self.pairs.append((path, target / path.relative_to(start or folder)))

    def write(self, base: Path, also: tuple[Path, ...] = ()) -> None:
        """Every copy, `base` holding its target (and `also`, written next by the caller), checked, then made."""
        for target in [*also, *(target for _, target in self.pairs)]:
            parts = target.relative_to(base).parts
            for folder in (base.joinpath(*parts[:n]) for n in range(1, len(parts))):
                refuse_link(folder)
                if folder.exists() and not folder.is_dir():
                    raise RunError(f"{folder} is a file, where {target} needs a folder: move it away")
            refuse_replacing(target)
        for source, target in self.pairs:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(source, "rb", opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW)) as f:
                atomic_write(target, lambda out, f=f: shutil.copyfileobj(f, out))
        for link in sorted(self.links):
            print(f"gpu_queue.py: note: {link} is a link: left out (no link's target is copied)", file=sys.stderr)


def drive(work: Path, minutes: float, smoke: bool) -> None:
    """Run the pending jobs in order, each one whose minutes the window still holds (a longer one waits for a
    longer window; the shorter ones after it go on); log each end in work/ended.json."""
    deadline = time.monotonic() + 60 * minutes
    ended = read_jobs(work / "ended.json", AGAIN, key=None)
    for job in pending(read_jobs(work / "state.json", AGAIN), smoke):
        left = (deadline - time.monotonic()) / 60
        if job["id"] in ended or not runnable(job):
            continue
        if job["minutes"] > left and not smoke:
            print(f"{job['id']}: needs {job['minutes']} min, {left:.1f} left: waits for a longer window", flush=True)
            continue
        out = work / job["id"]
        refuse_link(out)
        out.mkdir(parents=True, exist_ok=True)
        copies = Copies()
        for source, name in job.get("copy", {}).items():  # e.g. the ledgers of what is done already
            copies.add(ROOT, [source, f"{source}/**/*"], out / name, start=ROOT / source)
        copies.write(work)
        print(f"{job['id']}: {' '.join(command(job, out, smoke))}", flush=True)
        started = time.monotonic()
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        rc = subprocess.call(command(job, out, smoke), env=env, cwd=ROOT)
        ended[job["id"]] = {"rc": rc, "minutes": round((time.monotonic() - started) / 60, 2), "smoke": smoke}
        atomic_write_text(work / "ended.json", json.dumps(ended, indent=1))
        print(f"{job['id']}: exit {rc} after {ended[job['id']]['minutes']} min", flush=True)


def start(work: Path, minutes: float, smoke: bool) -> None:
    """The driver started in the background; everything it refuses checked before anything is written."""
    refuse_link(work)
    for name in ("pid", "state.json", "ended.json", "queue.log"):
        refuse_replacing(work / name)
    pid = read_pid(work)
    if pid is not None and alive(pid):
        raise RunError(f"a driver is still running (pid {pid}): poll it")
    done = {} if smoke else read_jobs(STATE, "restore it: git checkout docs/gpu-queue-state.json")
    if not smoke and not (ROOT / DATA / "train").is_dir():
        unpack = [sys.executable, str(ROOT / "benchmarks" / "cifar_pack.py"), "unpack", ".gpu-data", DATA]
        if subprocess.call(unpack, cwd=ROOT) != 0:
            raise RunError("cifar_pack.py could not unpack .gpu-data (its line above says why): carry a pack")
    work.mkdir(parents=True, exist_ok=True)
    write_state(work / "state.json", done)  # the jobs done in earlier windows (a smoke test runs from none)
    flags = ["--smoke"] * smoke
    driver = [sys.executable, __file__, "drive", "--work", str(work), "--minutes", str(minutes), *flags]
    with open(work / "queue.log", "a", opener=no_follow) as log:
        child = subprocess.Popen(driver, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
    atomic_write_text(work / "pid", str(child.pid))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout[:1] != "Z"


def poll(work: Path, seconds: float, out: Path) -> str:
    """Wait until the driver ends or `seconds` pass; copy the log, each job's small files and the state
    with the jobs that ended well to OUT/gpu-queue/. Returns 'running' or 'ended'."""
    pid = read_pid(work)
    if pid is None:
        raise RunError(f"no driver was started in {work}: start one (gpu_queue.py start)")
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(2)
    back = out / "gpu-queue"
    ended = read_jobs(work / "ended.json", AGAIN, key=None)
    done = {**read_jobs(work / "state.json", AGAIN), **{k: v for k, v in ended.items() if v["rc"] == 0}}
    copies = Copies()
    copies.add(work, ["queue.log"], back)
    for job in read_queue():
        copies.add(work / job["id"], job.get("returns", ["**/*"]), back / job["id"], small=True)
    copies.write(out, also=(back / "state.json",))
    write_state(back / "state.json", done)
    return "running" if alive(pid) else "ended"


def absorb(files_at: Path, state_path: Path = STATE, root: Path = ROOT) -> list[str]:
    """The jobs that came back done: their files to each job's `keep`, the state's done jobs added. What came
    back is checked whole first: a damaged state, a job the queue lacks or a link on the way writes nothing."""
    back = files_at / "gpu-queue"
    if not os.path.lexists(back / "state.json"):
        raise RunError(f"{back}/state.json is missing: not a poll's $OUT")
    returned = read_jobs(back / "state.json", "absorb a poll's $OUT as it came back")
    done = read_jobs(state_path, "restore it: git checkout docs/gpu-queue-state.json")
    jobs = {job["id"]: job for job in read_queue()}
    foreign = sorted(set(returned) - set(jobs))
    if foreign:
        raise RunError(f"{back}/state.json names jobs the queue lacks ({quoted(foreign)}): not this queue's $OUT")
    new = sorted(set(returned) - set(done))
    copies = Copies()
    for name in new:
        copies.add(back / name, ["**/*"], root / jobs[name]["keep"])
    refuse_replacing(state_path)
    copies.write(root)
    write_state(state_path, {**done, **{name: returned[name] for name in new}})
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
            raise RunError(f"--smoke: {sorted(set(jobs) - set(done))} did not end well (the log above says why)")
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
    out = Path(os.environ.get("OUT", "/tmp/gpu-queue-out"))
    try:
        if args.smoke and args.action == "status":
            return smoke()
        if args.action == "start":
            start(args.work, args.minutes, args.smoke)
            print(poll(args.work, 60, out))  # a job failing at once says so
        elif args.action == "drive":
            drive(args.work, args.minutes, args.smoke)
        elif args.action == "poll":
            if not re.fullmatch(r"[0-9]+(\.[0-9]*)?", args.target or "500"):
                raise RunError(f"poll waits a number of seconds, not {quoted(args.target)}: e.g. poll 500")
            print(poll(args.work, float(args.target or 500), out))
        elif args.action == "absorb":
            if args.target is None:
                raise RunError("absorb takes the folder a poll's files came back in: absorb FILES_AT")
            print(f"absorbed: {', '.join(absorb(Path(args.target), STATE, ROOT)) or 'nothing new'}")
        else:
            done = read_jobs(STATE, "restore it: git checkout docs/gpu-queue-state.json")
            for job in read_queue():
                mark = "done" if job["id"] in done else "ready" if runnable(job) else "waits (no init)"
                print(f"{job['id']:<34} {job['minutes']:>3} min  {mark}")
    except (RunError, OSError) as error:
        print(f"gpu_queue.py: error: {one_line(reason(error))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
