"""A package face whose names are imported when first used (PEP 562): `import structinit` and the
command's --help then load neither torch's models nor timm until a name needs them."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module
from typing import Any


def lazy_names(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package` that imports each of `names` from its module ({name: module},
    relative to the package) when first asked for."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(import_module(f".{names[name]}", package), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
