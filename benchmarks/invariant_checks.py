"""The invariant harness's scratch trees and checks (invariants.py): the fixtures a case starts from (a trained run,
an init file, an image folder, a config), each drawn path made in its state, the command run in a forked child
(zygote.py), and the rules every case keeps, checked on the tree's digest before and after."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import zlib
from pathlib import Path

from invariant_cases import LAZY_FIXTURES, RUN, TINY, Case

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 120.0  # a base case takes seconds; one that has not ended by then hangs
ADDRESS_SPACE = 8 << 30  # the child's address space beyond the zygote's: a runaway allocation fails there
MEMORY_BOUND = 2 << 30  # resident growth a case may reach: every base request is tiny (refusing a big one is fine)
HUGE = 64 << 30  # a sparse file's apparent size
TORCH_TMP = "tmp/torchinductor_"  # torch.compile's precompiled headers: in $TMPDIR whatever its cache dir is
ERROR_LINE = re.compile(r"^structinit [\w-]+: error: \S")


class Zygote:
    """The fork server (zygote.py), started once: imports torch, timm and the command, then forks a case."""

    def __init__(self, cache: Path):
        cache.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "STRUCTINIT_CACHE": str(cache), "MPLCONFIGDIR": str(cache / "matplotlib")}
        env.update(XDG_CACHE_HOME=str(cache / "xdg"), TORCH_HOME=str(cache / "torch"), HF_HOME=str(cache / "hf"))
        env.update(TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"), TRITON_CACHE_DIR=str(cache / "triton"))
        env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent / "src"), env.get("PYTHONPATH", "")])
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "zygote.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        self.rss = json.loads(self.process.stdout.readline())["rss"]

    def run(self, argv: list[str], cwd: Path, env: dict[str, str], out: Path, timeout: float = TIMEOUT_S) -> dict:
        request = dict(argv=argv, cwd=str(cwd), env=env, timeout=timeout, memory=ADDRESS_SPACE)
        request.update(stdout=str(out / "stdout"), stderr=str(out / "stderr"))
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = json.loads(self.process.stdout.readline())
        answer["stdout"], answer["stderr"] = (out / "stdout").read_text(), (out / "stderr").read_text()
        return answer

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


class Scratch:
    """A fresh tree a case: work/ (the command's directory), outside/ (what links point at), home/ and tmp/."""

    def __init__(self, root: Path, zygote: Zygote):
        self.root, self.fixtures, self.zygote = root, root / "fixtures", zygote
        if not (self.fixtures / "ready").exists():
            _make_fixtures(self.fixtures, zygote)

    def make(self, case: Case) -> Path:
        tree = self.root / "case"
        if tree.exists():
            _remove(tree)
        for name in ("work", "outside", "home", "tmp"):
            (tree / name).mkdir(parents=True)
        shutil.copytree(self.fixtures / "run", tree / "work" / "run")
        for name, argv in LAZY_FIXTURES.items():  # a grid or a comparison: made once, where a line names it
            if name in case.argv:
                if not (self.fixtures / name / ".ready").exists():
                    _run_fixture(argv, self.fixtures, self.zygote)
                    (self.fixtures / name / ".ready").write_text("")
                shutil.copytree(self.fixtures / name, tree / "work" / name, ignore=shutil.ignore_patterns(".ready"))
        rng = zlib.crc32(" ".join(case.argv).encode())
        for place, state in case.states.items():
            make_state(state, case.roles[place], tree / "work" / place, tree / "outside", self.fixtures, rng)
        return tree


def _make_fixtures(fixtures: Path, zygote: Zygote) -> None:
    from invariant_states import make_images

    if fixtures.exists():
        _remove(fixtures)
    fixtures.mkdir(parents=True)
    for argv in (["train", *RUN, "--out", "run"], ["init", "vit_digits", *TINY, "--save", "init.safetensors"]):
        _run_fixture(argv, fixtures, zygote)
    make_images(fixtures / "images")
    config = (fixtures / "run" / "config.yaml").read_text()
    (fixtures / "config.yaml").write_text(re.sub(r"(?m)^out: .*$", "out: cfg_out", config))
    (fixtures / "ready").write_text("")


def _run_fixture(argv: list[str], fixtures: Path, zygote: Zygote) -> None:
    answer = zygote.run(argv, fixtures, {"HOME": str(fixtures), "TMPDIR": str(fixtures)}, fixtures, 600)
    if answer["rc"] != 0:
        raise SystemExit(f"invariants: the fixture `structinit {' '.join(argv)}` failed: {answer['stderr'][-500:]}")


def make_state(state: str, role: str, path: Path, outside: Path, fixtures: Path, rng: int) -> None:
    """`path` in `state`: a generic hostile object, or the role's fixture valid or damaged."""
    from invariant_states import ROLE_BUILDERS, valid

    if state == "absent":
        return
    if state in ("empty-file", "garbage-file", "existing-file"):
        path.write_bytes({"empty-file": b"", "garbage-file": b"\x00\xff{garbage" * 64}.get(state, b"precious\n"))
    elif state == "fifo":
        os.mkfifo(path)
    elif state == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(os.path.relpath(path))
    elif state == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero: endless bytes
        except PermissionError:
            path.symlink_to("/dev/zero")
    elif state in ("link-outside", "link-outside-dir"):
        valid(role, outside / path.name, fixtures)
        path.symlink_to(outside / path.name)
    elif state == "dangling-link":
        path.symlink_to(outside / f"missing-{path.name}")
    elif state == "empty-dir":
        path.mkdir()
    elif state == "sparse-huge":
        with open(path, "wb") as f:
            f.truncate(HUGE)
    else:
        ROLE_BUILDERS[state](role, path, fixtures, rng)


def digest(tree: Path) -> dict[str, str]:
    """Each path under `tree` (links not followed) -> its kind and content (a large file: size and first MB)."""
    found = {}
    for folder, dirs, files in os.walk(tree):
        for name in dirs + files:
            path = Path(folder) / name
            info = path.lstat()
            key = str(path.relative_to(tree))
            if stat.S_ISLNK(info.st_mode):
                found[key] = f"link {os.readlink(path)}"
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    head = f.read(1 << 20)
                found[key] = f"file {info.st_size} {hashlib.sha256(head).hexdigest()[:16]}"
            else:
                found[key] = "dir" if stat.S_ISDIR(info.st_mode) else f"special {stat.S_IFMT(info.st_mode)}"
    return found


def outputs(case: Case) -> list[str]:
    """The paths (relative to work/) the command names as its outputs: its --out, --save, --json, --cache-dir, the
    checkpoints it upgrades, --data-root with --download, and a --config's out."""
    from structinit.cli.parser import build_parser

    args, _ = build_parser().parse_known_args(case.argv)
    named = [getattr(args, name, None) for name in ("out", "save", "json", "cache_dir")]
    named += list(getattr(args, "checkpoints", None) or [])
    if getattr(args, "download", None):
        named.append(getattr(args, "data_root", None))
    if getattr(args, "config", None):
        named.append("cfg_out")
    if case.command == "train" and getattr(args, "out", None) is None:
        named.append("runs/run")
    return [str(Path(n)) for n in named if n and n != "-"]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a case ended (exit status, seconds, its last line on standard error) and the rules it broke."""

    failures: list[str]
    rc: int
    seconds: float
    said: str


def check(case: Case, scratch: Scratch, zygote: Zygote, timeout: float = TIMEOUT_S) -> Outcome:
    """How `case` ended and the rules it broke (none: it kept them all)."""
    tree = scratch.make(case)
    before = digest(tree)
    env = {"HOME": str(tree / "home"), "TMPDIR": str(tree / "tmp")}
    answer = zygote.run(case.argv, tree / "work", env, tree, timeout)
    changed = {p for p in _changed(before, digest(tree), {"stdout", "stderr"}) if not p.startswith(TORCH_TMP)}
    failures = []
    lines = [line for line in answer["stderr"].splitlines() if line.strip()]
    if answer["timed_out"]:
        failures.append(f"no end in {timeout:.0f} s")
    elif answer["rc"] not in (0, 2):
        failures.append(f"exit {answer['rc']}: {(lines or [''])[-1][:200]}")
    if "Traceback (most recent call last)" in answer["stderr"]:
        failures.append(f"traceback: {(lines or [''])[-1][:200]}")
    if answer["rc"] == 2 and not answer["timed_out"]:
        errors = [line for line in lines if ERROR_LINE.match(line)]
        if len(errors) != 1 or lines[-1] != errors[0]:
            failures.append(f"a refusal of {len(errors)} error lines: {lines[-3:]}")
        if changed:
            failures.append(f"a refusal changed {sorted(changed)[:5]}")
    if answer["rc"] == 0:
        allowed = [f"work/{name}" for name in outputs(case)]
        stray = [p for p in changed if not any(p == a or p.startswith(a + "/") for a in allowed)]
        if stray:
            failures.append(f"wrote outside its outputs {allowed}: {sorted(stray)[:5]}")
    grown = answer["maxrss"] - zygote.rss
    if grown > MEMORY_BOUND:
        failures.append(f"memory grew {grown / 2**30:.1f} GiB for a small request")
    return Outcome(failures, answer["rc"], answer.get("seconds", 0.0), (lines or [""])[-1][:200])


def _changed(before: dict[str, str], after: dict[str, str], ignore: set[str]) -> set[str]:
    return {p for p in before.keys() | after.keys() if before.get(p) != after.get(p) and p not in ignore}


def _remove(tree: Path) -> None:
    """Remove a scratch tree whatever it holds (links not followed, read-only folders opened first)."""
    for folder, dirs, _ in os.walk(tree):
        for name in dirs:
            path = Path(folder) / name
            if not path.is_symlink():
                path.chmod(0o755)
    shutil.rmtree(tree)
