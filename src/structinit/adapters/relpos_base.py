"""What the relative-position families share: attention whose position information is a bias added to
each head's logits, read from a learned table (BEiT, Swin v1, vit_relpos "bias") or computed by a small
MLP over log-spaced relative coordinates (Swin v2, swinv2_cr, vit_relpos "mlp"). Their tokens carry no
position, so the impulse init writes that bias (inits/relpos.py); the concrete adapters are in
adapters/relpos.py (global attention) and adapters/swin_v2.py (window attention).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..offsets import Offset, offset_mass
from ..report import HeadReport, LayerReport, best_offsets
from .base import AttentionLayer
from .timm_vit import _eval, reset_with_timm, torch_defaults_


@dataclass(frozen=True)
class BiasTable:
    """A learned table (rows, heads): the bias of window query i and key j is table[rows[i, j]]; rows no
    pair of window tokens reads (BEiT's prefix entries) belong to the prefix tokens."""

    table: nn.Parameter
    rows: torch.Tensor  # (T, T) long

    @property
    def key(self) -> int:
        """Layers whose sources have the same key share one bias."""
        return id(self.table)


@dataclass(frozen=True)
class BiasMlp:
    """fc2(ReLU(fc1(coords))) over relative coordinates (R, 2): the bias of window query i and key j is
    gain * sigmoid(out[rows[i, j]]) (Swin v2's 16 sigmoid), or out[rows[i, j]] where gain is None; `dropout`
    is the probability of the dropout between the two layers in training (timm's vit_relpos and swinv2_cr)."""

    fc1: nn.Linear
    fc2: nn.Linear
    coords: torch.Tensor
    rows: torch.Tensor  # (T, T) long
    gain: float | None
    dropout: float = 0.0

    @property
    def key(self) -> int:
        return id(self.fc2)


def table_rows(index: torch.Tensor, area: int, prefix: int = 0) -> torch.Tensor:
    """The (T, T) rows of the window tokens from a model's relative_position_index over (P + T)^2 pairs."""
    side = area + prefix
    return index.reshape(side, side)[prefix:, prefix:]


class RelPosLayer(AttentionLayer):
    """One attention layer of a relative-position family: its window (the global grid where attention is
    global), the prefix tokens before it, where its bias comes from, and the bias as the model adds it."""

    window: tuple[int, int]
    num_prefix: int = 0
    source: BiasTable | BiasMlp

    @abc.abstractmethod
    def relative_bias(self) -> torch.Tensor:
        """(heads, P + T, P + T): the bias the model adds to the logits, computed by the model's own code."""

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return super().logits(x) + self.relative_bias()


class RelPosAdapter(abc.ABC):
    """How structinit reads and writes one relative-position family."""

    family: ClassVar[str]
    example: ClassVar[str]

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    @classmethod
    @abc.abstractmethod
    def matches(cls, model: nn.Module) -> bool:
        """Whether this adapter handles `model`."""

    @abc.abstractmethod
    def layers(self) -> list[RelPosLayer]:
        """The attention layers, in forward order (layers that share one bias share its `source`)."""

    @property
    def grid(self) -> tuple[int, int]:
        """The smallest window (rows, cols): what a kernel must fit in."""
        return min((layer.window for layer in self.layers()), key=lambda w: w[0] * w[1])

    def maps(self) -> list[torch.Tensor]:
        """Each layer's maps (B, heads, P + T, P + T) on a uniform image. Without prefix tokens every token
        of a uniform image is the same vector at every layer, so the content logits are constant along each
        row and the maps are softmax(bias) exactly; families with a class token override this. In eval
        mode, as a forward pass of the model (a bias MLP may have dropout)."""
        with _eval(self.model), torch.no_grad():
            return [torch.softmax(layer.relative_bias().float(), dim=-1)[None] for layer in self.layers()]

    def measured_layers(self, kernel_size: int, offsets: list[list[Offset]] | None = None) -> list[LayerReport]:
        """Per layer and head, the mass of its maps on a uniform image at its offset (the given one per
        head, or the best of the f x f kernel), over the window queries whose key at that offset exists."""
        reports = []
        for i, (layer, attn) in enumerate(zip(self.layers(), self.maps())):
            if offsets is None:
                heads = best_offsets(attn, kernel_size, layer.window, layer.num_prefix)
            else:
                mass = offset_mass(attn, offsets[i], layer.window, layer.num_prefix)
                heads = [HeadReport(o, float(m)) for o, m in zip(offsets[i], mass)]
            reports.append(LayerReport(i, heads))
        return reports

    def reset_timm(self, generator: torch.Generator) -> None:
        reset_with_timm(self.model, generator)

    def reset_kaiming(self, generator: torch.Generator) -> None:
        """PyTorch's defaults (a bias MLP's Linear layers included); a bias table has none: timm's
        trunc-normal(0.02)."""
        torch_defaults_(self.model, generator, None, [])
        for source in self.sources():
            if isinstance(source, BiasTable):
                nn.init.trunc_normal_(source.table, std=0.02, generator=generator)

    def sources(self) -> list[BiasTable | BiasMlp]:
        """The distinct bias sources, in the order of their first layer."""
        return list({layer.source.key: layer.source for layer in self.layers()}.values())


def maps_on_uniform_image(
    model: nn.Module, layers: list[RelPosLayer], modules: list[nn.Module], image: torch.Tensor
) -> list[torch.Tensor]:
    """Each layer's maps on what its attention module (`modules`, one per layer) reads when the model
    runs on `image` (eval mode): the content logits of those inputs plus the bias."""
    seen: dict[int, torch.Tensor] = {}
    hooks = [
        m.register_forward_pre_hook(lambda _, args, i=i: seen.setdefault(i, args[0])) for i, m in enumerate(modules)
    ]
    try:
        with _eval(model), torch.no_grad():
            model(image)
            return [layer.attention(seen[i]).float() for i, layer in enumerate(layers)]
    finally:
        for hook in hooks:
            hook.remove()
