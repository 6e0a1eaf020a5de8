"""Which inits each model family takes, and their options classes: `METHODS` (the plain ViTs) and the
families beside them (Swin, MLP-Mixer; ConvMixer's filter inits)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Literal

from torch import nn

from ..adapters import RELPOS_ADAPTERS, ModelAdapter, get_adapter
from ..adapters.cait import CaitAdapter
from ..adapters.mixer import MixerAdapter
from ..adapters.rope import RopeEvaAdapter
from ..adapters.swin import SwinAdapter
from ..report import LayerReport
from .baselines import init_kaiming, init_mimetic, init_timm
from .cait import init_cait_impulse
from .impulse import check_impulse, check_qk_norm, init_impulse, init_qk_norm
from .mixer import check_mixer_impulse, init_mixer_impulse
from .names import FILTER_METHODS
from .options import (
    FilterOptions,
    ImpulseOptions,
    MethodOptions,
    MimeticOptions,
    MixerImpulseOptions,
    NoOptions,
    QKNormOptions,
    SelectOptions,
    SwinImpulseOptions,
)
from .relpos import check_relpos_impulse, init_relpos_impulse
from .rivals import (
    ConditionedOptions,
    MimeticVOOptions,
    SinusoidalOptions,
    check_conditioned,
    check_sinusoidal,
    init_conditioned,
    init_mimetic_vo,
    init_sinusoidal,
)
from .rope import RopeImpulseOptions, check_rope_impulse, check_rope_mimetic, init_rope_impulse
from .selection import check_select, init_select


@dataclass(frozen=True)
class InitMethod:
    """An init: the function that writes the weights, the class of its options, and the function that
    makes the refusals `run` has for a model and options before anything is written (initialize calls
    it first: a refused init leaves the model as it was)."""

    run: Callable[..., list[LayerReport]]
    options: type[MethodOptions]
    # a ViT's learned position embedding and prefix tokens: "seeded" (drawn from the seed before the init, which
    # reads them: the same seed, the same weights), "own" (the init sets them itself) or "kept" (as they were)
    embeddings: Literal["seeded", "own", "kept"] = "seeded"
    records_source: bool = False  # its run takes `source`, a dict it fills with what the report records of its sources
    check: Callable[[Any, Any], None] | None = None  # (adapter, options) -> None, or a one-line error


TIMM = InitMethod(init_timm, NoOptions, embeddings="own")
KAIMING = InitMethod(init_kaiming, NoOptions, embeddings="own")
MIMETIC = InitMethod(init_mimetic, MimeticOptions)
METHODS: dict[str, InitMethod] = {
    "timm": TIMM,
    "kaiming": KAIMING,
    "mimetic": MIMETIC,
    "impulse": InitMethod(init_impulse, ImpulseOptions, records_source=True, check=check_impulse),
    "qk-norm": InitMethod(init_qk_norm, QKNormOptions, check=check_qk_norm),
    "select": InitMethod(init_select, SelectOptions, embeddings="own", records_source=True, check=check_select),
    "conditioned": InitMethod(init_conditioned, ConditionedOptions, check=check_conditioned),
    "sinusoidal": InitMethod(init_sinusoidal, SinusoidalOptions, embeddings="kept", check=check_sinusoidal),
    "mimetic-vo": InitMethod(init_mimetic_vo, MimeticVOOptions),
}


RELPOS_METHODS = {  # Swin v1 and the other families whose position lives in a relative-position bias
    "timm": TIMM,
    "kaiming": KAIMING,
    "mimetic": MIMETIC,
    "impulse": InitMethod(init_relpos_impulse, SwinImpulseOptions, check=check_relpos_impulse),
}


@dataclass(frozen=True)
class Family:
    """A model family beside the plain ViTs: its adapter, its inits, and how its report measures."""

    adapter: type
    methods: dict[str, InitMethod]
    measured_on: str
    unit: str = "head"


VIT_FAMILY = Family(ModelAdapter, METHODS, "pseudo input")
FAMILIES = [
    Family(SwinAdapter, RELPOS_METHODS, "window pseudo input"),
    Family(
        MixerAdapter,
        {
            "timm": TIMM,
            "kaiming": KAIMING,
            "impulse": InitMethod(init_mixer_impulse, MixerImpulseOptions, check=check_mixer_impulse),
        },
        "unit impulses",
        "token mixer",
    ),
    Family(
        RopeEvaAdapter,
        {
            "timm": TIMM,
            "kaiming": KAIMING,
            "mimetic": InitMethod(init_mimetic, MimeticOptions, check=check_rope_mimetic),
            "impulse": InitMethod(init_rope_impulse, RopeImpulseOptions, check=check_rope_impulse),
        },
        "pseudo input, rotated",
    ),
    Family(
        CaitAdapter,
        {
            "timm": TIMM,
            "kaiming": KAIMING,
            "mimetic": MIMETIC,
            "impulse": InitMethod(init_cait_impulse, ImpulseOptions, records_source=True, check=check_impulse),
        },
        "pseudo input",
    ),
    *(Family(adapter, RELPOS_METHODS, "uniform image") for adapter in RELPOS_ADAPTERS),
]


def option_classes(method: str) -> list[type[MethodOptions]]:
    """The options classes of `method` across the families (e.g. impulse: ViT, Swin, Mixer, ConvMixer)."""
    families = [VIT_FAMILY, *FAMILIES]
    classes = [family.methods[method].options for family in families if method in family.methods]
    if method in FILTER_METHODS:
        classes.append(FilterOptions)
    return list(dict.fromkeys(classes))


def check_options(method: str, options: dict[str, Any]) -> None:
    """Fail now, by name, on options that no family's `method` takes (an init label, before a grid
    starts); the model's own family checks them again when it is initialised."""
    classes, errors = option_classes(method), []
    for cls in classes:
        try:
            cls.build(method, options)
            return
        except (TypeError, ValueError) as error:
            errors.append(error)
    known = sorted({f.name for cls in classes for f in fields(cls)})
    unknown = sorted(set(options) - set(known))
    if unknown:
        listed = ", ".join(known) or "none"
        raise TypeError(f"unknown option(s) {', '.join(unknown)} for method {method!r}; its options are: {listed}")
    raise errors[0]


