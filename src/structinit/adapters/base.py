"""The adapter interface: what the init methods need to know about a model family.

Methods never look inside a model; they ask its adapter for the attention layers (with views of
their Q/K/V/proj weights), the token grid, the prefix tokens, the pseudo input and how to run the
blocks. A new family (Swin, MLP-Mixer, ConvMixer, ...) is a new adapter, not a change to the methods.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import torch
from timm.layers import build_sincos2d_pos_embed
from torch import nn

from ..report import HeadReport, LayerReport, best_offsets


class AttentionLayer(abc.ABC):
    """One multi-head self-attention layer and the norm in front of it (the identity in a post-norm
    block, whose norm follows the attention: the attention reads the block's input as it is)."""

    num_heads: int
    head_dim: int
    scale: float  # the factor applied to q.k logits (head_dim ** -0.5 for standard attention)
    norm: nn.Module
    post_norm: bool = False

    @abc.abstractmethod
    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views (heads * head_dim, D) of the query and key weights: q = x @ Wq.T."""

    @abc.abstractmethod
    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Views of the query and key biases, or None where the layer has none."""

    @abc.abstractmethod
    def qk_norms(self) -> tuple[nn.Module, nn.Module] | None:
        """The norms applied to each head's q and k (qk-norm), or None."""

    @abc.abstractmethod
    def value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of the value weight (heads * head_dim, D) and output projection weight (D, heads * head_dim)."""

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Attention logits (B, heads, T, T) of the layer for normalised input x (B, T, D)."""
        batch, tokens, _ = x.shape
        (wq, wk), (bq, bk) = self.qk_weights(), self.qk_biases()
        q = nn.functional.linear(x, wq, bq).reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        k = nn.functional.linear(x, wk, bk).reshape(batch, tokens, self.num_heads, self.head_dim).transpose(1, 2)
        norms = self.qk_norms()
        if norms is not None:
            q, k = norms[0](q), norms[1](k)
        return (q * self.scale) @ k.transpose(-1, -2)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Softmax attention maps (B, heads, T, T) of the layer for normalised input x (B, T, D)."""
        return torch.softmax(self.logits(x), dim=-1)


class PackedQKVLayer(AttentionLayer):
    """Attention whose q, k and v weights are the row blocks of one packed weight (timm's qkv Linear,
    nn.MultiheadAttention's in_proj), followed by an output projection."""

    @abc.abstractmethod
    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The packed weight (3 * heads * head_dim, D) and bias (or None)."""

    @abc.abstractmethod
    def out_weight(self) -> torch.Tensor:
        """The output projection's weight (D, heads * head_dim)."""

    def _split(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = self.num_heads * self.head_dim
        return tensor[:width], tensor[width : 2 * width], tensor[2 * width :]

    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, _ = self._split(self.packed()[0])
        return q, k

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        bias = self.packed()[1]
        if bias is None:
            return None, None
        q, k, _ = self._split(bias)
        return q, k

    def qk_norms(self) -> tuple[nn.Module, nn.Module] | None:
        return None

    def value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._split(self.packed()[0])[2], self.out_weight()


class ModelAdapter(abc.ABC):
    """How structinit reads and writes one model family."""

    family: ClassVar[str]  # shown in errors and listings
    example: ClassVar[str]  # a model name of the family

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @classmethod
    @abc.abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """Whether this adapter handles `model`."""

    @property
    @abc.abstractmethod
    def grid(self) -> tuple[int, int]:
        """Token grid (rows, cols) of the attention layers."""

    @property
    @abc.abstractmethod
    def num_prefix_tokens(self) -> int:
        """Tokens before the grid tokens in the sequence (class, distillation, register tokens)."""

    @abc.abstractmethod
    def layers(self) -> list[AttentionLayer]:
        """The attention layers, in forward order."""

    @abc.abstractmethod
    def position_embedding(self) -> torch.Tensor | None:
        """The additive absolute position embedding, or None if the model has none."""

    def learned_position(self) -> nn.Parameter | None:
        """The position embedding if the model learns it: a Parameter that is not the fixed 2-D sin-cos
        table of the grid. A buffer or a sin-cos table is part of the architecture, and every init keeps
        it. Decided by what the table is, not by requires_grad, which freezing a model clears everywhere."""
        position = self.position_embedding()
        if not isinstance(position, nn.Parameter) or is_sincos_table(position, self.grid):
            return None
        return position

    @abc.abstractmethod
    def pseudo_tokens(self) -> torch.Tensor:
        """The token sequence (T, D) the model makes from an all-zero patch embedding: prefix tokens
        plus position embedding. Normalised by a layer's norm, it is that layer's pseudo input."""

    @abc.abstractmethod
    def patch_projection(self) -> nn.Conv2d | None:
        """The patchify convolution whose output is the patch embedding, or None where the patch
        embedding is not that linear map (a norm after it, or another stem)."""

    def content_directions(self) -> torch.Tensor | None:
        """(D, m) vectors spanning every patch embedding the model can produce (the patch projection's
        weight columns and bias), or None where that set is not a linear subspace."""
        proj = self.patch_projection()
        return None if proj is None else patchify_directions(proj)

    @abc.abstractmethod
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """Token sequence (B, T, D) entering the first block for a batch of images."""

    @abc.abstractmethod
    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        """The patch embeddings (B, N, D) alone: no position embedding, no prefix tokens."""

    @abc.abstractmethod
    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Output of block `index` for its input x."""

    @abc.abstractmethod
    def prefix_tokens(self) -> list[nn.Parameter]:
        """The learned tokens put before the patches (class, register, distillation tokens)."""

    def redraw_embeddings(self, generator: torch.Generator) -> None:
        """Draw a learned position embedding (trunc-normal, std 0.02) and the prefix tokens (N(0, 1e-6))
        from `generator`, as timm's init does. The solve reads them, so with this the same seed gives
        the same weights however the model was constructed; a fixed table (sin-cos) is kept."""
        timm_embeddings_(self.learned_position(), self.prefix_tokens(), generator)

    @abc.abstractmethod
    def reset_timm(self, generator: torch.Generator) -> None:
        """Re-initialise every parameter as timm's own init does, drawing from `generator`."""

    @abc.abstractmethod
    def reset_kaiming(self, generator: torch.Generator) -> None:
        """Re-initialise every parameter with PyTorch's defaults, drawing from `generator`."""

    @property
    def post_norm(self) -> bool:
        """Whether the blocks normalise after their attention (timm's ResPostBlock, Eva's post-norm
        blocks): each attention then reads, unnormalised, what the blocks before it made of the tokens."""
        return any(layer.post_norm for layer in self.layers())

    def pseudo_inputs(self) -> list[torch.Tensor]:
        """Every attention layer's input (1, T, D) on the pseudo input: its norm of the pseudo tokens, or,
        in post-norm blocks, what the blocks before it make of them (what a forward pass feeds it)."""
        tokens, propagate = self.pseudo_tokens().unsqueeze(0), self.post_norm
        inputs = []
        for i, layer in enumerate(self.layers()):
            if propagate and i > 0:
                tokens = self.run_block(i - 1, tokens)
            inputs.append(layer.norm(tokens))
        return inputs

    def measured_layers(self, kernel_size: int) -> list[LayerReport]:
        """Best-offset fidelity of every head on the pseudo input (None without a position embedding)."""
        layers = self.layers()
        if self.position_embedding() is None:
            return [LayerReport(i, [HeadReport(None, None)] * layer.num_heads) for i, layer in enumerate(layers)]
        return [
            LayerReport(i, best_offsets(layer.attention(x).float(), kernel_size, self.grid, self.num_prefix_tokens))
            for i, (layer, x) in enumerate(zip(layers, self.pseudo_inputs()))
        ]


def timm_embeddings_(position: nn.Parameter | None, tokens: list[nn.Parameter], generator: torch.Generator) -> None:
    """timm's init of a position embedding (trunc-normal, std 0.02; None: none) and prefix tokens (N(0, 1e-6))."""
    if position is not None:
        nn.init.trunc_normal_(position, std=0.02, generator=generator)
    for token in tokens:
        nn.init.normal_(token, std=1e-6, generator=generator)


def is_sincos_table(position: torch.Tensor, grid: tuple[int, int]) -> bool:
    """Whether the grid rows (the last N) of a position embedding are the 2-D sin-cos table of `grid` with
    its columns in any order (timm's build_sincos2d_pos_embed, MAE's layout): their Gram matrices agree."""
    width, tokens = position.shape[-1], grid[0] * grid[1]
    rows = position.detach().reshape(-1, width)[-tokens:].double().cpu()
    if width % 4 or rows.shape[0] != tokens:
        return False
    if not torch.allclose(rows.square().sum(1), torch.full((tokens,), width / 2.0, dtype=torch.float64), atol=1e-3):
        return False  # every row of the table has norm^2 D / 2 (pairs of sin^2 + cos^2): the cheap test first
    table = build_sincos2d_pos_embed(list(grid), width).double()
    return torch.allclose(rows @ rows.T, table @ table.T, rtol=0.0, atol=1e-4 * width)


def patchify_directions(proj: nn.Conv2d) -> torch.Tensor:
    """(D, C * p * p [+ 1]) the columns of a patchify convolution's weight, and its bias: they span
    every patch embedding it can produce."""
    columns = proj.weight.detach().flatten(1)
    if proj.bias is not None:
        columns = torch.cat([columns, proj.bias.detach()[:, None]], dim=1)
    return columns


def class_token_pseudo_tokens(class_token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """(1 + N, D) pseudo tokens of a ViT whose position embedding (1, 1 + N, D) is added to the class
    token (1, 1, D) and to all-zero patch embeddings (torchvision, Hugging Face)."""
    zeros = torch.zeros_like(position[0, 1:])
    return torch.cat([class_token[0], zeros]) + position[0]
