"""Model construction: any timm model name, plus presets for the small-image ViTs of the paper; what
builds a model again (`constructor`), which a saved init records."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import timm
import torch
from timm.layers import build_sincos2d_pos_embed, to_2tuple
from timm.models.convmixer import ConvMixer
from timm.models.mlp_mixer import MlpMixer
from torch import nn

from . import memory
from .errors import RunError, first_line
from .inits.api import initialize
from .inits.fork_kwargs import fork_init
from .inits.labels import DEFAULT, InitSpec
from .inits.registry import family_of
from .memory import allocations_checked, check_fits, estimated_bytes, init_work, model_bytes
from .report import Report
from .seeds import check_seed

# the paper's v1 ViT at 32 px: no class token, global average pooling, a fixed 2-D sin-cos position table
V1 = dict(img_size=32, class_token=False, global_pool="avg", pos_embed="sincos")
# name -> (timm architecture name or model class, keyword arguments); img_size is the preset's own
# image size, which the data's size replaces when there is data (channels always come from the data)
PRESETS: dict[str, tuple[str | Callable[..., nn.Module], dict[str, Any]]] = {
    "vit_digits": (
        "vit_tiny_patch16_224",
        dict(img_size=8, patch_size=1, embed_dim=64, depth=4, num_heads=4, mlp_ratio=2.0),
    ),
    "vit_tiny_p4": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4)),  # ViT-T (192 x 12, 3 heads) at 32 px
    # ViT-T at the images' size, its patch giving them a grid of 8 x 8 tokens or more (16 at most): `choose`'s
    "vit_tiny_fit": ("vit_tiny_patch16_224", dict(img_size=224, patch_size=16)),
    "vit_tiny_p2": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=2)),
    "vit_small_p4": ("vit_small_patch16_224", dict(img_size=32, patch_size=4)),
    "vit_d6_p4": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, depth=6)),  # the FINDINGS / study ViT
    # the convergence study's ViT on a 2-core CPU: half the width, two thirds of the depth (~7x cheaper)
    "vit_w96_d4_p4": ("vit_tiny_patch16_224", dict(img_size=32, patch_size=4, depth=4, embed_dim=96)),
    # the paper's v1 ViT at the study ViT's size
    "vit_d6_p4_gap_sincos": ("vit_tiny_patch16_224", dict(V1, patch_size=4, depth=6)),
    # the paper's v1 ViT at 256 tokens (patch 2) and the width a 2-core CPU trains (docs/regimes.md)
    "vit_w96_d6_p2_gap_sincos": ("vit_tiny_patch16_224", dict(V1, patch_size=2, embed_dim=96, depth=6, num_heads=6)),
    # the paper's Table 5 ViT (depth 8, width 256, 8 heads, patch 2, GAP + sin-cos): benchmarks/gpu_table5.py
    "vit_w256_d8_p2_gap_sincos": ("vit_tiny_patch16_224", dict(V1, patch_size=2, embed_dim=256, depth=8, num_heads=8)),
    # the CNN yardstick of the study: the ViT's width, depth, patch and kernel (3 x 3) as a ConvMixer
    "convmixer_d6_p4": (ConvMixer, dict(dim=192, depth=6, patch_size=4, kernel_size=3)),
    # the study ViT's budget in other families (families.md): 6 blocks, 8 x 8 tokens of 192 at the end
    "swin_d6_p2_w4": (
        "swin_tiny_patch4_window7_224",
        dict(img_size=32, patch_size=2, window_size=4, embed_dim=96, depths=(2, 4), num_heads=(3, 6)),
    ),
    # 96 token-mixing units, 64 tokens
    "mixer_d6_p4": (MlpMixer, dict(img_size=32, patch_size=4, num_blocks=6, embed_dim=192)),
}

# presets whose patch follows the data: the largest that leaves GRID x GRID tokens or more (8 px: patch 1;
# 32 px: 4), the grid at which the preset's 16-wide heads reach their impulse maps (docs/training.md), up
# to a largest patch (None: no limit)
PATCH_FOLLOWS_DATA = {"vit_digits": None, "vit_tiny_fit": 16}
GRID = 8


def patch_for(name: str, data_size: int | None, kwargs: dict[str, Any]) -> int | None:
    """The patch `create_model` gives preset `name` for images of `data_size` px: for a preset of
    PATCH_FOLLOWS_DATA whose patch `kwargs` leaves open, the largest that makes at least GRID tokens a
    side (between GRID and 2 GRID - 1 of them); None: the preset's or the model's own."""
    if name not in PATCH_FOLLOWS_DATA or data_size is None or "patch_size" in kwargs:
        return None
    return max(1, min(data_size // GRID, PATCH_FOLLOWS_DATA[name] or data_size))


# timm.create_model keywords that load weights or configs from files or the hub: a config.yaml or a
# run directory that sets them could run code (older timm unpickles with weights_only=False)
LOADING_KWARGS = ("pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "checkpoint_path", "pretrained_strict")


# words a shell user writes for a boolean or a number that timm would take as text (text is true to it)
TEXT_BOOLEANS = {"no", "yes", "off", "on", "y", "n", "t", "f"}
NOT_NUMBERS = {"nan", "inf", "-inf", "+inf", "infinity", "-infinity"}


def check_model_kwargs(kwargs: dict[str, Any], where: str = "--model-kwargs") -> None:
    """Refuse model keywords that load files (structinit initialises models, it does not load them) and
    values timm would read otherwise than meant: a boolean word as text, a number that is not finite
    (`where`: what gave them, in the message)."""
    for key, value in kwargs.items():
        text = value.lower() if isinstance(value, str) else None
        if text in TEXT_BOOLEANS:
            raise ValueError(f"{where} {key}={value}: timm reads any text as true; give True or False")
        if text in NOT_NUMBERS or (isinstance(value, float) and not math.isfinite(value)):
            raise ValueError(f"{where} {key}={value}: give a finite number")
    if "post_weight_init" in kwargs:  # the authors' fork's keyword, which timm lacks: the CLI reads it as a label
        label = fork_init(kwargs, where)[0]
        raise ValueError(f"{where} post_weight_init is the authors' fork's (timm lacks it): give --init {label}")
    loading = [k for k in LOADING_KWARGS if kwargs.get(k)]
    if loading:
        raise ValueError(
            f"{where} {', '.join(loading)}: structinit does not load weights or configs into a model "
            "(a file named there could run code); initialise it, or load your weights after structinit init --save"
        )


def is_model_name(name: str) -> bool:
    """A preset of this package or a model timm can build."""
    import timm

    return name in PRESETS or timm.is_model(name)


def create_model(
    name: str, *, num_classes: int, in_chans: int, data_size: int | None, drop_path: float = 0.0, **kwargs: Any
) -> nn.Module:
    """timm.create_model for a preset or any timm name; ViT-family models get `img_size=data_size`
    (the images' size) unless `kwargs` sets img_size, and vit_digits its patch for it (patch_for).
    `pos_embed="sincos"` gives a ViT a fixed (frozen) 2-D sin-cos position table, which every init
    leaves as it is."""
    return _create(
        name, None, num_classes=num_classes, in_chans=in_chans, data_size=data_size, drop_path=drop_path, **kwargs
    )[0]


def _create(
    name: str,
    spec: InitSpec | None,
    *,
    num_classes: int,
    in_chans: int,
    data_size: int | None,
    drop_path: float = 0.0,
    **kwargs: Any,
) -> tuple[nn.Module, dict[str, Any]]:
    """create_model, and the model's constructor (see `constructor`); refused first where the model, and
    the init `spec` that will run on it, need more memory than this process can have (`check_room`)."""
    check_model_kwargs(kwargs)
    arch, preset_kwargs = PRESETS.get(name, (name, {}))
    options = {**preset_kwargs, **kwargs, "num_classes": num_classes, "in_chans": in_chans}
    patch = patch_for(name, data_size, kwargs)
    if patch is not None:
        options["patch_size"] = patch
    if drop_path:
        options["drop_path_rate"] = drop_path
    if data_size is not None and _takes_img_size(arch):
        if "img_size" not in kwargs:
            options["img_size"] = data_size
        elif not kwargs.get("dynamic_img_size") and tuple(to_2tuple(kwargs["img_size"])) != (data_size, data_size):
            raise ValueError(
                f"img_size={kwargs['img_size']} does not fit the {data_size} px images of the data: leave "
                "img_size out (it follows in-memory data) or use data of that size"
            )
    asked = dict(options)  # what the record keeps: a fixed sin-cos table stays "sincos" when rebuilt
    sincos = options.get("pos_embed") == "sincos" and not callable(arch)
    if sincos:
        options["pos_embed"] = "learn"
    described = _described(name, num_classes, kwargs)
    estimated = check_room(arch, options, spec, described)
    try:
        with contextlib.nullcontext() if estimated else allocations_checked(described, SMALLER):
            model = arch(**options) if callable(arch) else timm.create_model(arch, **options)
    except RunError:
        raise
    except RuntimeError as error:
        if "Unknown model" in str(error):
            raise ValueError(f"{error}; presets: {', '.join(PRESETS)}") from None
        raise ValueError(f"{name} cannot be built with {kwargs or 'its defaults'}: {first_line(error)}") from None
    except (TypeError, ValueError, ArithmeticError, AssertionError, KeyError, AttributeError, ImportError) as error:
        raise ValueError(f"{name} cannot be built with {kwargs or 'its defaults'}: {first_line(error)}") from None
    if sincos:
        _fix_sincos_position_table(model)
    built = constructor(model, asked, preset=name if name in PRESETS else None)
    model._structinit_constructor = built  # save_init's record of a model built here without a report
    return model, built


SMALLER = "give a smaller model (fewer classes, width or depth)"
SMALLER_FOR_INIT = "give a smaller model (fewer classes, width, depth, heads or tokens)"


def check_room(
    arch: str | Callable[..., nn.Module], options: dict[str, Any], spec: InitSpec | None, described: str
) -> bool:
    """RunError (one line), before anything is allocated, where the model `arch` builds with `options` and
    the init `spec` then needs more memory than this process can have: its parameters' and buffers' bytes
    and the init's work, as `memory.estimated_bytes` reads them from sketches of it (a model of 10^5 blocks
    in milliseconds, not minutes). Whether it could tell: a model it cannot sketch is counted as it is
    built (`allocations_checked`). A model built on the meta device or a GPU takes none of the host's."""
    room = memory.available_bytes()  # through the module: what a test sets there
    if room is None or torch.get_default_device().type != "cpu":
        return True
    init = spec if spec is not None and not spec.is_default else None

    def cost(model: nn.Module) -> int:
        work = init_work(_attention_shapes(model), init.method, init.options.get("solver")) if init else 0
        return model_bytes(model) + work

    build = arch if callable(arch) else functools.partial(timm.create_model, arch)
    need = estimated_bytes(build, options, cost, room)
    if need is None:
        return False
    what, fix = (f"{described} and its {init.method} init", SMALLER_FOR_INIT) if init else (described, SMALLER)
    check_fits(need, what, fix)
    return True


