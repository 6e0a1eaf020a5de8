"""`initialize`: one call for every supported model. Every method draws its randomness from one
`torch.Generator` seeded by `seed`, solves on the CPU in float64 and writes the model's parameters in
place, so the same seed gives bit-identical weights on any device."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters import ModelAdapter, unwrap
from ..adapters.convmixer import ConvMixerAdapter, get_conv_adapter
from ..errors import first_line, quiet_notices
from ..offsets import check_kernel_size
from ..report import Report
from ..seeds import check_seed
from .convmixer import init_filters
from .labels import AUTO, VARIANTS, read_label
from .names import FILTER_METHODS
from .options import FilterOptions, MethodOptions
from .registry import VIT_FAMILY, default_label, family_of
from .sharpness import SOLVE_DEVICE
from .threads import one_torch_thread


def _seed_to_start(seed: int | None) -> int:
    """The seed an init starts from (None: drawn from torch's global RNG), checked; refused under
    torch.inference_mode(), before the model changes: the solve and the in-place writes need autograd."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(
            "structinit.initialize was called under torch.inference_mode(): call it outside (the model is "
            "unchanged); build the model outside it too, since inference tensors cannot be written later"
        )
    if seed is None:
        seed = int(torch.randint(2**31 - 1, (1,)))
    check_seed(seed)
    return seed


def initialize(
    model: nn.Module,
    method: str,
    *,
    kernel_size: int | None = None,
    seed: int | None = None,
    quiet: bool = False,
    **options: Any,
) -> Report:
    """Initialise `model` in place with `method` and return a report.

    Vision transformers: "timm", "kaiming", "mimetic", "impulse", "qk-norm" (the control: the impulse
    bundle without its structure), "auto" (the trainer's default: registry.default_label); see each
    `init_*` function for its options. A named setting of a method (labels.VARIANTS: "impulse-neurips",
    the NeurIPS code's bundle, and "impulse-soft", the soft maps chosen at 64 tokens) is taken too, and
    so is a label with options in brackets as the CLI takes it ("impulse[vproj=keep,base=kaiming]");
    keywords override the setting's or the label's options.
    `kernel_size` (default 3) is the f of the f x f kernel: the impulse offsets, and the
    offsets against which every method's attention maps are measured in the report.
    Swin v1 and the other relative-position families (BEiT, vit_relpos, Swin v2, torchvision's and Hugging
    Face's Swin): "timm", "kaiming", "mimetic", "impulse" (through the relative-position bias,
    inits/relpos.py); MLP-Mixer: "timm", "kaiming", "impulse" (the token-mixing MLP, inits/mixer.py);
    `structinit init --list-models` lists every family.
    ConvMixer: "random", "impulse", "box" set its depthwise filters, option `freeze`
    (see inits/convmixer.py); its kernel size is the model's own.
    A seed lies in 0..2**32 - 1 (numpy's, as on the command line); `seed=None` draws one from torch's
    global RNG (so `torch.manual_seed` makes it reproducible); the report records it. The same seed
    gives bit-identical weights for the same model configuration at any thread count (on another CPU,
    all but a rare last bit: docs/methods.md), however the model was constructed: a ViT's mimetic and
    impulse inits draw the learned position embedding and prefix tokens, which they read, from the
    seed's generator (at timm's init); everything else they write is drawn from it too. Of the weights
    they leave, impulse reads only the patch embedding (with blind_to_content, the maps ignore its
    span), and with propagate=True every block's output (qk-norm rescales the Q/K it finds: with
    base="timm" or "kaiming" every weight is drawn from the seed); `structinit init --seed` and the
    trainer seed the model's construction as well, so their weights repeat exactly. A model wrapped by
    torch.compile, DistributedDataParallel or DataParallel is initialised through the wrapper (they
    share weights). An init that refuses a model or its options does so before it writes anything (a
    weight factor over options.LIMIT included); numbers that still overflow (a huge pos_scale) are named
    after the write, and the model must be created again. Report.set_tensors names every tensor it wrote.
    Long work (impulse's first solve of a shape, mimetic's past 2 s) is announced by a `structinit.errors.Notice`
    (one line) and a progress bar on a terminal; `quiet=True` shows neither.
    """
    seed = _seed_to_start(seed)
    model = unwrap(model)
    if method == AUTO and isinstance(model, nn.Module):
        method = default_label(model)
    variant, (method, given, kernel_size) = _variant(method), _split_method(method, options, kernel_size)
    _check_materialised(model)
    try:
        with _on_cpu(model), one_torch_thread(), quiet_notices(quiet):
            versions = _versions(model)
            report = _initialize(model, method, kernel_size, seed, given, variant)
            report.set_tensors = _written(model, versions)
        failed = ""
    except (torch.linalg.LinAlgError, np.linalg.LinAlgError) as error:  # a solve on numbers an option spoilt
        report, failed = None, f" ({first_line(error)})"
    _check_finite(model, method, given, failed)
    return report


