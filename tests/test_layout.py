"""The package's size limits (docs/layout.md): no function over 60 lines, no class over 200, no module
over 350, so that each piece can be read at once. The import rules are import-linter's (`make lint`)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "structinit"
LIMITS = {"function": 60, "class": 200, "module": 350}


def too_long(path: Path) -> list[str]:
    """'file:line name (n lines)' for every function, class or module of `path` over its limit."""
    text = path.read_text()
    found = []
    if len(text.splitlines()) > LIMITS["module"]:
        found.append(f"{path.name} ({len(text.splitlines())} lines)")
    for node in ast.walk(ast.parse(text)):
        kind = {ast.FunctionDef: "function", ast.AsyncFunctionDef: "function", ast.ClassDef: "class"}.get(type(node))
        if kind and node.end_lineno - node.lineno + 1 > LIMITS[kind]:
            found.append(f"{path.name}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)")
    return found


def test_no_function_class_or_module_is_over_its_limit():
    found = [item for path in sorted(SRC.rglob("*.py")) for item in too_long(path)]
    assert not found, "over the size limits: " + ", ".join(found)


@pytest.mark.parametrize(
    "body, expected",
    [
        ("def f():\n" + "    x = 1\n" * 60, "f (61 lines)"),
        ("class C:\n" + "    x = 1\n" * 200, "C (201 lines)"),
        ("x = 1\n" * 351, "(351 lines)"),
    ],
)
def test_the_check_finds_what_is_over(tmp_path, body, expected):
    path = tmp_path / "m.py"
    path.write_text(body)
    assert any(item.endswith(expected) for item in too_long(path))
    path.write_text("def f():\n    return 1\n")
    assert too_long(path) == []