def _attention_shapes(model: nn.Module) -> list[tuple[int, int, int]]:
    """(heads, tokens, width) of each attention layer of `model`, as its adapter reads them; none in a
    family without attention maps (ConvMixer, MLP-Mixer)."""
    try:
        adapter = family_of(model)[1]
        layers = adapter.layers()
    except (TypeError, AttributeError):
        return []
    tokens = math.prod(adapter.grid) + getattr(adapter, "num_prefix_tokens", 0)
    return [(layer.num_heads, tokens, layer.qk_weights()[0].shape[1]) for layer in layers]


def _described(name: str, num_classes: int, kwargs: dict[str, Any]) -> str:
    given = "".join(f", {key}={value}" for key, value in kwargs.items())
    return f"{name} ({num_classes:,} classes{given})"


def constructor(model: nn.Module, kwargs: dict[str, Any] | None = None, preset: str | None = None) -> dict[str, Any]:
    """How to build `model` again: `model`, the timm name that `timm.create_model` (and train.py's --model)
    takes, where timm built it by name (its pretrained_cfg says); `class`, its class; `kwargs`, the
    keywords it was built with, where known; `preset`, the preset of this package it came from. A model
    that create_model built, given without keywords: the record made when it was built."""
    made = getattr(model, "_structinit_constructor", None)
    if kwargs is None and preset is None and made is not None:
        return dict(made)
    architecture = (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    built: dict[str, Any] = {"model": architecture} if architecture else {}
    built["class"] = f"{type(model).__module__}.{type(model).__qualname__}"
    if kwargs is not None:
        built["kwargs"] = dict(kwargs)
    if preset is not None:
        built["preset"] = preset
    return built


def shape_model(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """Model `name` built with `kwargs` (num_classes and in_chans among them, or timm's defaults) for its
    shapes and types: on the meta device (no memory, no draws), or where this timm reads a value while
    building (1.0.16: `.item()` of drop-path rates), on the CPU with torch's random state put back after."""
    kwargs = dict(kwargs)
    classes, channels = kwargs.pop("num_classes", 1000), kwargs.pop("in_chans", 3)
    build = dict(num_classes=classes, in_chans=channels, data_size=None, **kwargs)
    try:
        with torch.device("meta"):
            return create_model(name, **build)
    except (RuntimeError, NotImplementedError, ValueError) as error:
        if "meta" not in str(error):
            raise
    with torch.random.fork_rng():
        return create_model(name, **build)


def preset_size(name: str) -> str:
    """Preset `name`'s size, read off it built on the meta device (no memory, no init): its tokens at
    its image size (ConvMixer has none: 32 px, the study's), patch, width, depth and heads."""
    kwargs = PRESETS[name][1]
    with torch.device("meta"):
        model = create_model(name, num_classes=10, in_chans=3, data_size=None)
    size, patch = to_2tuple(kwargs.get("img_size", 32))[0], kwargs["patch_size"]
    blocks = getattr(model, "blocks", None)
    depth = len(blocks) if blocks is not None else sum(len(stage.blocks) for stage in model.layers)
    heads = sorted({m.num_heads for m in model.modules() if isinstance(getattr(m, "num_heads", None), int)})
    shown = "-".join(map(str, heads)) + " heads" if heads else "no attention"
    follows = f"; other sizes: the patch for {GRID}x{GRID} tokens or more" if name in PATCH_FOLLOWS_DATA else ""
    tokens = f"{(size // patch) ** 2} tokens at {size} px (patch {patch}{follows})"
    return f"{tokens}, width {model.num_features}, depth {depth}, {shown}"


def _fix_sincos_position_table(model: nn.Module) -> None:
    grid = model.patch_embed.grid_size
    table = build_sincos2d_pos_embed(list(grid), model.embed_dim).unsqueeze(0)
    prefix = model.pos_embed.shape[1] - table.shape[1]  # prefix tokens that carry a position slot
    with torch.no_grad():
        model.pos_embed.zero_()
        model.pos_embed[:, prefix:] = table
    model.pos_embed.requires_grad_(False)


def _takes_img_size(arch: str | Callable[..., nn.Module]) -> bool:
    if callable(arch):
        return "img_size" in inspect.signature(arch).parameters
    return arch.split("_")[0] in {"vit", "deit", "eva", "swin", "mixer", "beit"}


def build_model(
    name: str,
    spec: InitSpec,
    seed: int,
    *,
    num_classes: int,
    in_chans: int,
    data_size: int | None,
    teacher: str | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, Report]:
    """`create_model`, then the init `spec` names, with every random stream seeded by `seed` first (the
    weights timm draws before the init, e.g. MLPs and head, depend on it): the same arguments give the
    same weights in every process. `teacher`: the teacher of a `select` init (--teacher) that its label
    does not name. Returns (model, report)."""
    check_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model, built = _create(name, spec, num_classes=num_classes, in_chans=in_chans, data_size=data_size, **kwargs)
    if spec.is_default:
        return model, Report(DEFAULT, type(model).__name__, [], seed=seed, constructor=built)
    options = dict(spec.options)
    if teacher is not None and spec.method == "select":
        if options.get("teacher") not in (None, teacher):
            raise ValueError(f"--teacher {teacher} and the label's teacher={options['teacher']}: give one")
        options["teacher"] = teacher
    report = initialize(model, spec.method, kernel_size=spec.kernel_size, seed=seed, **options)
    return model, dataclasses.replace(report, constructor=built)
