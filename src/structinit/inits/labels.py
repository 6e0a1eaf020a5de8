"""Options written as text: `key=value` lists, and init labels that name a method with its options.

An init label is what `structinit train --init` and `structinit compare --inits` take, and what the
results tables show: a method ("impulse"), a named variant ("impulse-authors"), or either with
options in brackets ("impulse[target_fidelity=0.9,pos_scale=10]"). The label is the run's name, so
a grid can compare settings of one method side by side.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .convmixer import FILTER_METHODS
from .registry import METHODS, check_options

# Named settings of a method. `impulse` itself is the paper's form (sharp maps, position embedding x18,
# V/proj mimetic). `impulse-soft` is the setting chosen on the 64-token convergence protocol
# (docs/convergence.md): soft maps that barely reach images, position embedding and V/proj as the model
# has them; it was structinit's default from 144326c until the regime study (docs/regimes.md).
SOFT = {"target_fidelity": 0.3, "pos_scale": None, "vproj": "keep"}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "impulse-soft": ("impulse", SOFT),
    # The authors' impulse init (osiriszjq/structured_initialization, weight_init=skip with impulse_18_7_1):
    # their least-squares solver with Q/K x7, their ordered offsets, Q/K solved on all of the pseudo input,
    # on their base: every layer it does not set keeps PyTorch's default.
    "impulse-authors": (
        "impulse",
        {"solver": "authors", "assignment": "ordered", "blind_to_content": False, "base": "kaiming"},
    ),
}

# An option of every method's label: the f of the f x f kernel (initialize's kernel_size).
KERNEL_SIZE = "kernel_size"

# Not an init method: leave the model as its constructor made it (e.g. a ConvMixer reference row).
DEFAULT = "default"
# The methods a structured init is measured against (inits/baselines.py, and the model as constructed).
BASELINES = ("timm", "kaiming", "mimetic", DEFAULT)


def label_method(label: str) -> str:
    """The method a label names, its options unread: 'mimetic[base=kaiming]' -> 'mimetic',
    'impulse-soft' -> 'impulse' (a recorded label is named even where its options are no longer known)."""
    name = label.strip().partition("[")[0]
    return VARIANTS[name][0] if name in VARIANTS else name


def parse_assignments(text: str | None, what: str) -> dict[str, Any]:
    """'a=1,b=x,c=(32,48)' -> {'a': 1, 'b': 'x', 'c': (32, 48)}; values are Python literals or strings."""
    result: dict[str, Any] = {}
    if not text:
        return result
    for item in split_top_level(text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what}: expected key=value, got {item!r}")
        if key.strip() in result:
            raise ValueError(f"{what}: {key.strip()} is given twice")
        try:
            result[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            result[key.strip()] = value.strip()
    return result


def split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets, so that img_size=(32,48) or
    impulse[a=1,b=2] stays whole."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


@dataclass(frozen=True)
class InitSpec:
    """An init label, parsed: its method, the method's options (a variant's, then the label's own; read
    only) and the kernel size it names. 'default' is the method DEFAULT with no options."""

    label: str
    method: str
    options: Mapping[str, Any]
    kernel_size: int | None = None

    @classmethod
    def parse(cls, label: str) -> InitSpec:
        """E.g. 'impulse-authors[qk_scale=2,kernel_size=5]' -> method 'impulse', options {'solver':
        'authors', ..., 'qk_scale': 2}, kernel size 5. Unknown names and options raise ValueError. A
        label is read once per process: every later call returns the same spec."""
        return _parsed(label)

    @property
    def is_default(self) -> bool:
        """The model is left as its constructor made it."""
        return self.method == DEFAULT


@functools.cache
def _parsed(label: str) -> InitSpec:
    return read_label(label)


def read_label(label: str) -> InitSpec:
    """What InitSpec.parse returns, read from the text every time."""
    name, bracket, rest = label.strip().partition("[")
    if bracket and not rest.endswith("]"):
        raise ValueError(f"init label {label!r}: options go in brackets at the end, e.g. impulse[target_fidelity=0.9]")
    extra = parse_assignments(rest[:-1], f"init label {label!r}") if bracket else {}
    if name == DEFAULT:
        if extra:
            raise ValueError(f"init label {label!r}: {DEFAULT!r} takes no options")
        return InitSpec(label, DEFAULT, MappingProxyType({}))
    if name in VARIANTS:
        method, options = VARIANTS[name][0], {**VARIANTS[name][1], **extra}
    elif name in METHODS or name in FILTER_METHODS:
        method, options = name, extra
    else:
        known = sorted({*METHODS, *FILTER_METHODS, *VARIANTS, DEFAULT})
        hint = "options in brackets: impulse[a=1,b=2]"
        raise ValueError(f"unknown init {name!r}; choose from {', '.join(known)} ({hint})")
    kernel_size = options.pop(KERNEL_SIZE, None)
    check_options(method, options)
    return InitSpec(label, method, MappingProxyType(options), kernel_size)


def with_options(label: str, options: dict[str, Any]) -> str:
    """`label` with `options` added in its brackets (they override the label's own):
    ('impulse[a=1]', {'b': 2}) -> 'impulse[a=1,b=2]'."""
    if not options:
        return label
    name, bracket, rest = label.strip().partition("[")
    merged = {**(parse_assignments(rest[:-1], f"init label {label!r}") if bracket else {}), **options}
    text = ",".join(f"{k}={v if isinstance(v, str) else repr(v)}" for k, v in merged.items())
    return f"{name}[{text}]"