def _check_materialised(model: nn.Module) -> None:
    if isinstance(model, nn.Module) and any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise ValueError(
            "the model's weights are on the meta device (no values): materialise it first, e.g. "
            "model.to_empty(device='cpu'), then initialise it"
        )


def _check_finite(model: nn.Module, method: str, given: dict | MethodOptions, failed: str) -> None:
    """ValueError where the init left a tensor not finite, or its solve `failed` (the LAPACK error quoted)."""
    bad = _not_finite(model)
    if bad or failed:
        listed = f"{len(bad)} tensor(s) not finite ({', '.join(bad[:3])})" if bad else "non-finite numbers"
        raise ValueError(
            f"the init {method} made {listed}{failed}: check its options ({given}); the model's weights are "
            "spoilt, create it again"
        )


def _versions(model: nn.Module) -> dict[str, int]:
    """Each tensor of the model's state_dict -> its version counter, which every in-place write (copy_, an
    nn.init draw, zero_) advances: the tensors an init wrote are those whose counter moved. Inference tensors
    keep no counter, and no write outside inference mode may touch them: refused before anything is written."""
    if not isinstance(model, nn.Module):
        return {}
    tensors = model.state_dict(keep_vars=True)
    inference = [name for name, tensor in tensors.items() if tensor.is_inference()]
    if inference:
        raise RuntimeError(
            f"the model's {inference[0]} is an inference tensor (the model was built under torch.inference_mode()), "
            "which nothing may write: build the model outside inference mode, then initialise it"
        )
    return {name: tensor._version for name, tensor in tensors.items()}


def _written(model: nn.Module, versions: dict[str, int]) -> list[str]:
    """The names of the tensors whose version counter moved since `versions`: those the init wrote."""
    if not isinstance(model, nn.Module):
        return []
    return [name for name, tensor in model.state_dict(keep_vars=True).items() if tensor._version != versions.get(name)]


def _not_finite(model: nn.Module) -> list[str]:
    """The names of the model's floating-point tensors that hold a NaN or an infinity."""
    if not isinstance(model, nn.Module):
        return []
    tensors = (*model.named_parameters(), *model.named_buffers())
    with one_torch_thread():  # a sum a tensor: one thread each is fastest, and not held up by a busy core
        return [name for name, t in tensors if t.is_floating_point() and not _finite(t)]


def _finite(tensor: torch.Tensor) -> bool:
    """No NaN or infinity in `tensor`. A finite sum says so (a NaN or an infinity would be in it), in a
    tenth of isfinite's time; a sum that is not (or overflowed) is checked element by element."""
    tensor = tensor.detach()
    return bool(torch.isfinite(tensor.sum())) or bool(torch.isfinite(tensor).all())


@contextlib.contextmanager
def _on_cpu(model: nn.Module):
    """Initialise on the CPU (where the generator draws and the solves run in float64) and put the
    weights back where they were: the same weights whatever the model's device, in place (the same
    Parameter objects, so an optimiser or DDP built on them keeps them)."""
    if not isinstance(model, nn.Module):  # the adapters name what they take
        yield
        return
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    if devices <= {torch.device("cpu")}:
        yield
        return
    if len(devices) > 1:
        raise ValueError(f"the model is spread over {sorted(map(str, devices))}: initialise it on one device")
    device = devices.pop()
    model.cpu()
    token = SOLVE_DEVICE.set(device if device.type == "cuda" else torch.device("cpu"))  # the paper's solve there
    try:
        yield
    finally:
        SOLVE_DEVICE.reset(token)
        model.to(device)


