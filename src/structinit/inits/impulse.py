"""The method of the paper (Zheng et al., NeurIPS 2025): each head's attention map an impulse filter,
solved from a pseudo input; and its control, qk-norm, the same bundle without the structure."""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from dataclasses import dataclass

import torch

from ..adapters import AttentionLayer, ModelAdapter
from ..adapters.base import timm_embeddings_
from ..offsets import Offset, assign_offsets, offset_mass, target_indices
from ..report import HeadReport, LayerReport
from .options import ImpulseOptions, QKNormOptions
from .sharpness import paper_sharpness
from .solvers import PseudoInput, authors_closed_form, closed_form, gain_for_fidelity, refine
from .weights import write_heads, write_value_proj, z_sampler


def init_impulse(
    adapter: ModelAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: ImpulseOptions,
    source: dict[str, str] | None = None,
) -> list[LayerReport]:
    """Impulse init: per layer, give each head an offset of the f x f kernel, normalise the pseudo input
    with the layer's norm, solve Q and K so that each query puts `target_fidelity` of its mass on key
    p + offset (closed form, or the authors' least squares; `refine`: then Adam on the paper's objective),
    write them (and V/proj) and measure the maps. Post-norm blocks are solved on what their attention
    reads, the previous block's output (as with `propagate`). The options are `ImpulseOptions`'
    (each with its help); the reasons and measured numbers are in docs/methods.md. No target_fidelity:
    the mass the paper's own solve reaches on layer 0's pseudo input (sharpness.py), in `source`."""
    o = options
    layers = adapter.layers()
    _scale_position(adapter, o.pos_scale, o.scale)
    tokens = _pseudo_tokens(adapter, o.pseudo_input, o.noise_std, generator)
    if o.target_fidelity is None and o.solver != "authors":  # the authors' solver has no target
        patches = tokens[adapter.num_prefix_tokens :]
        if adapter.learned_position() is not None:  # a draw of its shape: the solve reads the shape, not the draw
            patches = torch.empty(patches.shape)
            timm_embeddings_(patches, [], torch.Generator().manual_seed(0))
        patches = layers[0].norm(patches.to(tokens.dtype).unsqueeze(0))[0]
        sharpness, found = paper_sharpness(patches, adapter.grid, layers[0].num_heads, kernel_size)
        o = dataclasses.replace(o, target_fidelity=sharpness)
        if source is not None:
            source["target_fidelity"] = f"{sharpness} (what the paper's solve reaches here; {found})"
    post_norm = adapter.post_norm  # a post-norm attention reads the previous block's output as it is
    content = content_basis(adapter, centred=not post_norm) if o.blind_to_content else None
    sample = z_sampler("uniform", generator)
    solved: list[_Solved] = []
    pseudo: PseudoInput | None = None
    for i, layer in enumerate(layers):
        start = time.perf_counter()
        offsets = assign_offsets(layer.num_heads, kernel_size, o.assignment, generator)
        pseudo = _pseudo_input(layer, tokens, content, pseudo, o.rcond)
        q, k = _solve(pseudo, offsets, layer, adapter, o, generator)
        if o.solver == "refine":
            q, k = _refined(pseudo, q, k, offsets, layer, adapter, o)
        if o.vproj == "mimetic":
            write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
        if (o.propagate or post_norm) and i + 1 < len(layers):  # the next layer's pseudo input: this block's output
            _write_qk(layer, q, k, pseudo.x, offsets, adapter, o)
            tokens = adapter.run_block(i, tokens.unsqueeze(0))[0]
        solved.append(_Solved(pseudo, q, k, offsets, time.perf_counter() - start))
    reports = [_write_and_measure(i, layer, s, adapter, o) for i, (layer, s) in enumerate(zip(layers, solved))]
    _warn_if_short(reports, o, layers[0].head_dim, solved[-1].pseudo.x.shape[0])
    return reports


