"""The inits: timm, kaiming, mimetic and impulse, behind one call, `initialize`.

Every method draws its randomness from one `torch.Generator` seeded by `seed`, computes on the CPU
in float64 where it solves, and writes the results into the model's parameters in place, so the
same seed gives bit-identical weights on any device.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch import nn

from .adapters import AttentionLayer, ModelAdapter, get_adapter, unwrap
from .adapters.convmixer import ConvMixerAdapter, get_conv_adapter
from .adapters.mixer import MixerAdapter
from .adapters.swin import SwinAdapter
from .errors import first_line
from .fidelity import offset_mass
from .filter_inits import FILTER_METHODS, init_filters
from .filters import Offset, assign_offsets, check_kernel_size, target_indices
from .method_options import (
    FilterOptions,
    ImpulseOptions,
    MethodOptions,
    MimeticOptions,
    MixerImpulseOptions,
    NoOptions,
    QKNormOptions,
    SwinImpulseOptions,
)
from .mixer_init import init_mixer_impulse
from .options import VARIANTS
from .report import HeadReport, LayerReport, Report
from .solvers import PseudoInput, authors_closed_form, balanced_factors, closed_form, gain_for_fidelity, refine
from .swin_init import init_swin_impulse
from .weights import write_heads, write_value_factors, write_value_proj, z_sampler


def initialize(
    model: nn.Module, method: str, *, kernel_size: int | None = None, seed: int | None = None, **options: Any
) -> Report:
    """Initialise `model` in place with `method` and return a report.

    Vision transformers: "timm", "kaiming", "mimetic", "impulse", "qk-norm" (the control: the impulse
    bundle without its structure); see each `init_*` function for its
    options. A named setting of a method (options.VARIANTS: "impulse-soft", the soft maps chosen at 64
    tokens, and "impulse-authors") is taken too, keywords overriding its options. `kernel_size` (default 3)
    is the f of the f x f kernel: the impulse offsets, and the offsets against which every method's
    attention maps are measured in the report.
    Swin v1: "timm", "kaiming", "mimetic", "impulse" (through the relative-position bias,
    swin_init.py); MLP-Mixer: "timm", "kaiming", "impulse" (the token-mixing MLP, mixer_init.py);
    `structinit init --list-models` lists every family.
    ConvMixer: "random", "impulse", "box" set its depthwise filters, option `freeze`
    (see filter_inits.py); its kernel size is the model's own.
    `seed=None` draws a seed from torch's global RNG (so `torch.manual_seed` makes it
    reproducible); the report records it. The same seed gives bit-identical weights for the same
    model configuration, however the model was constructed: a ViT's mimetic and impulse inits draw
    the learned position embedding and prefix tokens, which they read, from the seed's generator
    (at timm's init); everything else they write is drawn from it too. Of the weights they leave,
    impulse reads only the patch embedding (with blind_to_content, the maps ignore its span), and
    with propagate=True every block's output (qk-norm rescales the Q/K it finds: with base="timm" or
    "kaiming" every weight is drawn from the seed); `structinit init --seed` and the trainer seed the
    model's construction as well, so their weights repeat exactly. A model wrapped by torch.compile,
    DistributedDataParallel or DataParallel is initialised through the wrapper (they share weights).
    """
    if seed is None:
        seed = int(torch.randint(2**31 - 1, (1,)))
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int or None, got {seed!r}")
    method, given = _split_method(method, options)
    model = unwrap(model)
    if isinstance(model, nn.Module) and any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise ValueError(
            "the model's weights are on the meta device (no values): materialise it first, e.g. "
            "model.to_empty(device='cpu'), then initialise it"
        )
    try:
        with _on_cpu(model), one_torch_thread():
            report = _initialize(model, method, kernel_size, seed, given)
        failed = ""
    except torch.linalg.LinAlgError as error:  # a solve on numbers an option made non-finite
        report, failed = None, f" ({first_line(error)})"
    bad = _not_finite(model)
    if bad or failed:
        listed = f"{len(bad)} tensor(s) not finite ({', '.join(bad[:3])})" if bad else "non-finite numbers"
        raise ValueError(
            f"the init {method} made {listed}{failed}: check its options ({given}); the model's weights are "
            "spoilt, create it again"
        )
    return report


def _not_finite(model: nn.Module) -> list[str]:
    """The names of the model's floating-point tensors that hold a NaN or an infinity."""
    if not isinstance(model, nn.Module):
        return []
    tensors = (*model.named_parameters(), *model.named_buffers())
    return [name for name, t in tensors if t.is_floating_point() and not torch.isfinite(t).all()]


