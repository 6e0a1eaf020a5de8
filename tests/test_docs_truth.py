"""The docs say what the code is (issue 68): every module path a doc names exists, and docs/layout.md
lists every module of the package."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "structinit"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_module_path_a_doc_names_exists():
    named = {
        (doc.relative_to(ROOT).as_posix(), path)
        for doc in DOCS
        for path in re.findall(r"structinit/[\w/]+\.py", doc.read_text())
    }
    missing = sorted((doc, path) for doc, path in named if not (ROOT / "src" / path).exists())
    assert not missing, f"docs name modules that do not exist: {missing}"


def test_the_layout_lists_every_module():
    layout = (ROOT / "docs" / "layout.md").read_text()
    listed = set(re.findall(r"[\w]+\.py", layout))
    modules = {p.name for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    assert not sorted(modules - listed), f"docs/layout.md lists no {sorted(modules - listed)}"
