"""The options of every init method, each defined once: a frozen dataclass per method whose fields
carry their default, their help and their valid values. The same class serves the Python call
(`initialize(model, "impulse", target_fidelity=0.9)` or `initialize(model, ImpulseOptions(target_fidelity=0.9))`),
the init labels of the command line (`impulse[target_fidelity=0.9]`, checked before a grid starts) and
`structinit init --list-options`, and the report records the resolved instance, so a default changed here
changes all of them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from ..errors import quoted


def option(
    default: Any,
    help: str,
    *,
    choices: tuple[str, ...] | None = None,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    why: str = "",
) -> Any:
    """A dataclass field with its help text and its valid values (choices, or a range whose ends are
    included unless `*_open`; `why` is added to the error)."""
    bounds = None if low is None and high is None else (low, high, low_open, high_open)
    return field(default=default, metadata={"help": help, "choices": choices, "bounds": bounds, "why": why})


@dataclass(frozen=True)
class MethodOptions:
    """Base of the options classes: construction checks every value by name (type, choice, range)."""

    what: ClassVar[str] = "this init"
    method: ClassVar[str | None] = None  # the method an instance stands for, where one class is one method

    def __post_init__(self) -> None:
        for f in fields(self):
            _check(self.what, f, getattr(self, f.name))

    @classmethod
    def build(cls, method: str, values: Mapping[str, Any]) -> MethodOptions:
        """The options of `method` from a name -> value mapping; unknown names fail with the list of
        known ones."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise TypeError(
                f"unknown option(s) {', '.join(unknown)} for method {method!r}; "
                f"its options are: {', '.join(known) or 'none'}"
            )
        return cls(**values)

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults (what an init label needs to say)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def describe(cls) -> list[str]:
        """One line per option: name, type, default, valid values and help."""
        lines = []
        for f in fields(cls):
            meta = f.metadata
            valid = f" ({'|'.join(meta['choices'])})" if meta["choices"] else ""
            default = f.default if f.default is not MISSING else "required"
            lines.append(f"{f.name}: {f.type}{valid} = {default!r}\n    {meta['help']}")
        return lines


def _check(what: str, f: Any, value: Any) -> None:
    kinds = {t.strip() for t in str(f.type).split("|")}
    meta = f.metadata
    if value is None and "None" in kinds:
        return
    if "bool" in kinds and not isinstance(value, bool):
        raise TypeError(f"option {f.name} of {what} takes True or False, got {quoted(value)}")
    if kinds & {"int", "float"} and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise TypeError(f"option {f.name} of {what} takes a number, got {quoted(value)}")
    if "int" in kinds and "float" not in kinds and not isinstance(value, int):
        raise TypeError(f"option {f.name} of {what} takes an integer, got {quoted(value)}")
    if "str" in kinds and not isinstance(value, str):
        raise TypeError(f"option {f.name} of {what} takes text, got {quoted(value)}")
    if meta["choices"] and value not in meta["choices"]:
        raise ValueError(f"{f.name} must be one of {', '.join(map(repr, meta['choices']))}, got {quoted(value)}")
    if meta["bounds"]:
        low, high, low_open, high_open = meta["bounds"]
        below = value != value or (low is not None and (value <= low if low_open else value < low))  # NaN fails
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            if high is None:
                valid = f"{'>' if low_open else '>='} {low:g}"
            else:
                valid = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            none = " or None" if "None" in kinds else ""
            why = f" ({meta['why']})" if meta["why"] else ""
            raise ValueError(f"{f.name} must be {valid}{none}{why}, got {quoted(value)}")
    if kinds & {"int", "float"} and not math.isfinite(value):
        raise ValueError(f"option {f.name} of {what} takes a finite number, got {value}")


# options that several methods take, each defined here once (a dataclass field cannot be shared)

LIMIT = 1e6  # the largest magnitude of a weight factor: beyond it, products of weights overflow float32


def factor(default: float, help: str, *, low: float = -LIMIT, low_open: bool = False) -> Any:
    """A number that scales weights, checked against LIMIT before any write (pos_scale's limit is the model's)."""
    return option(default, help, low=low, high=LIMIT, low_open=low_open, why="larger ones overflow float32 weights")


def assignment() -> Any:
    return option(
        "random",
        "which head gets which offset of the f x f kernel: random (seeded, every offset once before any repeats) "
        "or ordered (the authors': centre, neighbours, diagonals)",
        choices=("random", "ordered"),
    )


