"""The larger model weight selection reads: a timm model name with pretrained weights, a weights file
(read and checked as all weights entering are: weights_in), a structinit run directory (its
last.pt), a model, or a state dict. Each becomes a `Teacher`: its tensors, its head count where known,
and a description with the weights' sha256 that a report records."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..adapters import get_adapter, unwrap
from ..errors import first_line
from ..files import read_json_object, regular_file, weights_sha256
from ..report import recorded_heads
from ..weights_in import check_weights, read_weights, weights_suffix


@dataclass(frozen=True)
class Teacher:
    """A teacher's floating-point tensors by name, its heads per attention layer (None: its weights
    alone do not say), what it is and the sha256 of its weights."""

    state: dict[str, torch.Tensor]
    heads: int | None
    source: str
    sha256: str

    def record(self) -> dict[str, Any]:
        return {"teacher": self.source, "teacher_sha256": self.sha256}


def load_teacher(teacher: Any) -> Teacher:
    """The `Teacher` that `teacher` names or is (see the module's docstring); one-line errors."""
    if isinstance(teacher, nn.Module):
        return _from_module(unwrap(teacher), f"a {type(unwrap(teacher)).__name__} given in Python")
    if isinstance(teacher, Mapping):
        return _teacher(_tensors(teacher, "the state dict given"), None, "a state dict given in Python")
    if not isinstance(teacher, (str, Path)) or not str(teacher):
        raise TypeError(
            f"teacher must be a timm model name, a weights file, a run directory or a model, got {teacher!r}"
        )
    path = Path(teacher).expanduser()
    if path.is_dir():
        return _cached(str(path.resolve()), (path / "last.pt").stat().st_mtime_ns if (path / "last.pt").exists() else 0)
    if path.exists() or weights_suffix(path):
        if not path.exists():
            raise FileNotFoundError(f"teacher {teacher}: no such file")
        return _cached(str(path.resolve()), regular_file(path).st_mtime_ns)
    return _from_module(pretrained(str(teacher)), f"timm:{teacher} (pretrained)")


@functools.lru_cache(maxsize=1)
def _cached(path: str, mtime_ns: int) -> Teacher:
    """A teacher read from disk, kept until another is asked for (a grid builds many students from one)."""
    return _from_run(Path(path)) if Path(path).is_dir() else _from_file(Path(path))


def pretrained(name: str) -> nn.Module:
    """timm's model `name` with its pretrained weights (downloaded by timm, from the Hugging Face hub)."""
    import timm

    if not timm.is_model(name):
        raise ValueError(
            f"teacher {name!r} is neither a file, a run directory nor a timm model name (timm.list_models() lists them)"
        )
    try:
        return timm.create_model(name, pretrained=True)
    except (RuntimeError, OSError, ValueError) as error:
        raise ValueError(f"teacher {name}: timm could not load its pretrained weights ({first_line(error)})") from None


def _from_module(model: nn.Module, source: str) -> Teacher:
    try:
        heads = get_adapter(model).layers()[0].num_heads
    except (TypeError, ValueError, IndexError):
        heads = None  # not a family structinit reads heads from: the uniform rule needs none
    return _teacher(_tensors(model.state_dict(), source), heads, source)


def _from_file(path: Path) -> Teacher:
    state, _ = read_weights(path, "teacher")
    return _teacher(_tensors(state, str(path)), None, f"file {path.name}")


def _from_run(path: Path) -> Teacher:
    """A structinit run directory: the weights of its last.pt, its heads from init_report.json."""
    checkpoint = path / "last.pt"
    if not checkpoint.exists():
        raise FileNotFoundError(f"teacher {path}: a run directory without last.pt (has the run trained an epoch?)")
    state, _ = read_weights(checkpoint, "teacher")
    heads = None
    report = path / "init_report.json"
    if report.exists():
        fix = "restore it, or delete it (rule=heads then needs teacher_heads=N)"
        try:
            heads = recorded_heads(read_json_object(report, fix))
        except ValueError as error:
            raise ValueError(f"teacher {report} is damaged ({error}): {fix}") from None
    return _teacher(_tensors(state, str(checkpoint)), heads, f"run {path.name} (last.pt)")


def _tensors(state: Any, where: str) -> dict[str, torch.Tensor]:
    """The floating-point tensors of a teacher's weights, checked as every weights entering are (weights_in)."""
    check_weights(f"teacher {where}", state)
    return {name: t.detach().cpu() for name, t in state.items() if t.is_floating_point()}


def _teacher(state: dict[str, torch.Tensor], heads: int | None, source: str) -> Teacher:
    return Teacher(state, heads, source, weights_sha256(state))
