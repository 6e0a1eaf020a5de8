"""benchmarks/gpu_queue.py keeps the library's file rules: a damaged state or pid file is one line, no file is
written through a link, a poll or an absorb copies no link's target, and a refusal leaves every file as it was."""

import json
import os
import shutil
import sys

import pytest

from conftest import BENCHMARKS, load_benchmark
from structinit.errors import RunError

JOB = "table5-200ep-impulse-seed0"  # the queue's first job: its files are kept in docs/table5/200ep-impulse-seed0
RIVALS = "regimes-rivals"  # returns runs/**/metrics.jsonl, among others


def snapshot(root):
    """Every path under `root` (links as links) with a file's bytes: what must not change."""
    return {p: p.read_bytes() if p.is_file() and not p.is_symlink() else None for p in root.rglob("*")}


def one_line(capsys, *said):
    error = capsys.readouterr().err
    assert error.startswith("gpu_queue.py: error: ") and error.count("\n") == 1, error
    assert all(part in error for part in said), error


def came_back(tmp_path, done, files=()):
    """A poll's $OUT as it comes back: the state with `done`, and each (job, name, text) of `files`."""
    back = tmp_path / "out" / "gpu-queue"
    back.mkdir(parents=True)
    (back / "state.json").write_text(json.dumps({"done": done}))
    for job, name, text in files:
        (back / job / name).parent.mkdir(parents=True, exist_ok=True)
        (back / job / name).write_text(text)
    return back


def driver_here(work):
    """A work folder whose driver is this process (alive: `poll 0` returns at once)."""
    work.mkdir(exist_ok=True)
    (work / "pid").write_text(str(os.getpid()))
    return work


@pytest.mark.parametrize(
    ("name", "text", "said"),
    [
        ("pid", "garbage\n", "pid is damaged (not a process id)"),
        ("pid", "0", "pid is damaged (not a process id)"),
        ("pid", "9" * 30, "pid is damaged (not a process id)"),
        ("state.json", "{not json", "state.json is damaged"),
        ("state.json", '{"done": [1, 2]}', "state.json is damaged (not a record of jobs"),
        ("ended.json", '{"x": 5}', "ended.json is damaged (not a record of jobs"),
    ],
)
def test_a_damaged_pid_or_state_in_the_work_folder_is_one_line(tmp_path, capsys, monkeypatch, name, text, said):
    queue = load_benchmark("gpu_queue")
    work = driver_here(tmp_path / "work")
    (work / name).write_text(text)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    before = snapshot(tmp_path)
    assert queue.main(["poll", "0", "--work", str(work)]) == 2
    one_line(capsys, said)
    assert snapshot(tmp_path) == before


def test_a_poll_or_absorb_without_what_it_takes_is_one_line(tmp_path, capsys):
    queue = load_benchmark("gpu_queue")
    assert queue.main(["poll", "0", "--work", str(tmp_path / "none")]) == 2
    one_line(capsys, "no driver was started in", "start one")
    assert queue.main(["poll", "soon", "--work", str(driver_here(tmp_path / "work"))]) == 2
    one_line(capsys, "poll waits a number of seconds, not 'soon'")
    assert queue.main(["absorb"]) == 2
    one_line(capsys, "absorb takes the folder a poll's files came back in")
    assert queue.main(["absorb", str(tmp_path / "none")]) == 2
    one_line(capsys, "gpu-queue/state.json is missing: not a poll's $OUT")


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ("[1, 2]", "state.json is damaged (not a JSON object)"),
        ('{"done": {"x": 1}}', "state.json is damaged (not a record of jobs"),
        ('{"done": {"../../escaped": {"rc": 0}}}', "names jobs the queue lacks (['../../escaped'])"),
    ],
)
def test_a_damaged_poll_out_is_one_line_and_absorbs_nothing(tmp_path, capsys, monkeypatch, returned, said):
    queue = load_benchmark("gpu_queue")
    back = came_back(tmp_path, {}, [(JOB, "ledger.jsonl", "{}\n")])
    (back / "state.json").write_text(returned)
    (tmp_path / "state.json").write_text('{"done": {}}\n')
    monkeypatch.setattr(queue, "STATE", tmp_path / "state.json")
    before = snapshot(tmp_path)
    assert queue.main(["absorb", str(tmp_path / "out")]) == 2
    one_line(capsys, said)
    assert snapshot(tmp_path) == before