def parallel_map(function: Callable[[Any], Any], items: list[Any]) -> list[Any]:
    """`function` over `items` in a pool of threads, each op inside on one torch thread.

    The init's factorisations are many independent small ones: one OpenMP team splitting each of
    them stalls at every barrier when another process holds the cores (ViT-B impulse 4.6 s instead
    of 1.9 s beside a busy process), while independent single-threaded ops just share the cores.
    One thread per op also makes the init's numbers independent of torch's thread count."""
    workers = max(1, min(_WORKERS.get() or torch.get_num_threads(), len(items)))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(function, items))


# the threads torch had before one_torch_thread: parallel_map's pool size
_WORKERS: contextvars.ContextVar[int | None] = contextvars.ContextVar("init_workers", default=None)


@contextlib.contextmanager
def one_torch_thread():
    """Run torch ops with one intra-op thread; parallel_map runs as many at once as torch had threads."""
    before = torch.get_num_threads()
    token = _WORKERS.set(before)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        _WORKERS.reset(token)


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
    model.cpu()
    try:
        yield
    finally:
        model.to(devices.pop())


def _initialize(
    model: nn.Module, method: str, kernel_size: int | None, seed: int, given: dict | MethodOptions
) -> Report:
    generator = torch.Generator().manual_seed(seed)
    conv = get_conv_adapter(model)
    if conv is not None:
        return _initialize_filters(model, conv, method, kernel_size, seed, generator, given)
    kernel_size = 3 if kernel_size is None else kernel_size
    family, adapter = _family(model)
    if method not in family.methods:
        hint = " (a ConvMixer filter init)" if method in FILTER_METHODS else ""
        raise ValueError(
            f"unknown init method {method!r}{hint} for {adapter.family}; choose one of {', '.join(family.methods)}"
        )
    init = family.methods[method]
    resolved = _resolve(init.options, method, given)
    check_kernel_size(kernel_size, adapter.grid)
    start = time.perf_counter()
    with torch.no_grad():
        base = getattr(resolved, "base", "keep")  # the layers a structured init does not set
        if base != "keep":
            (adapter.reset_timm if base == "timm" else adapter.reset_kaiming)(generator)
        if isinstance(adapter, ModelAdapter) and method not in ("timm", "kaiming"):  # those two redraw all
            adapter.redraw_embeddings(generator)
        layers = init.run(adapter, generator, kernel_size=kernel_size, options=resolved)
    seconds = time.perf_counter() - start
    record = {"kernel_size": kernel_size, **resolved.to_dict()}
    return Report(method, type(model).__name__, layers, seconds, seed, record, family.measured_on, family.unit)


def _split_method(method: str | MethodOptions, options: dict[str, Any]) -> tuple[str, dict | MethodOptions]:
    """`initialize`'s method and options: a name and keywords, or an options instance (its method implied)."""
    if isinstance(method, MethodOptions):
        if method.method is None:
            name = type(method).__name__
            raise TypeError(f"{name} serves several methods: give the method's name, and the options as keywords")
        if options:
            raise TypeError("give the options either as an options object or as keywords, not both")
        return method.method, method
    if not isinstance(method, str):
        raise TypeError(f"method must be a name such as 'impulse' or an options object, got {method!r}")
    if method in VARIANTS:  # a named setting of a method, e.g. impulse-soft; keywords override it
        return VARIANTS[method][0], {**VARIANTS[method][1], **options}
    return method, options


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
            then = {**cls().to_dict(), **{k: v for k, v in recorded.items() if k in now}}
            return then, now
    return None


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
    start = time.perf_counter()
    with torch.no_grad():
        layers = init_filters(adapter, method, generator, options)
    record = {"kernel_size": adapter.kernel_size, **options.to_dict()}
    return Report(method, type(model).__name__, layers, time.perf_counter() - start, seed, record, "filters", "filter")