def _initialize(
    model: nn.Module, method: str, kernel_size: int | None, seed: int, given: dict | MethodOptions, variant: str | None
) -> Report:
    generator = torch.Generator().manual_seed(seed)
    check_has_blocks(model, method)
    conv = get_conv_adapter(model)
    if conv is not None:
        return _initialize_filters(model, conv, method, kernel_size, seed, generator, given)
    kernel_size = 3 if kernel_size is None else kernel_size
    family, adapter = family_of(model)
    if method not in family.methods:
        hint = " (a ConvMixer filter init)" if method in FILTER_METHODS else ""
        raise ValueError(
            f"unknown init method {method!r}{hint} for {adapter.family}; choose one of {', '.join(family.methods)}"
        )
    if variant in VARIANTS and family is not VIT_FAMILY:
        raise ValueError(
            f"{variant} is a setting of the plain ViT's impulse init ({read_label(variant).options}); {adapter.family} "
            f"has its own: use impulse (structinit init --list-options)"
        )
    init = family.methods[method]
    resolved = _resolve(init.options, method, given)
    proj = adapter.patch_projection() if hasattr(adapter, "patch_projection") else None  # not Swin's, Mixer's
    check_kernel_size(kernel_size, adapter.grid, proj.stride[0] if proj is not None else None)
    if init.check is not None:  # every refusal before the first write
        init.check(adapter, resolved)
    start = time.perf_counter()
    with torch.no_grad():
        base = getattr(resolved, "base", "keep")  # the layers a structured init does not set
        if base != "keep":
            (adapter.reset_timm if base == "timm" else adapter.reset_kaiming)(generator)
        if isinstance(adapter, ModelAdapter) and init.embeddings == "seeded" and base == "keep":  # a base drew them
            adapter.redraw_embeddings(generator)
        source: dict[str, str] = {}
        sources = {"source": source} if init.records_source else {}
        layers = init.run(adapter, generator, kernel_size=kernel_size, options=resolved, **sources)
    seconds = time.perf_counter() - start
    record = {"kernel_size": kernel_size, **resolved.to_dict()}
    return Report(method, type(model).__name__, layers, seconds, seed, record, family.measured_on, family.unit, source)


# where a family keeps its blocks: a model built with none has nothing an init could set
BLOCK_LISTS = (
    "blocks",
    "layers",
    "stages",
    "encoder.layer",
    "encoder.layers",
    "vit.encoder.layer",
    "vit.encoder.layers",
)


def check_has_blocks(model: nn.Module, method: str) -> None:
    """ValueError where the model's block list is empty (built with depth 0), before anything is written."""
    for path in BLOCK_LISTS:
        found: Any = model
        for name in path.split("."):
            found = getattr(found, name, None)
        if isinstance(found, (nn.Sequential, nn.ModuleList)) and len(found) == 0:
            raise ValueError(
                f"the model has no blocks ({path} is empty: built with depth 0): the {method} init has nothing to set"
            )


def _variant(method: Any) -> str | None:
    """The name a label starts with ('impulse-neurips' of 'impulse-neurips[...]'), for the family check."""
    return method.partition("[")[0] if isinstance(method, str) else None


def _split_method(
    method: str | MethodOptions, options: dict[str, Any], kernel_size: int | None
) -> tuple[str, dict | MethodOptions, int | None]:
    """`initialize`'s method, options and kernel size: a name or a label and keywords, or an options
    instance (its method implied)."""
    if isinstance(method, MethodOptions):
        if method.method is None:
            name = type(method).__name__
            raise TypeError(f"{name} serves several methods: give the method's name, and the options as keywords")
        if options:
            raise TypeError("give the options either as an options object or as keywords, not both")
        return method.method, method, kernel_size
    if not isinstance(method, str):
        raise TypeError(f"method must be a name such as 'impulse' or an options object, got {method!r}")
    if method in VARIANTS or "[" in method:  # a named setting (impulse-soft) or a label; keywords override it
        spec = read_label(method)
        return spec.method, {**spec.options, **options}, spec.kernel_size if kernel_size is None else kernel_size
    return method, options, kernel_size


def _resolve(cls: type[MethodOptions], method: str, given: dict | MethodOptions) -> MethodOptions:
    if isinstance(given, MethodOptions):
        if type(given) is not cls:
            raise TypeError(f"this model's {method!r} init takes {cls.__name__}, got {type(given).__name__}")
        return given
    return cls.build(method, given)


def _initialize_filters(
    model: nn.Module,
    adapter: ConvMixerAdapter,
    method: str,
    kernel_size: int | None,
    seed: int,
    generator: torch.Generator,
    given: dict | MethodOptions,
) -> Report:
    if kernel_size is not None and kernel_size != adapter.kernel_size:
        raise ValueError(
            f"kernel_size {kernel_size} does not match this ConvMixer's {adapter.kernel_size} x "
            f"{adapter.kernel_size} depthwise filters (create the model with kernel_size={kernel_size})"
        )
    options = _resolve(FilterOptions, method, given)
    if method == "impulse" and adapter.kernel_size % 2 == 0:
        raise ValueError(
            f"this ConvMixer's {adapter.kernel_size} x {adapter.kernel_size} filters have no centre, and an impulse "
            "filter sits at an offset from one: create it with an odd kernel_size (random and box take any)"
        )
    start = time.perf_counter()
    with torch.no_grad():
        layers = init_filters(adapter, method, generator, options)
    record = {"kernel_size": adapter.kernel_size, **options.to_dict()}
    return Report(method, type(model).__name__, layers, time.perf_counter() - start, seed, record, "filters", "filter")