def test_a_damaged_committed_state_is_one_line_from_status_and_absorb(tmp_path, capsys, monkeypatch):
    queue = load_benchmark("gpu_queue")
    came_back(tmp_path, {JOB: {"rc": 0}})
    (tmp_path / "state.json").write_text('{"done": ')
    monkeypatch.setattr(queue, "STATE", tmp_path / "state.json")
    assert queue.main(["status"]) == 2
    one_line(capsys, "state.json is damaged", "git checkout docs/gpu-queue-state.json")
    assert queue.main(["absorb", str(tmp_path / "out")]) == 2
    one_line(capsys, "state.json is damaged")


def test_absorb_writes_no_state_through_a_link_and_copies_nothing_before_refusing(tmp_path):
    queue = load_benchmark("gpu_queue")
    came_back(tmp_path, {JOB: {"rc": 0}}, [(JOB, "ledger.jsonl", "{}\n")])
    (tmp_path / "elsewhere.json").write_text('{"done": {}}\n')  # a state, kept elsewhere
    (tmp_path / "state.json").symlink_to(tmp_path / "elsewhere.json")
    before = snapshot(tmp_path)
    with pytest.raises(RunError, match=r"state\.json is a link, and structinit writes no file through one"):
        queue.absorb(tmp_path / "out", tmp_path / "state.json", tmp_path / "repo")
    assert snapshot(tmp_path) == before  # not even the job's files


def test_absorb_copies_no_links_target_and_writes_through_no_link_in_the_checkout(tmp_path, capsys):
    queue = load_benchmark("gpu_queue")
    back = came_back(tmp_path, {JOB: {"rc": 0}}, [(JOB, "ledger.jsonl", "{}\n")])
    (tmp_path / "secret").write_text("not the job's")
    (back / JOB / "summary.json").symlink_to(tmp_path / "secret")
    root, state = tmp_path / "repo", tmp_path / "state.json"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "docs" / "table5").symlink_to(tmp_path / "outside")
    before = snapshot(tmp_path)
    with pytest.raises(RunError, match=r"docs/table5 is a link, and structinit writes no file through one"):
        queue.absorb(tmp_path / "out", state, root)
    assert snapshot(tmp_path) == before
    (root / "docs" / "table5").unlink()
    assert queue.absorb(tmp_path / "out", state, root) == [JOB]
    kept = root / "docs/table5/200ep-impulse-seed0"
    assert sorted(p.name for p in kept.iterdir()) == ["ledger.jsonl"]  # the link left out, and said
    assert f"{back / JOB / 'summary.json'} is a link: left out" in capsys.readouterr().err


def test_a_poll_copies_no_links_target_to_out_and_writes_no_state_through_a_link(tmp_path, capsys):
    queue = load_benchmark("gpu_queue")
    work = driver_here(tmp_path / "work")
    (work / "queue.log").write_text("log\n")
    (work / JOB).mkdir()
    (work / JOB / "ledger.jsonl").write_text("{}\n")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "key").write_text("not the job's")
    (work / JOB / "summary.json").symlink_to(tmp_path / "secret" / "key")
    (tmp_path / "secret" / "grid" / "run").mkdir(parents=True)
    (tmp_path / "secret" / "grid" / "run" / "metrics.jsonl").write_text("not the job's")
    (work / RIVALS).mkdir()
    (work / RIVALS / "runs").symlink_to(tmp_path / "secret")  # a returns pattern through a linked folder
    out = tmp_path / "out"
    (out / "gpu-queue").mkdir(parents=True)
    (out / "gpu-queue" / "state.json").symlink_to(tmp_path / "secret" / "key")
    with pytest.raises(RunError, match=r"gpu-queue/state\.json is a link"):
        queue.poll(work, 0, out)
    assert (tmp_path / "secret" / "key").read_text() == "not the job's"
    assert sorted(p.name for p in (out / "gpu-queue").iterdir()) == ["state.json"]  # nothing copied first
    (out / "gpu-queue" / "state.json").unlink()
    assert queue.poll(work, 0, out) == "running"
    copied = {str(p.relative_to(out / "gpu-queue")) for p in (out / "gpu-queue").rglob("*") if p.is_file()}
    assert copied == {"queue.log", "state.json", f"{JOB}/ledger.jsonl"}
    said = capsys.readouterr().err
    assert (
        f"{work / JOB / 'summary.json'} is a link: left out" in said and f"{work / RIVALS / 'runs'} is a link" in said
    )