# --- baselines -------------------------------------------------------------------------------


def init_timm(
    adapter: ModelAdapter, generator: torch.Generator, *, kernel_size: int, options: NoOptions
) -> list[LayerReport]:
    """timm's ViT init: trunc-normal(0.02) Linear weights, zero biases, trunc-normal(0.02) pos_embed,
    class/register tokens N(0, 1e-6) (timm.models.vision_transformer.init_weights_vit_timm)."""
    adapter.reset_timm(generator)
    return adapter.measured_layers(kernel_size)


def init_kaiming(
    adapter: ModelAdapter, generator: torch.Generator, *, kernel_size: int, options: NoOptions
) -> list[LayerReport]:
    """PyTorch's default Linear/Conv init, kaiming_uniform(a=sqrt(5)) weights and U(+-1/sqrt(fan_in))
    biases: what timm's weight_init="skip" leaves (the paper's "Kaiming Uniform" row). Position
    embedding trunc-normal(0.02) and tokens N(0, 1e-6) as in timm, since "skip" leaves them unset."""
    adapter.reset_kaiming(generator)
    return adapter.measured_layers(kernel_size)


def init_mimetic(
    adapter: ModelAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: MimeticOptions,
) -> list[LayerReport]:
    """Mimetic init (Trockman & Kolter, ICML 2023), on top of the model's current weights.

    Per layer and head, W_q W_k^T is the best rank-head_dim approximation of qk_alpha Z + qk_beta I;
    per layer, W_v W_proj = vproj_alpha Z - vproj_beta I; both factored by SVD into balanced factors
    (U sqrt(S), V sqrt(S)). Z has i.i.d. entries of variance 1/D, uniform (the authors' code) or
    normal (`distribution`). Only Q, K, V and proj weights change.
    """
    o = options
    sample = z_sampler(o.distribution, generator)
    layers = adapter.layers()
    jobs = []  # drawn in order from the one generator; factorised a layer per worker
    for layer in layers:
        wq, wv = layer.qk_weights()[0], layer.value_weights()[0]
        dim = wq.shape[1]
        eye = torch.eye(dim)
        jobs.append((o.qk_alpha * sample(layer.num_heads, dim) + o.qk_beta * eye, layer.head_dim))
        jobs.append((o.vproj_alpha * sample(1, dim)[0] - o.vproj_beta * eye, wv.shape[0]))
    factors = parallel_map(lambda job: balanced_factors(*job), jobs)
    for i, layer in enumerate(layers):
        (q, k), (left, right) = factors[2 * i], factors[2 * i + 1]
        wq, wk = layer.qk_weights()
        write_heads(wq, q), write_heads(wk, k)  # (h, D, d) each
        write_value_factors(layer, left, right)
    return adapter.measured_layers(kernel_size)


# --- the method of the paper ----------------------------------------------------------------


