"""No import circle inside a room (a subpackage): every import counts, at the top of a module, under
TYPE_CHECKING or inside a function (docs/layout.md: imports go one way). import-linter's contracts check
the floors between rooms; this checks inside them."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "structinit"


def imports_in_room(room: Path) -> dict[str, set[str]]:
    """Each module of `room` (by file stem) and the modules of the same room it imports, anywhere."""
    graph = {}
    for path in sorted(room.glob("*.py")):
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module:
                    found.add(node.module.split(".")[0])
                else:
                    found.update(alias.name for alias in node.names)
        graph[path.stem] = {m for m in found if (room / f"{m}.py").exists() and m != path.stem}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every module that can reach itself, with one path that does."""
    found = []
    for start in sorted(graph):
        paths, seen = [[start]], set()
        while paths:
            path = paths.pop()
            for nxt in sorted(graph.get(path[-1], ())):
                if nxt == start:
                    found.append([*path, start])
                    paths = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    paths.append([*path, nxt])
    return found


ROOMS = sorted(p for p in PACKAGE.rglob("*") if p.is_dir() and (p / "__init__.py").exists())


@pytest.mark.parametrize("room", ROOMS, ids=lambda p: p.relative_to(PACKAGE.parent).as_posix())
def test_no_import_circle_inside_a_room(room):
    graph = imports_in_room(room)
    graph.pop("__init__", None)  # a package's face imports its rooms' modules, which import none of it
    assert circles(graph) == []


def test_the_check_finds_a_circle_through_a_function_level_import(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "c.py").write_text("from .a import x\n")
    assert circles(imports_in_room(tmp_path)) == [["a", "b", "a"], ["b", "a", "b"]]


def test_the_methods_named_without_the_registry_are_the_registrys():
    from structinit.inits.names import FILTER_METHODS, METHOD_NAMES
    from structinit.inits.registry import METHODS

    assert tuple(METHODS) == METHOD_NAMES and FILTER_METHODS == ("random", "impulse", "box")


@pytest.mark.parametrize("command", ["train", "compare", "choose", "init", "attention", "demo"])
def test_help_loads_neither_torch_nor_timm(command):
    """`--help` of every command answers without importing torch or timm (5-7 s before 0.3.2)."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom structinit.cli import main\ntry:\n    main([sys.argv[1], '--help'])\n"
        "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'timm') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code, command], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]" and "usage: structinit" in out


def test_every_name_of_the_lazy_faces_is_what_it_names_after_every_module_is_loaded():
    """A face's name that is also one of its modules' names would become the module once it is imported."""
    import importlib
    import pkgutil
    import types

    import structinit

    for module in pkgutil.walk_packages(structinit.__path__, "structinit."):
        if not module.name.startswith("structinit.cli") and ".__main__" not in module.name:
            importlib.import_module(module.name)
    for face in ("structinit", "structinit.inits", "structinit.training"):
        package = importlib.import_module(face)
        for name in package.__all__:
            assert not isinstance(getattr(package, name), types.ModuleType), f"{face}.{name}"