def target_fidelity(default: float | None = 0.98, unset: str = "") -> Any:
    return option(
        default,
        "share of each query's attention on its target key at init" + unset,
        low=0,
        high=1,
        low_open=True,
        high_open=True,
    )


def base(default: str = "keep") -> Any:
    return option(
        default,
        "the layers this init does not set: keep the model's (timm's init on a fresh timm model), or redraw "
        "every layer first with timm's init or with PyTorch's defaults (kaiming: the authors' base)",
        choices=("keep", "timm", "kaiming"),
    )


def pos_scale(default: float | None) -> Any:
    return option(
        default,
        "rescale a learned position embedding to std pos_scale x 0.02 (x18 on a fresh timm model, as the authors); "
        "None leaves it as it is",
        low=0,
        low_open=True,
    )


def vproj(default: str) -> Any:
    return option(
        default,
        "W_v W_proj: mimetic (vproj_alpha Z - vproj_beta I) or keep the model's",
        choices=("mimetic", "keep"),
    )


def vproj_alpha() -> Any:
    return factor(0.4, "weight of Z in W_v W_proj = vproj_alpha Z - vproj_beta I")


def vproj_beta() -> Any:
    return factor(0.4, "weight of the identity subtracted in W_v W_proj")


@dataclass(frozen=True)
class NoOptions(MethodOptions):
    """timm's and PyTorch's (kaiming) inits take no options."""


@dataclass(frozen=True)
class MimeticOptions(MethodOptions):
    """Mimetic init (Trockman & Kolter 2023): W_q W_k^T ~ qk_alpha Z + qk_beta I and
    W_v W_proj = vproj_alpha Z - vproj_beta I."""

    what: ClassVar[str] = "the mimetic init"
    method: ClassVar[str | None] = "mimetic"
    qk_alpha: float = factor(0.7, "weight of the random matrix Z in W_q W_k^T")
    qk_beta: float = factor(0.7, "weight of the identity in W_q W_k^T")
    vproj_alpha: float = vproj_alpha()
    vproj_beta: float = vproj_beta()
    distribution: str = option(
        "uniform", "entries of Z, variance 1/D: uniform (the authors' code) or normal", choices=("uniform", "normal")
    )
    base: str = base()


@dataclass(frozen=True)
class ImpulseOptions(MethodOptions):
    """Impulse init of ViTs (Zheng et al. 2025); methods.init_impulse says how the options act together."""

    what: ClassVar[str] = "the impulse init"
    method: ClassVar[str | None] = "impulse"
    before: ClassVar[dict[str, Any]] = {"target_fidelity": 0.98, "pos_scale": 18.0, "vproj": "mimetic", "base": "keep"}
    assignment: str = assignment()
    solver: str = option(
        "closed_form",
        "closed_form: nearly orthogonal key codes at the gain that meets target_fidelity; refine: then Adam on the "
        "paper's softmax-MSE objective; authors: the authors' least-squares solver, for comparison",
        choices=("closed_form", "refine", "authors"),
    )
    # The defaults: the paper's text (Q/K alone, PyTorch's base); NeurIPS code's bundle: labels.VARIANTS
    target_fidelity: float | None = target_fidelity(None, "; None: what the paper's solve reaches on the model")
    pseudo_input: str = option(
        "pos_embed",
        "what Q and K are solved on: the prefix tokens plus position embedding, uniform or gaussian noise, or "
        "the embedding plus gaussian noise (paper App. C.1)",
        choices=("pos_embed", "uniform", "gaussian", "pos_embed+noise"),
    )
    noise_std: float = factor(1.0, "pos_embed+noise: noise std in units of the embedding's std", low=0)
    pos_scale: float | None = pos_scale(None)
    scale: str = option(
        "position",
        "how pos_scale's ratio of position to patch content is reached: grow the position embedding (the "
        "authors), or shrink the patch projection and prefix tokens by the same factor (the same maps on "
        "images at init, carried by small weights)",
        choices=("position", "content"),
    )
    blind_to_content: bool = option(
        True, "solve Q/K outside the patch embedding's span when it is under half the width (small patches)"
    )
    vproj: str = vproj("keep")
    vproj_alpha: float = vproj_alpha()  # with vproj=mimetic
    vproj_beta: float = vproj_beta()
    refine_steps: int = option(100, "solver=refine: Adam steps", low=0)
    refine_lr: float = factor(0.01, "solver=refine: relative step size", low=0, low_open=True)
    qk_scale: float = factor(7.0, "solver=authors: their Q/K scale", low=0, low_open=True)
    propagate: bool = option(
        False, "solve layer i + 1 on block i's output for the pseudo tokens, not on the pseudo tokens themselves"
    )
    rcond: float = option(
        0.1,
        "invert the pseudo input only along singular directions of at least rcond x the largest (lstsq cut-off)",
        low=0,
        high=1,
        high_open=True,
    )
    base: str = base("kaiming")