def init_impulse(
    adapter: ModelAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: ImpulseOptions,
) -> list[LayerReport]:
    """Impulse init (Zheng et al., NeurIPS 2025): each head's attention map is an impulse filter.

    Each head gets an offset of the f x f kernel (`assignment`: "random", seeded, every offset once
    before any repeats; or "ordered", the authors' centre/neighbours/diagonals). Q and K are solved so
    that softmax(scale X Q K^T X^T) puts `target_fidelity` of each query's mass on key p + offset,
    where X is the layer's norm applied to the pseudo input (`pseudo_input`: "pos_embed", the model's
    prefix tokens plus position embedding; "uniform" or "gaussian" noise; or "pos_embed+noise",
    Gaussian noise of `noise_std` times the embedding's std added; paper App. C.1).

    `solver="closed_form"`: keys get nearly orthogonal codes and queries the code of their target
    key, with the gain that gives each head exactly `target_fidelity` (see solvers.py).
    `solver="refine"`: then `refine_steps` of Adam (relative step `refine_lr`) on the paper's
    softmax-MSE objective (Algorithm 1), batched over all heads of all layers.
    `solver="authors"`: the authors' least-squares solver with their Q/K scale `qk_scale` (7), for
    comparison (see `authors_closed_form`); with assignment="ordered" and blind_to_content=False it
    is their impulse init.

    The defaults are the paper's form (target_fidelity 0.98, pos_scale 18, vproj "mimetic"); the soft
    setting chosen on the 64-token protocol is the variant "impulse-soft" (0.3, None, "keep";
    docs/convergence.md). `base`: the layers the init does not set, kept or redrawn first
    (docs/methods.md). The authors' scales: the position embedding is multiplied by 18, so that it
    weighs more against the patch content on real images. Here `pos_scale` rescales it to a standard deviation of
    pos_scale x 0.02 (timm's init std): x18 on a fresh timm model, and the same result if the init
    is applied twice; `pos_scale=None` leaves it as it is. A frozen (fixed, e.g. sin-cos) table is
    always left as it is. `scale="content"` reaches the same ratio the other way: the position
    embedding keeps its scale and the patch projection (weight and bias) and the prefix tokens are
    divided by the factor it would have been multiplied by. Every layer norm sees the same token up
    to that factor, so layer 0's maps on images are those of the grown embedding; the ratio sits in small
    weights, which Adam's lr-sized steps change quickly, instead of in a large embedding they barely
    move (docs/convergence.md). The blocks' outputs weigh that factor more against the smaller
    residual stream, so deeper layers differ from the grown embedding's. Unlike growing the position
    embedding to a set scale, this divides whatever the patch projection holds: apply it once.
    `propagate`: layer i + 1 is solved on the output of block i (already initialised) for the pseudo
    tokens, what it receives from a blank image, instead of on its norm of the pseudo tokens themselves
    (the paper's choice: every layer sees the same position embedding). With the paper's choice, deeper
    layers see shifted and mixed position codes on real images and their sharp maps land off target
    (benchmarks/bench_mechanism.py). With solver="refine", the propagation uses the closed-form weights.
    `rcond`: the solve inverts the pseudo input only along directions whose singular value is at least
    rcond x the largest (numpy's lstsq cut-off). A learned table's spectrum stays above 0.2 and is
    inverted whole; a fixed sin-cos table's (rank 15, down to 7e-4) or ViT-T's at 224 px is not:
    inverting all of it made the sin-cos ViT's Q/K weights ~750x larger and its init patch-embedding
    gradient ~50,000x, and it trained to 17.5% instead of 36.0% (benchmarks/bench_mechanism.py
    --part conditioning; benchmarks/study_small_data.py). Where the directions above rcond are too few
    for an offset to reach `target_fidelity` (the paper's 256-token grid with a sin-cos table keeps 11
    for heads of dimension 16), the next ones are added until it does (13 there).
    `blind_to_content`: where the patch embedding can only reach a subspace of less than half the
    width (small patches: 3 x 4 x 4 = 48 of 192 dimensions at 32 px / patch 4), Q and K are solved
    outside it, so that patch content reaches the logits only through the norm's scale (first-layer
    fidelity on CIFAR-10 images 0.68 -> 0.74 for 12 heads, 0.66 -> 0.68 for 3:
    benchmarks/bench_details.py). V/proj get
    the mimetic form
    W_v W_proj = vproj_alpha Z - vproj_beta I (0.4, 0.4) with `vproj="mimetic"`, or keep the model's
    weights (timm's init on a fresh model) with `vproj="keep"`. Query/key biases are zeroed; MLPs, norms,
    embeddings other than the position embedding, and the head are left as they are.
    """
    o = options
    if adapter.position_embedding() is None:
        raise ValueError(
            "the impulse init solves Q/K from the model's position embedding, and this model has none "
            "(pos_embed is None); create it with a position embedding (timm: pos_embed='learn')"
        )
    _scale_position(adapter, o.pos_scale, o.scale)
    tokens = _pseudo_tokens(adapter, o.pseudo_input, o.noise_std, generator)
    content = _content_basis(adapter) if o.blind_to_content else None
    grid, prefix = adapter.grid, adapter.num_prefix_tokens
    layers = adapter.layers()
    sample = z_sampler("uniform", generator)
    pseudos, qs, ks, all_offsets, seconds = [], [], [], [], []
    pseudo: PseudoInput | None = None
    for i, layer in enumerate(layers):
        start = time.perf_counter()
        d = layer.head_dim
        offsets = assign_offsets(layer.num_heads, kernel_size, o.assignment, generator)
        x = layer.norm(tokens.unsqueeze(0))[0].double().cpu()
        if content is not None:
            x = x - (x @ content) @ content.T
        if pseudo is None or not torch.equal(x, pseudo.x):
            pseudo = PseudoInput(x, o.rcond)
        if o.solver == "authors":
            q, k = authors_closed_form(pseudo, offsets, grid, prefix, d, generator, o.qk_scale)
        else:
            zero_mean = layer.qk_norms() is not None
            q, k = closed_form(pseudo, offsets, grid, prefix, o.target_fidelity, layer.scale, d, generator, zero_mean)
        pseudos.append(pseudo)
        qs.append(q)
        ks.append(k)
        all_offsets.append(offsets)
        if o.vproj == "mimetic":
            write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
        if o.propagate and i + 1 < len(layers):  # the next layer's pseudo input: this block's output
            wq, wk = layer.qk_weights()
            write_heads(wq, q), write_heads(wk, k)
            for bias in layer.qk_biases():
                if bias is not None:
                    bias.zero_()
            if layer.qk_norms() is not None and o.solver != "authors":
                x_dev = x.to(wq.device, wq.dtype).unsqueeze(0)
                _set_qk_norm_gain(layer, x_dev, offsets, grid, prefix, o.target_fidelity)
            tokens = adapter.run_block(i, tokens.unsqueeze(0))[0]
        seconds.append(time.perf_counter() - start)
    if o.solver == "refine":
        start = time.perf_counter()
        qs, ks = refine(
            pseudos,
            qs,
            ks,
            [layer.scale for layer in layers],
            all_offsets,
            grid,
            prefix,
            steps=o.refine_steps,
            lr=o.refine_lr,
        )
        share = (time.perf_counter() - start) / len(layers)
        seconds = [s + share for s in seconds]
    reports = []
    for i, (layer, pseudo, q, k, offsets) in enumerate(zip(layers, pseudos, qs, ks, all_offsets)):
        wq, wk = layer.qk_weights()
        write_heads(wq, q), write_heads(wk, k)
        for bias in layer.qk_biases():
            if bias is not None:
                bias.zero_()
        x = pseudo.x.to(wq.device, wq.dtype).unsqueeze(0)
        if layer.qk_norms() is not None and o.solver != "authors":
            _set_qk_norm_gain(layer, x, offsets, grid, prefix, o.target_fidelity)
        attn = layer.attention(x)
        fid = offset_mass(attn.float(), offsets, grid, prefix)
        reports.append(LayerReport(i, [HeadReport(offset, float(f)) for offset, f in zip(offsets, fid)], seconds[i]))
    worst = min(h.fidelity for layer in reports for h in layer.heads)
    if worst < o.target_fidelity - 0.01 and o.solver != "authors":
        warnings.warn(
            f"impulse init: the worst head reaches fidelity {worst:.3f}, short of target_fidelity={o.target_fidelity}: "
            f"head_dim {layers[0].head_dim} is small for {pseudo.x.shape[0]} tokens (codes of that length are not "
            "orthogonal enough); solver='refine', fewer heads or a smaller kernel do better",
            stacklevel=3,
        )
    return reports


