"""Options written as text: `key=value` lists, and init labels that name a method with its options.

An init label is what `structinit train --init` and `structinit compare --inits` take, and what the
results tables show: a method ("impulse"), a named variant ("impulse-authors"), or either with
options in brackets ("impulse[target_fidelity=0.9,pos_scale=10]"). The label is the run's name, so
a grid can compare settings of one method side by side.
"""

from __future__ import annotations

import ast
import functools
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .names import FILTER_METHODS, METHOD_NAMES
from .options import ImpulseOptions

# Named settings of a method. `impulse` itself is the paper's text (options.ImpulseOptions' defaults: Q/K
# alone at the sharpness of the paper's own solve, on PyTorch's base). `impulse-neurips` is the official
# NeurIPS code's init (osiriszjq/structured_initialization, weight_init=skip with impulse_18_7_1): its
# least-squares solver with Q/K x7, its ordered offsets, Q/K solved on all of the pseudo input, the position
# embedding x18 and V/proj mimetic, on PyTorch's base. `impulse-soft` is the setting chosen on the 64-token
# protocol (docs/convergence.md): soft maps that barely reach images, on the model's own weights.
NEURIPS = {"solver": "authors", "assignment": "ordered", "blind_to_content": False, "pos_scale": 18.0}
NEURIPS |= {"vproj": "mimetic", "base": "kaiming"}
SOFT = {"target_fidelity": 0.3, "pos_scale": None, "vproj": "keep", "base": "keep"}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "impulse-neurips": ("impulse", NEURIPS),
    "impulse-soft": ("impulse", SOFT),
}
# Names of structinit 0.2 and what they are called now (read with a one-line note).
RENAMED = {"impulse-authors": "impulse-neurips"}
RENAMED_IN = "0.3.0"
# What a label of the impulse method meant before RENAMED_IN: these defaults, where it gave no other value.
IMPULSE_BEFORE = ImpulseOptions.before

# An option of every method's label: the f of the f x f kernel (initialize's kernel_size).
KERNEL_SIZE = "kernel_size"

# Not an init method: leave the model as its constructor made it (e.g. a ConvMixer reference row).
DEFAULT = "default"
# The trainer's default: the default init of the model's family (registry.default_label), chosen for ViTs
# by the rule of docs/studies/default-rule.md.
AUTO = "auto"
# The methods a structured init is measured against (inits/baselines.py, and the model as constructed).
BASELINES = ("timm", "kaiming", "mimetic", DEFAULT)


def label_method(label: str) -> str:
    """The method a label names, its options unread: 'mimetic[base=kaiming]' -> 'mimetic',
    'impulse-soft' -> 'impulse' (a recorded label is named even where its options are no longer known)."""
    name = label.strip().partition("[")[0]
    name = RENAMED.get(name, name)
    return VARIANTS[name][0] if name in VARIANTS else name


def label_before(label: str) -> str:
    """A label recorded by structinit before RENAMED_IN, as it is written now (the same init): 'impulse'
    -> 'impulse[target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]', 'impulse-authors' ->
    'impulse-neurips'; other labels are unchanged."""
    name, bracket, rest = label.strip().partition("[")
    if name in RENAMED:
        return RENAMED[name] + bracket + rest
    if name != "impulse":
        return label
    given = parse_assignments(rest[:-1], f"init label {label!r}") if bracket else {}
    return with_options(name, {**given, **{k: v for k, v in IMPULSE_BEFORE.items() if k not in given}})


WORDS = {"true": True, "false": False, "none": None}  # values as YAML and the shell write them


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
            result[key.strip()] = WORDS.get(value.strip().lower(), value.strip())
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
    if name in RENAMED:
        note = f"init {name!r} is called {RENAMED[name]!r} since structinit {RENAMED_IN}: the same init"
        warnings.warn(note, FutureWarning, stacklevel=4)
        name = RENAMED[name]
    if name in (DEFAULT, AUTO):
        if extra:
            raise ValueError(f"init label {label!r}: {name!r} takes no options")
        return InitSpec(label, name, MappingProxyType({}))
    if name in VARIANTS:
        method, options = VARIANTS[name][0], {**VARIANTS[name][1], **extra}
    elif name in METHOD_NAMES or name in FILTER_METHODS:
        method, options = name, extra
    else:
        known = sorted({*METHOD_NAMES, *FILTER_METHODS, *VARIANTS, DEFAULT, AUTO})
        hint = "options in brackets: impulse[a=1,b=2]"
        if name.endswith((".safetensors", ".pth", ".pt")):
            hint = "a file of weights is --initial-checkpoint FILE, or load_state_dict in Python"
        raise ValueError(f"unknown init {name!r}; choose from {', '.join(known)} ({hint})")
    kernel_size = options.pop(KERNEL_SIZE, None)
    from .registry import check_options  # the model families, loaded once a label names a method

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


# `impulse` as structinit wrote it before RENAMED_IN: the bundle (sharp maps, x18, V/proj mimetic on the
# model's own weights), a label of options now; the studies' ledgers name its runs so
BUNDLE = label_before("impulse")