@dataclass(frozen=True)
class QKNormOptions(MethodOptions):
    """The impulse init's bundle without its structure (methods.init_qk_norm): each head's Q and K weights
    rescaled to a Frobenius norm, and optionally the position embedding and V/proj as the impulse init sets
    them; a control for whether structure or scale helps."""

    what: ClassVar[str] = "the qk-norm control"
    method: ClassVar[str | None] = "qk-norm"
    norm: float | None = factor(
        7.0,
        "Frobenius norm of each head's W_q and W_k (7: the authors' impulse init); None keeps them",
        low=0,
        low_open=True,
    )
    pos_scale: float | None = pos_scale(None)
    vproj: str = vproj("keep")
    vproj_alpha: float = vproj_alpha()
    vproj_beta: float = vproj_beta()
    base: str = base()


@dataclass(frozen=True)
class SelectOptions(MethodOptions):
    """Weight selection from a larger teacher (Xu et al. 2024; inits/selection.py), optionally with the
    impulse init's Q/K on top."""

    what: ClassVar[str] = "weight selection"
    method: ClassVar[str | None] = "select"
    teacher: Any = option(
        None,
        "the larger model: a timm model name (pretrained weights), a .safetensors/.pth file, a structinit run "
        "directory (its last.pt); in Python also a model or a state dict",
    )
    rule: str = option(
        "uniform",
        "uniform: every axis evenly spaced, qkv's output as one axis (the official code); heads: each student "
        "head from one teacher head (timm ViTs)",
        choices=("uniform", "heads"),
    )
    teacher_heads: int | None = option(
        None, "rule=heads: the teacher's heads where its weights alone do not say (a file)", low=1
    )
    qk: str = option(
        "teacher",
        "the Q/K weights: the teacher's selection, or solved by the impulse init on the selected model",
        choices=("teacher", "impulse"),
    )
    target_fidelity: float = target_fidelity()  # with qk=impulse
    pos_scale: float | None = pos_scale(None)  # with qk=impulse
    vproj: str = vproj("keep")  # with qk=impulse

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.qk == "teacher" and (self.pos_scale is not None or self.vproj != "keep"):
            raise ValueError("pos_scale and vproj act through the impulse init: give them with qk=impulse")

    def to_dict(self) -> dict[str, Any]:
        """The options as a report records them: a teacher given as a model or state dict by its kind."""
        values = super().to_dict()
        if not isinstance(self.teacher, str):
            values["teacher"] = f"a {type(self.teacher).__name__} given in Python"
        return values


@dataclass(frozen=True)
class SwinImpulseOptions(MethodOptions):
    """Impulse init of Swin v1 and the other relative-position families (BEiT, vit_relpos, Swin v2, ...),
    through their relative-position bias (inits/relpos.py)."""

    what: ClassVar[str] = "the relative-position impulse init"
    method: ClassVar[str | None] = "impulse"
    assignment: str = assignment()
    target_fidelity: float = target_fidelity()
    vproj_alpha: float = vproj_alpha()
    vproj_beta: float = vproj_beta()
    base: str = base()


@dataclass(frozen=True)
class MixerImpulseOptions(MethodOptions):
    """Impulse init of MLP-Mixer's token-mixing MLPs (inits/mixer.py)."""

    what: ClassVar[str] = "Mixer's impulse init"
    method: ClassVar[str | None] = "impulse"
    assignment: str = assignment()
    unit_bias: float = option(
        3.0,
        "bias of the routing units",
        low=0,
        low_open=True,
        high=LIMIT,
        why="it keeps the activation in its linear range; larger ones overflow float32 weights",
    )
    base: str = base()


@dataclass(frozen=True)
class FilterOptions(MethodOptions):
    """ConvMixer's depthwise filter inits (random, impulse, box; inits/convmixer.py)."""

    what: ClassVar[str] = "the filter inits"
    freeze: bool = option(False, "fix the depthwise convolutions (no gradient, no weight decay)")