def options_then_and_now(
    method: str, given: dict[str, Any], recorded: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(what a run's recorded options were, what `method` with `given` options resolves to today), in the
    options class of the run's family (the smallest holding every recorded field); None where none does. A
    run made before an option existed recorded none of it and did what the option's default does."""
    names = set(recorded) - {"kernel_size"}
    for cls in sorted(option_classes(method), key=lambda c: len(fields(c))):
        if names <= {f.name for f in fields(cls)}:
            now = cls.build(method, {k: v for k, v in given.items() if k != "kernel_size"}).to_dict()
            before = getattr(cls, "before", {})  # a field a run lacks was added when these were the defaults
            then = {**cls().to_dict(), **before, **{k: v for k, v in recorded.items() if k in now}}
            return then, now
    return None


def family_of(model: nn.Module) -> tuple[Family, Any]:
    for family in FAMILIES:
        if family.adapter.matches(model):
            return family, family.adapter(model)
    return VIT_FAMILY, get_adapter(model)


def default_label(model: nn.Module) -> str:
    """The label `auto` stands for on `model`: mimetic on PyTorch's base where the family has mimetic (the
    rule's outcome for ViTs, docs/studies/default-rule.md), else the family's impulse (MLP-Mixer, ConvMixer)."""
    from ..adapters.convmixer import get_conv_adapter

    if get_conv_adapter(model) is not None:
        return "impulse"
    family, _ = family_of(model)
    return "mimetic[base=kaiming]" if "mimetic" in family.methods else "impulse"
