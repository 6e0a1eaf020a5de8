"""The README as a newcomer reads it: short, its tables narrow, its links and those of docs/ pointing at
files that exist, and every snippet run: the Python block as a script, each `structinit` line on a small
image folder (a tiny model and one epoch appended), each `make` line a target whose recipe is tested."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_imagefolder

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README.read_text(), flags=re.S)
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "studies").glob("*.md"))]
TINY = ["--img-size", "16", "--model-kwargs", "patch_size=4,embed_dim=32,depth=1,num_heads=2", "--epochs", "1"]
TINY += ["-b", "8", "--quiet"]


def test_the_readme_is_short_and_its_tables_narrow():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    assert [line for line in lines if line.startswith("|") and len(line) > 200] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file(page):
    targets = re.findall(r"\]\(([^)\s]+)\)", page.read_text())
    local = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]
    assert [t for t in local if not (page.parent / t).exists()] == []


def test_the_readme_has_the_snippets_it_promises():
    assert [language for language, _ in BLOCKS] == ["bash", "python", "bash", "bash"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("readme")
    make_imagefolder(folder / "my_images", 16, per_class=10, classes=("a", "b", "c"))
    return folder


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_snippet_runs(index, folder):
    language, code = BLOCKS[index]
    if language == "python":
        done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]
        return
    makefile = (ROOT / "Makefile").read_text()
    for line in code.splitlines():
        words = shlex.split(line, comments=True)
        if words[0] == "make":  # the demo's command is run for one epoch by test_cli's demo test
            recipe = re.search(rf"^{words[1]}: .*\n\t(.*)", makefile, flags=re.M).group(1)
            assert recipe.split()[0] in ("$(VENV)/bin/structinit", "$(VENV)/bin/python"), recipe
            continue
        assert words[0] == "structinit", f"only structinit and make commands belong in a bash block: {line}"
        command = [sys.executable, "-m", "structinit", *words[1:], *TINY]
        done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-3000:]


def test_the_python_block_of_methods_md_runs_on_a_small_vit(make_vit):
    """docs/methods.md's three ways of naming options, on a 2-block ViT: each gives the same report."""
    import structinit

    page = (ROOT / "docs" / "methods.md").read_text()
    block = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert block.count("structinit.initialize(") == 3
    reports = []
    for line in block.strip().splitlines():
        model = make_vit()
        reports.append(eval(line.split("  #")[0], {"structinit": structinit, "model": model}))
    assert (
        len({(round(r.min_fidelity, 6), r.options["assignment"], r.options["target_fidelity"]) for r in reports}) == 1
    )