def init_qk_norm(
    adapter: ModelAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: QKNormOptions,
) -> list[LayerReport]:
    """The impulse init's bundle without its structure: each head's W_q and W_k keep the base's directions,
    rescaled to Frobenius norm `norm`; `pos_scale` and `vproj` act as in init_impulse. A control for
    whether an init's gain comes from the structure of its attention maps or from their scale."""
    o = options
    _scale_position(adapter, o.pos_scale, "position")
    sample = z_sampler("uniform", generator)
    for layer in adapter.layers():
        if o.norm is not None:
            if layer.qk_norms() is not None:
                raise ValueError(
                    "qk-norm: this model normalises each head's q and k (qk_norm), so the scale of W_q and W_k "
                    "does not reach the attention; use norm=None"
                )
            for weight in layer.qk_weights():
                heads = weight.view(layer.num_heads, layer.head_dim, -1)
                norms = torch.linalg.vector_norm(heads.double(), dim=(1, 2), keepdim=True).clamp_min(1e-12)
                heads.mul_((o.norm / norms).to(heads))
        if o.vproj == "mimetic":
            write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
    return adapter.measured_layers(kernel_size)


@dataclass(frozen=True)
class InitMethod:
    """An init: the function that writes the weights, and the class of its options."""

    run: Callable[..., list[LayerReport]]
    options: type[MethodOptions]


