"""The README as a newcomer reads it: short, its tables narrow, its snippets the ones it promises, and its links
and those of docs/ pointing at files that exist. Every fenced block of it and of docs/ is run by
test_doc_blocks.py."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README.read_text(), flags=re.S)
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "studies").glob("*.md"))]


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
