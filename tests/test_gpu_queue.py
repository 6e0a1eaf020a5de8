"""benchmarks/gpu_queue.py: the GPU work queue's whole path on a CPU, and what comes back absorbed once."""

import json
import sys

from conftest import load_benchmark


def test_the_queue_runs_its_jobs_at_smoke_size_and_absorbs_what_came_back(capsys):
    queue = load_benchmark("gpu_queue")
    assert queue.main(["--smoke"]) == 0  # start, poll until the driver ends, absorb: each job must end well
    assert "smoke: 2 jobs ran, came back and were absorbed" in capsys.readouterr().out


def test_absorb_takes_each_done_job_once_and_a_job_without_its_init_waits(tmp_path, capsys, monkeypatch):
    queue = load_benchmark("gpu_queue")
    back = tmp_path / "out" / "gpu-queue"
    (back / "table5-200ep-impulse-seed0").mkdir(parents=True)
    (back / "table5-200ep-impulse-seed0" / "ledger.jsonl").write_text('{"epoch": 1}\n')
    done = {"table5-200ep-impulse-seed0": {"rc": 0, "minutes": 11.5, "smoke": False}}
    (back / "state.json").write_text(json.dumps({"done": done}))
    state, root = tmp_path / "state.json", tmp_path / "repo"
    assert queue.absorb(tmp_path / "out", state, root) == ["table5-200ep-impulse-seed0"]
    assert (root / "docs/table5/200ep-impulse-seed0/ledger.jsonl").read_text() == '{"epoch": 1}\n'
    assert json.loads(state.read_text())["done"] == done
    assert queue.absorb(tmp_path / "out", state, root) == []  # the next window's poll brings it again: once
    assert next(j["id"] for j in queue.pending(json.loads(state.read_text())["done"])) == "table5-200ep-mimetic-seed0"
    later = {
        "id": "later",
        "minutes": 5,
        "script": "benchmarks/gpu_table5.py",
        "args": ["--inits", "xavier"],
        "keep": "x",
    }
    jobs = json.loads(queue.QUEUE.read_text())["jobs"] + [later]
    (tmp_path / "queue.json").write_text(json.dumps({"jobs": jobs}))
    monkeypatch.setattr(queue, "QUEUE", tmp_path / "queue.json")
    queue.main(["status"])
    listed = capsys.readouterr().out.splitlines()
    assert listed[-1].split() == ["later", "5", "min", "waits", "(no", "init)"]  # an init this checkout lacks


def test_a_job_longer_than_the_window_waits_and_the_shorter_ones_after_it_run(tmp_path, monkeypatch):
    queue = load_benchmark("gpu_queue")
    jobs = [
        {"id": name, "minutes": minutes, "script": "benchmarks/x.py", "args": [], "keep": f"docs/{name}"}
        for name, minutes in (("long", 12), ("short", 3), ("fills", 6), ("longer", 9))
    ]
    (tmp_path / "queue.json").write_text(json.dumps({"jobs": jobs}))
    monkeypatch.setattr(queue, "QUEUE", tmp_path / "queue.json")
    monkeypatch.setattr(queue, "command", lambda job, out, smoke: [sys.executable, "-c", "pass"])
    work = tmp_path / "work"
    work.mkdir()
    queue.drive(work, minutes=8, smoke=False)
    ended = json.loads((work / "ended.json").read_text())
    assert list(ended) == ["short", "fills"]  # 12 and 9 > 8 wait; 3 and 6 run (each in a moment here)
    assert all(e["rc"] == 0 for e in ended.values())
