"""A fork server for the invariant harness (invariants.py): one process imports torch, timm and the command once,
then runs each `structinit` command it is sent in a forked child (a second each instead of five to import),
in its own directory and process group, under an address-space limit and a timeout, with its output in files.

Requests and answers are JSON lines on standard input and output:

    {"argv": [...], "cwd": DIR, "env": {...}, "timeout": S, "memory": BYTES, "stdout": F, "stderr": F}
    -> {"rc": N, "timed_out": false, "maxrss": BYTES, "seconds": S}

Run as `python benchmarks/zygote.py`; it answers until its input ends.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import resource
import signal
import sys
import tempfile
import time
import traceback


def child(request: dict) -> None:
    """The command in this (forked) process; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own group: a timeout kills the processes it started too
        os.chdir(request["cwd"])
        os.environ.update(request["env"])
        tempfile.tempdir = None  # TMPDIR read again
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        limit = _status("VmSize") + request["memory"]
        if soft == resource.RLIM_INFINITY or limit < soft:
            resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
        for fd, name in ((1, "stdout"), (2, "stderr")):
            target = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
        sys.stdin = open(os.devnull)  # noqa: SIM115  (a command that reads its input gets none)
        from structinit.cli import main

        code = main(request["argv"])
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:  # what the command let escape: the harness reads the traceback
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()  # as a process that ends: multiprocessing's finalizers (its semaphores), ...
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def run(request: dict) -> dict:
    """Fork, wait at most request["timeout"] seconds (then kill the child's group), and report."""
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        child(request)
    deadline, timed_out = started + request["timeout"], False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            timed_out = True
            _kill_group(pid)
            _, status, usage = os.wait4(pid, 0)
            break
        time.sleep(0.02)
    _kill_group(pid)  # what it left running
    rc = os.waitstatus_to_exitcode(status)
    return {"rc": rc, "timed_out": timed_out, "maxrss": usage.ru_maxrss * 1024, "seconds": time.monotonic() - started}


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _status(field: str) -> int:
    """A size from /proc/self/status (VmSize, VmRSS), in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    import torch

    torch.set_num_threads(1)  # before any op: no thread pool exists when the children are forked
    import structinit.cli.commands
    import structinit.training.run  # noqa: F401  (the trainer, timm's models and data: loaded once)

    print(json.dumps({"ready": os.getpid(), "rss": _status("VmRSS")}), flush=True)
    for line in sys.stdin:
        print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
