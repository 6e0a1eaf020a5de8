"""The baselines: timm's init, PyTorch's default (kaiming) and mimetic (Trockman & Kolter, ICML 2023)."""

from __future__ import annotations

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
