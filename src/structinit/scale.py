"""The scale of a model's attention logits at init: every head's Frobenius norm of W_q and of W_k."""

from __future__ import annotations

from torch import nn

from .adapters import get_adapter


def head_qk_norms(model: nn.Module) -> list[float]:
    """Every head's Frobenius norm of W_q and of W_k, layer by layer (per layer: the heads' Q, then their K)."""
    norms = []
    for layer in get_adapter(model).layers():
        for weight in layer.qk_weights():
            norms += weight.detach().view(layer.num_heads, layer.head_dim, -1).norm(dim=(1, 2)).tolist()
    return norms