def test_a_jobs_copy_takes_no_links_target(tmp_path, monkeypatch, capsys):
    queue = load_benchmark("gpu_queue")
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "ledger.jsonl").write_text("committed\n")
    (tmp_path / "secret").write_text("not the checkout's")
    (root / "docs" / "elsewhere").symlink_to(tmp_path / "secret")
    job = {"id": "j", "minutes": 1, "script": "x.py", "args": [], "keep": "docs/j", "copy": {"docs": "docs"}}
    (tmp_path / "queue.json").write_text(json.dumps({"jobs": [job]}))
    monkeypatch.setattr(queue, "QUEUE", tmp_path / "queue.json")
    monkeypatch.setattr(queue, "ROOT", root)
    monkeypatch.setattr(queue, "command", lambda job, out, smoke: [sys.executable, "-c", "pass"])
    (tmp_path / "work").mkdir()
    queue.drive(tmp_path / "work", minutes=5, smoke=False)
    assert sorted(p.name for p in (tmp_path / "work" / "j" / "docs").iterdir()) == ["ledger.jsonl"]
    assert f"{root / 'docs' / 'elsewhere'} is a link: left out" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"keep": "../outside"}, "a path of keep, copy or returns leads out of its folder"),
        ({"keep": "/tmp/outside"}, "a path of keep, copy or returns leads out of its folder"),
        ({"returns": ["../../**/*"]}, "a path of keep, copy or returns leads out of its folder"),
        ({"id": "../x"}, "its id names no folder"),
        ({"minutes": "12"}, "minutes missing or of another type"),
    ],
)
def test_a_queue_job_leading_out_of_its_folder_or_lacking_a_field_is_one_line(
    tmp_path, capsys, monkeypatch, change, said
):
    queue = load_benchmark("gpu_queue")
    jobs = json.loads((BENCHMARKS / "gpu_queue.json").read_text())["jobs"]
    jobs[0] = {**jobs[0], **change}
    (tmp_path / "queue.json").write_text(json.dumps({"jobs": jobs}))
    monkeypatch.setattr(queue, "QUEUE", tmp_path / "queue.json")
    assert queue.main(["status"]) == 2
    one_line(capsys, "queue.json is damaged", said)


def test_a_start_whose_data_cannot_be_unpacked_is_one_line_and_starts_nothing(tmp_path, capfd, monkeypatch):
    queue = load_benchmark("gpu_queue")
    root = tmp_path / "repo"
    (root / "benchmarks").mkdir(parents=True)
    shutil.copy(BENCHMARKS / "cifar_pack.py", root / "benchmarks")  # and no .gpu-data beside it
    monkeypatch.setattr(queue, "ROOT", root)
    monkeypatch.setattr(queue, "STATE", tmp_path / "no-state.json")
    assert queue.main(["start", "--work", str(tmp_path / "work")]) == 2
    error = capfd.readouterr().err  # cifar_pack.py's line comes from its process
    assert "cifar_pack.py: error: no CIFAR-10 pack in .gpu-data" in error
    assert error.endswith(
        "gpu_queue.py: error: cifar_pack.py could not unpack .gpu-data (its line above says why): carry a pack\n"
    )
    assert not (tmp_path / "work").exists()