def check_impulse(adapter: ModelAdapter, options: ImpulseOptions) -> None:
    """Every refusal of init_impulse for this model and these options, before anything is written."""
    if adapter.position_embedding() is None:
        raise ValueError(
            "the impulse init solves Q/K from the model's position embedding, and this model has none "
            "(pos_embed is None); create it with a position embedding (timm: pos_embed='learn')"
        )
    layers = adapter.layers()
    if not layers:
        raise ValueError("the model has no attention layers (depth 0): the impulse init has nothing to set")
    if options.solver == "authors" and options.target_fidelity is not None:
        raise ValueError(
            f"target_fidelity={options.target_fidelity}: the authors' solver (impulse-neurips) sets no strength, "
            "its maps are as sharp as its qk_scale makes them; give impulse[target_fidelity=...] instead"
        )
    shrinks = options.scale == "content" and _scales_position(adapter, options.pos_scale)
    if shrinks and adapter.patch_projection() is None:
        raise ValueError(
            "scale=content divides the patch projection, and this model's patch embedding is not one linear "
            "map (a norm follows it, or another stem): use scale=position"
        )
    norms = [norm for layer in layers for norm in layer.qk_norms() or ()]
    if options.solver != "authors" and any(getattr(norm, "weight", None) is None for norm in norms):
        raise ValueError("the impulse init needs affine q/k norms (a weight to set the attention's sharpness)")


@dataclass
class _Solved:
    """One layer's solve: its pseudo input, Q and K (heads, D, d), offsets, and the seconds it took."""

    pseudo: PseudoInput
    q: torch.Tensor
    k: torch.Tensor
    offsets: list[Offset]
    seconds: float


def _pseudo_input(
    layer: AttentionLayer,
    tokens: torch.Tensor,
    content: torch.Tensor | None,
    previous: PseudoInput | None,
    rcond: float,
) -> PseudoInput:
    """The layer's norm of the pseudo tokens, outside the content directions; `previous` where equal (one
    factorisation for the layers that see the same input)."""
    x = layer.norm(tokens.unsqueeze(0))[0].double().cpu()
    if content is not None:
        x = x - (x @ content) @ content.T
    if previous is not None and torch.equal(x, previous.x):
        return previous
    return PseudoInput(x, rcond)