TIMM = InitMethod(init_timm, NoOptions)
KAIMING = InitMethod(init_kaiming, NoOptions)
MIMETIC = InitMethod(init_mimetic, MimeticOptions)
METHODS: dict[str, InitMethod] = {
    "timm": TIMM,
    "kaiming": KAIMING,
    "mimetic": MIMETIC,
    "impulse": InitMethod(init_impulse, ImpulseOptions),
    "qk-norm": InitMethod(init_qk_norm, QKNormOptions),
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
    Family(
        SwinAdapter,
        {
            "timm": TIMM,
            "kaiming": KAIMING,
            "mimetic": MIMETIC,
            "impulse": InitMethod(init_swin_impulse, SwinImpulseOptions),
        },
        "window pseudo input",
    ),
    Family(
        MixerAdapter,
        {"timm": TIMM, "kaiming": KAIMING, "impulse": InitMethod(init_mixer_impulse, MixerImpulseOptions)},
        "unit impulses",
        "token mixer",
    ),
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


def _family(model: nn.Module) -> tuple[Family, Any]:
    for family in FAMILIES:
        if family.adapter.matches(model):
            return family, family.adapter(model)
    return VIT_FAMILY, get_adapter(model)


def supported_models() -> str:
    """The families structinit initialises, their init methods and an example each, and the presets."""
    from .adapters import ADAPTERS
    from .models import PRESETS

    rows = [(adapter, list(METHODS)) for adapter in ADAPTERS]
    rows += [(family.adapter, list(family.methods)) for family in FAMILIES]
    rows.append((ConvMixerAdapter, list(FILTER_METHODS)))
    lines = ["families (init methods; e.g.):"]
    lines += [f"  {adapter.family}\n      {', '.join(methods)}; e.g. {adapter.example}" for adapter, methods in rows]
    lines.append("presets for small images (give the size: structinit init NAME --model-kwargs img_size=32):")
    lines += [f"  {name}" for name in PRESETS]
    return "\n".join(lines)


def options_help() -> str:
    """Every init method's options, once per options class: `structinit init --list-options`."""
    classes = [init.options for family in (VIT_FAMILY, *FAMILIES) for init in family.methods.values()]
    lines = [
        "init options go in the label's brackets, e.g. impulse[target_fidelity=0.9,kernel_size=5]; every method "
        "also takes kernel_size, the f of the f x f kernel (default 3; ConvMixer: its own)"
    ]
    for cls in dict.fromkeys([*classes, FilterOptions]):
        if cls is NoOptions:
            continue
        summary = " ".join((cls.__doc__ or "").split())
        lines.append(f"\n{cls.__name__}: {summary}")
        lines += ["  " + line.replace("\n", "\n  ") for line in cls.describe()]
    return "\n".join(lines)


# --- helpers ---------------------------------------------------------------------------------


def _set_qk_norm_gain(
    layer: AttentionLayer, x: torch.Tensor, offsets: list[Offset], grid: tuple[int, int], prefix: int, fidelity: float
) -> None:
    """With q/k norms, the norms fix the logits' scale: set both norms' gains to one value g (shared by
    the layer's heads, as the norms are) so that the heads reach `fidelity` on average."""
    norms = layer.qk_norms()
    if any(getattr(norm, "weight", None) is None for norm in norms):
        raise ValueError("the impulse init needs affine q/k norms (a weight to set the attention's sharpness)")
    for norm in norms:
        norm.weight.fill_(1.0)
        if getattr(norm, "bias", None) is not None:
            norm.bias.zero_()
    logits = torch.log(layer.attention(x)[0].double().clamp_min(1e-300))  # log-softmax at gain 1
    target, valid = target_indices(offsets, grid)
    gain = float(gain_for_fidelity(logits, target + prefix, valid, prefix, fidelity, shared=True)[0])
    for norm in norms:
        norm.weight.fill_(math.sqrt(gain))


def _scale_position(adapter: ModelAdapter, pos_scale: float | None, how: str) -> None:
    """Bring a learned position embedding to std pos_scale x 0.02 (how="position"), or the patch projection
    and prefix tokens down by the same factor (how="content"); a frozen table or pos_scale None: nothing."""
    pos = adapter.position_embedding()
    if pos_scale is None or pos is None or not pos.requires_grad:
        return
    if float(pos.std()) == 0.0:
        raise ValueError("the position embedding is constant: initialise it (e.g. method 'timm') first")
    factor = 0.02 * pos_scale / pos.std()
    if how == "position":
        pos.mul_(factor)
    else:
        _shrink_content(adapter, factor)


def _shrink_content(adapter: ModelAdapter, factor: torch.Tensor) -> None:
    """Divide the patch projection and the prefix tokens by `factor`: the tokens entering the first
    block are those of a position embedding multiplied by it, divided by it."""
    proj = adapter.patch_projection()
    if proj is None:
        raise ValueError(
            "scale=content divides the patch projection, and this model's patch embedding is not one linear "
            "map (a norm follows it, or another stem): use scale=position"
        )
    for param in (proj.weight, proj.bias, *adapter.prefix_tokens()):
        if param is not None:
            param.div_(factor)


def _content_basis(adapter: ModelAdapter) -> torch.Tensor | None:
    """Orthonormal basis (D, m) of the directions a layer-normalised patch embedding can take, when
    they leave room for position (m < D / 2): Q and K solved outside them see position only."""
    columns = adapter.content_directions()
    if columns is None or columns.shape[1] >= columns.shape[0] / 2:  # spans (nearly) everything
        return None
    columns = columns.double().cpu()
    columns = columns - columns.mean(0, keepdim=True)  # LayerNorm centres every token
    u, s, _ = torch.linalg.svd(columns, full_matrices=False)
    basis = u[:, s > s[0] * 1e-6]
    return basis if basis.shape[1] < columns.shape[0] / 2 else None


def _pseudo_tokens(adapter: ModelAdapter, kind: str, noise_std: float, generator: torch.Generator) -> torch.Tensor:
    """The (T, D) token sequence whose per-layer normalisation is the pseudo input of the solve."""
    tokens = adapter.pseudo_tokens()
    if kind == "pos_embed":
        return tokens
    noise = torch.empty(tokens.shape, dtype=torch.float64)
    if kind == "uniform":
        noise.uniform_(-math.sqrt(3.0), math.sqrt(3.0), generator=generator)
        return noise.to(tokens)
    noise.normal_(0.0, 1.0, generator=generator)
    if kind == "gaussian":
        return noise.to(tokens)
    return tokens + noise.to(tokens) * noise_std * tokens.std()


__all__ = ["METHODS", "Offset", "initialize"]
