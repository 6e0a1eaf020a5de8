"""The recipe presets (--preset): YAML files of settings in the structinit.presets package."""

from __future__ import annotations

from importlib import resources
from typing import Any

from .settings_yaml import load_yaml


def presets() -> list[str]:
    return sorted(p.name.removesuffix(".yaml") for p in resources.files("structinit.presets").iterdir())


def load_preset(name: str) -> dict[str, Any]:
    if name not in presets():
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(presets())}")
    return load_yaml(resources.files("structinit.presets").joinpath(f"{name}.yaml").read_text())
