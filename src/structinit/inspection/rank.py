"""Stable rank of a network's token features: how many directions the patch embeddings and each
block's output really use (paper Section 3: patch embeddings are low-rank, so f^2 filters suffice).

Stable rank of a matrix A is ||A||_F^2 / ||A||_2^2 = sum(sigma^2) / max(sigma)^2: between 1 (one
direction) and rank(A) <= min(N, D), and unlike the rank it does not count tiny singular values.
Each image gives an N x D matrix (grid tokens x channels); we report the mean over images.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..adapters import get_adapter
from ..adapters.convmixer import get_conv_adapter
from ..files import fitted_title, save_figure


def stable_rank(matrices: torch.Tensor) -> torch.Tensor:
    """Stable rank of a matrix (..., N, D), batched over leading dimensions; 0 for a zero matrix."""
    if matrices.dim() < 2:
        raise ValueError(f"stable_rank needs a matrix (..., N, D), got shape {tuple(matrices.shape)}")
    sigma = torch.linalg.svdvals(matrices.double())
    top = sigma[..., 0] ** 2
    return torch.where(top > 0, (sigma**2).sum(-1) / top.clamp_min(1e-300), torch.zeros_like(top))


@dataclass
class LayerRank:
    name: str  # "patch embedding", "block 1", ...
    stable_rank: float  # mean over images
    bound: int  # min(N, D): the largest rank an N x D matrix can have


@torch.no_grad()
def feature_ranks(model: nn.Module, images: torch.Tensor) -> list[LayerRank]:
    """Mean stable rank over `images` (B, C, H, W, normalised as the model expects) of the patch
    embeddings and of every block's output, for timm ViTs and ConvMixers."""
    if not isinstance(images, torch.Tensor) or images.dim() != 4 or len(images) == 0:
        raise ValueError(
            f"images must be a non-empty (B, C, H, W) tensor, got {getattr(images, 'shape', type(images))}"
        )
    was_training = model.training
    model.eval()
    try:
        features = _features(model, images)
    finally:
        model.train(was_training)
    return [LayerRank(name, float(stable_rank(x).mean()), min(x.shape[-2], x.shape[-1])) for name, x in features]


def _features(model: nn.Module, images: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, (B, N, D) grid-token features) for the patch embedding and each block."""
    conv = get_conv_adapter(model)
    if conv is not None:
        x = conv.embed(images)
        features = [("patch embedding", x)]
        for i in range(conv.num_blocks):
            x = conv.run_block(i, x)
            features.append((f"block {i + 1}", x))
        return [(name, f.flatten(2).transpose(1, 2)) for name, f in features]
    adapter = get_adapter(model)
    prefix = adapter.num_prefix_tokens
    features = [("patch embedding", adapter.patch_tokens(images))]
    x = adapter.embed(images)
    for i in range(len(adapter.layers())):
        x = adapter.run_block(i, x)
        features.append((f"block {i + 1}", x[:, prefix:]))
    return features


def rank_figure(
    target: str,
    *,
    data: str | None = None,
    images: int = 256,
    at_init: bool = False,
    init: str = "impulse",
    model_kwargs: dict[str, Any] | None = None,
    seed: int = 0,
    out: str | Path = "rank.png",
) -> tuple[list[LayerRank], Path]:
    """`structinit rank`: stable ranks of a run's or a model's features on `images` test images,
    and a PNG of them per layer with min(N, D) drawn for reference."""
    from ..data.batches import normalised_test_images
    from .target import load_target

    model, dataset, title, _ = load_target(
        target, data=data, at_init=at_init, init=init, model_kwargs=model_kwargs, seed=seed
    )
    batch = normalised_test_images(model, dataset, images)
    ranks = feature_ranks(model, batch)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_ranks(ranks, out, f"{title}: stable rank over {len(batch)} test images")
    return ranks, out


def ranks_table(ranks: list[LayerRank]) -> str:
    lines = ["| features | stable rank | min(N, D) |", "|---|---|---|"]
    lines += [f"| {r.name} | {r.stable_rank:.2f} | {r.bound} |" for r in ranks]
    return "\n".join(lines) + "\n"


def plot_ranks(ranks, path: Path, title: str = "") -> None:
    """Stable rank per layer (patch embedding, then each block), with min(N, D), the largest
    possible rank, as a dashed line: how far below it the features live."""
    plt = _plt()
    from matplotlib.ticker import LogFormatter

    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(ranks)), 3.6))
    x = np.arange(len(ranks))
    ax.plot(x, [r.stable_rank for r in ranks], "o-", label="stable rank (mean over images)")
    ax.plot(x, [r.bound for r in ranks], "--", color="grey", label="min(N, D)")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(LogFormatter())  # plain numbers: 60, not 6x10^1
    ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    ax.set_xticks(x, [r.name.replace("patch embedding", "patch emb.") for r in ranks], rotation=45, ha="right")
    ax.set_ylabel("stable rank")
    ax.set_title(fitted_title(title, fig.get_figwidth(), 9), fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, 120)
    plt.close(fig)


def _plt():
    """matplotlib, drawing to files (imported when a figure is made)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
