"""The baselines: timm's init, PyTorch's default (kaiming) and mimetic (Trockman & Kolter, ICML 2023)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from ..adapters import ModelAdapter
from ..report import LayerReport
from .options import MimeticOptions, NoOptions
from .solvers import balanced_factors
from .threads import parallel_map
from .weights import write_heads, write_value_factors, z_sampler


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
    task = "mimetic: this model's factorisations (each head's W_q W_k^T, each layer's W_v W_proj)"
    factors = iter(parallel_map(lambda job: balanced_factors(*job), _mimetic_targets(layers, o, sample), task=task))
    for layer in layers:
        heads = [next(factors) for _ in range(layer.num_heads)]
        wq, wk = layer.qk_weights()
        write_heads(wq, torch.stack([q for q, _ in heads])), write_heads(wk, torch.stack([k for _, k in heads]))
        write_value_factors(layer, *next(factors))
    return adapter.measured_layers(kernel_size)


def _mimetic_targets(layers: list, o: MimeticOptions, sample: Callable[[int, int], torch.Tensor]) -> Iterator[tuple]:
    """(target, rank) for each head's W_q W_k^T and each layer's W_v W_proj, drawn in order from the one
    generator as the workers factorise the ones before."""
    for layer in layers:
        dim = layer.qk_weights()[0].shape[1]
        eye = torch.eye(dim)
        yield from ((target, layer.head_dim) for target in o.qk_alpha * sample(layer.num_heads, dim) + o.qk_beta * eye)
        yield o.vproj_alpha * sample(1, dim)[0] - o.vproj_beta * eye, layer.value_weights()[0].shape[0]
