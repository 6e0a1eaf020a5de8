"""The small-data study script, in its --smoke mode, on a generated 32 px ImageFolder."""

import csv
import json
import shutil

import pytest

from conftest import SHARP, load_benchmark, make_imagefolder


@pytest.fixture
def smoke_study(tmp_path):
    """The study module, its --out and the arguments of a --smoke study on a generated 2-class folder."""
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=["a", "b"])
    out = tmp_path / "study"
    return load_benchmark("study_small_data"), out, ["--smoke", "--data", f"imagefolder:{data}", "--out", str(out)]


def test_smoke_study_runs_every_grid_writes_the_docs_and_resumes(tmp_path, capsys):
    study = load_benchmark("study_small_data")
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=[f"c{i}" for i in range(3)])
    out = tmp_path / "study"
    args = ["--smoke", "--data", f"imagefolder:{data}", "--out", str(out), "--part", "all"]
    assert study.main(args) == 0
    docs = out / "docs"
    with open(docs / "results.csv") as f:
        rows = list(csv.DictReader(f))
    labels = {(r["grid"], r["init"]) for r in rows}
    assert labels == {
        ("vit-h12", "timm"),
        ("vit-h12", "impulse-neurips[base=keep]"),
        ("vit-h12", SHARP),
        ("vit-h12", "mimetic"),  # the extended grid, in the protocol's grid directory
        ("convmixer", "default"),
        ("levers-h12", "impulse[target_fidelity=0.9,pos_scale=18.0,vproj=mimetic,base=keep]"),
        ("rivals-h12", "conditioned"),
    }
    assert all(r["per_class"] == "8" and r["epochs"] == "1" and 0 <= float(r["top1"]) <= 100 for r in rows)
    assert {r["dataset"] for r in rows} == {"images"}  # imagefolder:PATH is named by its folder
    assert {r["heads"] for r in rows if r["grid"] != "convmixer"} == {"12"}
    results = (docs / "studies" / "small-data.md").read_text()
    assert results.count("<!-- tables:begin -->") == 1 and "### vit-h12 (cpu-quick)" in results
    assert "| impulse-neurips[base=keep] | 1 |" in results and (docs / "figures" / "curves-vit-h12.png").exists()
    levers = results[results.index("### levers-h12") :]
    assert (
        "| impulse[target_fidelity=0.9,pos_scale=18.0,vproj=mimetic,base=keep] | 1 |" in levers
        and "| timm | 1 |" in levers
    )  # beside the reference
    rivals = results[results.index("### rivals-h12") :]
    assert "| conditioned | 1 |" in rivals and "| timm | 1 |" in rivals
    assert "Finished protocol and extended runs: 5," in results  # levers and rivals are not the protocol's
    assert (docs / "figures" / "attention-impulse-init.png").exists()
    assert (docs / "figures" / "attention-impulse-trained.png").exists()

    # hand-written text around the tables survives a rerun, which trains nothing new
    (docs / "studies" / "small-data.md").write_text("# Study\n\nanalysis\n\n" + results + "\nmore analysis\n")
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/*/*/summary.json")}
    capsys.readouterr()
    assert study.main(args) == 0
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*/*/summary.json")} == before
    rewritten = (docs / "studies" / "small-data.md").read_text()
    assert rewritten.startswith("# Study\n\nanalysis\n") and rewritten.endswith("more analysis\n")
    row = "| impulse-neurips[base=keep] | 1 |"
    assert rewritten.count(row) == results.count(row) >= 1  # not duplicated


def test_a_study_resumes_from_its_ledger_on_a_checkout_without_run_directories(smoke_study):
    study, out, args = smoke_study
    assert study.main([*args, "--part", "all"]) == 0
    docs = out / "docs"
    listed, ledger = (docs / "results.csv").read_text(), (docs / "results-runs.jsonl").read_text()
    assert len(ledger.splitlines()) == len(listed.splitlines()) - 1 == 7 and '"curve": [[1, ' in ledger
    for grid in ("vit-h12", "convmixer", "levers-h12", "rivals-h12"):  # a fresh clone has no runs/
        shutil.rmtree(out / grid)
    assert study.main([*args, "--part", "docs"]) == 0
    assert (docs / "results.csv").read_text() == listed and (docs / "results-runs.jsonl").read_text() == ledger
    assert study.main([*args, "--part", "all"]) == 0
    assert not list(out.glob("*/*/*/summary.json"))  # nothing trained again
    assert (docs / "results.csv").read_text() == listed

    # a run the ledger holds from another recipe (or data) is refused, not averaged with this one's
    rows = [json.loads(line) for line in ledger.splitlines()]
    rows[0]["recipe_hash"] = "0" * 12
    (docs / "results-runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        SystemExit, match=f"results-runs.jsonl holds {rows[0]['grid']} 8/class {rows[0]['init']} seed 0 from another"
    ):
        study.main([*args, "--part", "all"])


def test_smoke_theory_fills_the_tables_and_ranks(tmp_path):
    theory = load_benchmark("theory")
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=[f"c{i}" for i in range(3)])
    out = tmp_path / "theory"
    assert theory.main(["--smoke", "--data", f"imagefolder:{data}", "--out", str(out)]) == 0
    text = (out / "docs" / "theory.md").read_text()
    for row in ("| trained |", "| random (frozen) |", "| impulse (frozen) |", "| box (frozen) |", "| mimetic |"):
        assert row in text
    assert "| 2 heads (dim 8) | 4 heads (dim 4) |" in text and "- |" not in text.split("Stable rank")[0]
    assert "| ConvMixer width 16, 3x3, trained filters |" in text and "| ViT width 16, 4 heads, impulse init |" in text
    assert (out / "docs" / "figures" / "theory.png").exists() and (
        out / "docs" / "figures" / "theory-rank-1.png"
    ).exists()


def test_smoke_families_runs_swin_and_mixer_and_writes_their_tables(tmp_path):
    families = load_benchmark("families")
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=[f"c{i}" for i in range(3)])
    assert families.main(["--smoke", "--data", f"imagefolder:{data}", "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "docs" / "families.md").read_text()
    for name, model in (("swin", "swin_d6_p2_w4"), ("mixer", "mixer_d6_p4")):
        section = text[text.index(f"### {name} ({model}, ") :]
        assert f"**images**, {model}, " in section and "| impulse | 1 |" in section and "| timm | 1 |" in section
    assert "| impulse | window pseudo input (per head) | 0.980 | 0.980 | " in text
    assert "| impulse | unit impulses (per token mixer) | 1.000 | 1.000 | " in text


def test_smoke_families_new_part_trains_beit_and_a_rotary_vit_in_their_own_section(tmp_path):
    families = load_benchmark("families")
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=[f"c{i}" for i in range(3)])
    args = ["--smoke", "--part", "new", "--data", f"imagefolder:{data}", "--out", str(tmp_path / "out")]
    assert families.main(args) == 0
    text = (tmp_path / "out" / "docs" / "families.md").read_text()
    new = text[text.index("<!-- new-families:begin -->") : text.index("<!-- new-families:end -->")]
    for name, model in (("beit", "beit_base_patch16_224"), ("rope", "vit_small_patch16_rope_224")):
        section = new[new.index(f"### {name} ({model}, ") :]
        assert all(f"| {init} | 1 |" in section for init in ("impulse", "kaiming", "timm"))
    assert "| impulse | uniform image (per head) | 0.980 | 0.980 | " in new
    assert "| impulse | pseudo input, rotated (per head) | 0.980 | 0.980 | " in new


def test_smoke_timing_runs_one_fresh_run_per_protocol_cell_and_reproduces_the_docs(smoke_study, capsys):
    study, out, args = smoke_study
    assert study.main([*args, "--part", "protocol"]) == 0
    with open(out / "docs" / "results.csv") as f:
        listed = {(r["grid"], r["init"]): r["top1"] for r in csv.DictReader(f)}
    docs_before = (out / "docs" / "results.csv").stat().st_mtime_ns
    stale = out / "timing" / "stale.txt"
    stale.parent.mkdir(parents=True)
    stale.write_text("an earlier timing")
    capsys.readouterr()
    assert study.main([*args, "--part", "timing"]) == 0
    printed = capsys.readouterr().out
    assert not stale.exists()  # a timing starts from nothing: finished runs would be skipped, not timed
    runs = sorted(p.parent.relative_to(out / "timing").as_posix() for p in out.glob("timing/*/*/*/summary.json"))
    assert runs == ["convmixer-8/per_class_8/default-seed0", "vit-h12-8/per_class_8/timm-seed0"]
    # the extended grid's cell is the protocol's (same model and subset size): timed once, projected for both
    table = [line.strip("| ").split(" | ") for line in printed.splitlines() if line.startswith("| ")]
    cells = {(row[0], row[1]): row for row in table}
    assert set(cells) >= {("protocol", "vit-h12"), ("protocol", "convmixer"), ("extended", "vit-h12")}
    # a fresh run reproduces the top-1 the study recorded for the same cell and seed, to the digit
    vit = cells["protocol", "vit-h12"]
    assert vit[6] == f"{float(listed['vit-h12', 'timm']):.2f} (timm)" and float(vit[7]) == float(vit[6].split()[0])
    assert "Projected protocol wall-clock:" in printed and "Projected extended wall-clock:" in printed
    assert (out / "docs" / "results.csv").stat().st_mtime_ns == docs_before  # timing writes no docs


def test_mechanism_conditioning_builds_its_upsampled_vit_as_the_trainer_does(tmp_path, monkeypatch, capsys):
    """The ViT-T/16 row (224 px, fed upsampled 32 px images), one block deep: the trainer's img_size
    check once stopped this part."""
    mechanism = load_benchmark("bench_mechanism")
    data = make_imagefolder(tmp_path / "images", 32, per_class=200, classes=["a", "b"])  # the part's subset size
    name, arch, kwargs, size = mechanism.CONDITIONING_ROWS[-1]
    assert size == 224
    monkeypatch.setattr(mechanism, "CONDITIONING_ROWS", [(name, arch, {**kwargs, "depth": 1}, size)])
    monkeypatch.setattr(
        mechanism,
        "CONDITIONING_INITS",
        ["timm", SHARP],
    )
    assert mechanism.main(["--part", "conditioning", "--data", f"imagefolder:{data}"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith(f"| {name} |")]
    assert [row[1] for row in rows] == ["timm", SHARP]
    assert float(rows[1][3]) > 0.97  # the sharp form reaches its fidelity on the pseudo input


@pytest.mark.parametrize("script", ["study_small_data", "study_convergence", "study_regimes", "study_selection"])
def test_study_commands_from_a_clean_clone_leave_the_committed_docs_and_say_what_is_missing(script, tmp_path):
    """--part docs where no runs are (a clean clone) would rewrite the committed tables of runs trained
    elsewhere as "not trained yet": refused in one line, nothing written; --smoke without the data: one line."""
    module = load_benchmark(script)
    docs = module.ROOT / "docs"
    before = {p: p.stat().st_mtime_ns for p in docs.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit, match=rf"^{script}.py: --part docs: {tmp_path}/runs holds no finished runs"):
        module.main(["--part", "docs", "--out", str(tmp_path / "runs")])
    assert {p: p.stat().st_mtime_ns for p in docs.rglob("*") if p.is_file()} == before
    missing = f"cifar10:{tmp_path}/nowhere"
    with pytest.raises(SystemExit, match=rf"^{script}.py: --data {missing}: {tmp_path}/nowhere is not a folder"):
        module.main(["--smoke", "--data", missing, "--out", str(tmp_path / "smoke")])
    assert not (tmp_path / "smoke").exists()


@pytest.mark.parametrize(
    "script, written",
    [
        ("study_small_data", "results.csv"),
        ("study_convergence", "convergence.csv"),
        ("study_regimes", "regimes.csv"),
        ("study_selection", "selection-runs.jsonl"),
    ],
)
def test_a_link_where_a_study_writes_is_refused_in_one_line_before_it_trains(script, written, tmp_path):
    """A CSV or ledger path that is a link: met after training, the CSV was written through it (its target
    overwritten) and the ledger a traceback; it is refused in one line first, every file as it was."""
    module = load_benchmark(script)
    classes = module.TEACHER_CLASSES + module.STUDENT_CLASSES if script == "study_selection" else ["a", "b"]
    data = make_imagefolder(tmp_path / "images", 32, per_class=8, classes=classes)
    out, target = tmp_path / "out", tmp_path / "elsewhere.txt"
    target.write_text("")  # an empty ledger reads as no runs
    (out / "docs").mkdir(parents=True)
    (out / "docs" / written).symlink_to(target)
    with pytest.raises(SystemExit, match=rf"^{script}.py: error: {out}/docs/{written} is a link, and structinit wr"):
        module.main(["--smoke", "--data", f"imagefolder:{data}", "--out", str(out)])
    assert target.read_text() == "" and (out / "docs" / written).is_symlink()
    assert {p.relative_to(out).as_posix() for p in out.rglob("*")} == {"docs", f"docs/{written}"}  # nothing else