def _solve(
    pseudo: PseudoInput,
    offsets: list[Offset],
    layer: AttentionLayer,
    adapter: ModelAdapter,
    o: ImpulseOptions,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    grid, prefix, d = adapter.grid, adapter.num_prefix_tokens, layer.head_dim
    if o.solver == "authors":
        return authors_closed_form(pseudo, offsets, grid, prefix, d, generator, o.qk_scale)
    zero_mean = layer.qk_norms() is not None
    return closed_form(pseudo, offsets, grid, prefix, o.target_fidelity, layer.scale, d, generator, zero_mean)


def _refined(
    pseudo: PseudoInput,
    q: torch.Tensor,
    k: torch.Tensor,
    offsets: list[Offset],
    layer: AttentionLayer,
    adapter: ModelAdapter,
    o: ImpulseOptions,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The paper's Algorithm 1 from the closed form, over every head of the layer at once."""
    grid, prefix = adapter.grid, adapter.num_prefix_tokens
    qs, ks = refine([pseudo], [q], [k], [layer.scale], [offsets], grid, prefix, steps=o.refine_steps, lr=o.refine_lr)
    return qs[0], ks[0]


def _write_qk(
    layer: AttentionLayer,
    q: torch.Tensor,
    k: torch.Tensor,
    x: torch.Tensor,
    offsets: list[Offset],
    adapter: ModelAdapter,
    o: ImpulseOptions,
) -> torch.Tensor:
    """Write Q and K, zero their biases and, with q/k norms, set the norms' gain; returns the pseudo
    input `x` as a batch of one on the weights' device and dtype."""
    wq, wk = layer.qk_weights()
    write_heads(wq, q), write_heads(wk, k)
    for bias in layer.qk_biases():
        if bias is not None:
            bias.zero_()
    x = x.to(wq.device, wq.dtype).unsqueeze(0)
    if layer.qk_norms() is not None and o.solver != "authors":
        _set_qk_norm_gain(layer, x, offsets, adapter.grid, adapter.num_prefix_tokens, o.target_fidelity)
    return x


def _write_and_measure(
    index: int, layer: AttentionLayer, solved: _Solved, adapter: ModelAdapter, o: ImpulseOptions
) -> LayerReport:
    x = _write_qk(layer, solved.q, solved.k, solved.pseudo.x, solved.offsets, adapter, o)
    mass = offset_mass(layer.attention(x).float(), solved.offsets, adapter.grid, adapter.num_prefix_tokens)
    heads = [HeadReport(offset, float(f)) for offset, f in zip(solved.offsets, mass)]
    return LayerReport(index, heads, solved.seconds)


def _warn_if_short(reports: list[LayerReport], o: ImpulseOptions, head_dim: int, tokens: int) -> None:
    """Warn where a head falls short of target_fidelity, with the reason its solver has."""
    worst = min(h.fidelity for layer in reports for h in layer.heads)
    target = 0.98 if o.target_fidelity is None else o.target_fidelity  # the authors' solver aims at an impulse
    if worst >= target - 0.01:
        return
    if o.solver == "authors":
        why = (
            f"the authors' solver truncates each head's least-squares map to rank head_dim {head_dim}, which "
            f"blurs it for {tokens} tokens; solver='closed_form' reaches the target"
        )
    else:
        why = (
            f"head_dim {head_dim} is small for {tokens} tokens (codes of that length are not orthogonal enough); "
            "solver='refine', fewer heads or a smaller kernel do better"
        )
    warnings.warn(
        f"impulse init: the worst head reaches fidelity {worst:.3f} (a uniform map: {1 / tokens:.3f}), short of "
        f"target_fidelity={target}: {why}",
        stacklevel=5,
    )


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
            for weight in layer.qk_weights():
                heads = weight.view(layer.num_heads, layer.head_dim, -1)
                norms = torch.linalg.vector_norm(heads.double(), dim=(1, 2), keepdim=True).clamp_min(1e-12)
                heads.mul_((o.norm / norms).to(heads))
        if o.vproj == "mimetic":
            write_value_proj(layer, o.vproj_alpha, o.vproj_beta, sample)
    return adapter.measured_layers(kernel_size)


def check_qk_norm(adapter: ModelAdapter, options: QKNormOptions) -> None:
    """The refusal of init_qk_norm, before anything is written."""
    if options.norm is not None and any(layer.qk_norms() is not None for layer in adapter.layers()):
        raise ValueError(
            "qk-norm: this model normalises each head's q and k (qk_norm), so the scale of W_q and W_k "
            "does not reach the attention; use norm=None"
        )


def _set_qk_norm_gain(
    layer: AttentionLayer, x: torch.Tensor, offsets: list[Offset], grid: tuple[int, int], prefix: int, fidelity: float
) -> None:
    """With q/k norms, the norms fix the logits' scale: set both norms' gains to one value g (shared by
    the layer's heads, as the norms are) so that the heads reach `fidelity` on average."""
    norms = layer.qk_norms()
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
    and prefix tokens down by the same factor (how="content"); a fixed table or pos_scale None: nothing."""
    if not _scales_position(adapter, pos_scale):
        return
    pos = adapter.learned_position()
    factor = 0.02 * pos_scale / pos.std()
    if how == "position":
        pos.mul_(factor)
    else:
        _shrink_content(adapter, factor)


def _scales_position(adapter: ModelAdapter, pos_scale: float | None) -> bool:
    """Whether pos_scale acts: it is given, and the position embedding is learned."""
    return pos_scale is not None and adapter.learned_position() is not None


def _shrink_content(adapter: ModelAdapter, factor: torch.Tensor) -> None:
    """Divide the patch projection and the prefix tokens by `factor`: the tokens entering the first
    block are those of a position embedding multiplied by it, divided by it."""
    proj = adapter.patch_projection()
    for param in (proj.weight, proj.bias, *adapter.prefix_tokens()):
        if param is not None:
            param.div_(factor)


def content_basis(adapter: ModelAdapter, centred: bool) -> torch.Tensor | None:
    """Orthonormal basis (D, m) of the directions a patch embedding can take, layer-normalised
    (`centred`) or as it is (a post-norm attention's input), when they leave room for position
    (m < D / 2): Q and K solved outside them see position only."""
    columns = adapter.content_directions()
    if columns is None or columns.shape[1] >= columns.shape[0] / 2:  # spans (nearly) everything
        return None
    columns = columns.double().cpu()
    if centred:  # LayerNorm centres every token
        columns = columns - columns.mean(0, keepdim=True)
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
