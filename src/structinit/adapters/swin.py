"""timm's SwinTransformer (swin_*, v1): attention inside local windows, plus a learnable
relative-position bias per head, and no absolute position embedding.

The tokens carry no position, so the pseudo-input solve of the plain ViT has nothing to work with
(every token of an all-zero image is the same vector, and any Q/K gives a uniform window map);
the relative-position bias is where position enters, and where the impulse init goes (inits/swin.py).
"""

from __future__ import annotations

import torch
from timm.models.swin_transformer import SwinTransformer, WindowAttention
from torch import nn

from ..offsets import Offset, offset_mass
from ..report import HeadReport, LayerReport, best_offsets
from .base import PackedQKVLayer
from .timm_vit import reset_with_timm, torch_defaults_


class SwinWindowLayer(PackedQKVLayer):
    """One (shifted) window-attention layer: fused qkv, output projection, relative-position bias."""

    def __init__(self, block: nn.Module) -> None:
        attn = block.attn
        self.attn, self.norm = attn, block.norm1
        self.num_heads, self.scale = attn.num_heads, attn.scale
        self.head_dim = attn.qkv.weight.shape[0] // (3 * attn.num_heads)
        self.window: tuple[int, int] = tuple(block.window_size)
        self.shifted = any(block.shift_size)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.qkv.weight, self.attn.qkv.bias

    def out_weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    @property
    def bias_table(self) -> nn.Parameter:
        """((2 Wh - 1) (2 Ww - 1), heads): the bias added to the logit of key p + delta for query p."""
        return self.attn.relative_position_bias_table

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of windows x (B, T, D), T = Wh * Ww, with the relative-position bias and without the
        shifted windows' mask."""
        return super().logits(x) + self.attn._get_rel_pos_bias()


class SwinAdapter:
    family = "timm SwinTransformer v1 (swin_*)"
    example = "swin_d6_p2_w4 (preset) or swin_tiny_patch4_window7_224"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        for name, module in model.named_modules():
            if type(module).__name__ == "SwinTransformerBlock" and not isinstance(module.attn, WindowAttention):
                raise TypeError(f"{name} uses {type(module.attn).__name__}; structinit supports timm's WindowAttention")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, SwinTransformer)

    @property
    def grid(self) -> tuple[int, int]:
        """The smallest attention window (rows, cols): what a kernel must fit in."""
        windows = [layer.window for layer in self.layers()]
        return min(windows, key=lambda w: w[0] * w[1])

    def blocks(self) -> list[nn.Module]:
        return [block for stage in self.model.layers for block in stage.blocks]

    def layers(self) -> list[SwinWindowLayer]:
        return [SwinWindowLayer(block) for block in self.blocks()]

    def window_pseudo_input(self, layer: SwinWindowLayer) -> torch.Tensor:
        """(1, T, D) window of identical tokens, T = Wh * Ww. Without position in the tokens, this is what
        every window of a uniform image looks like: Q/K logits are constant along each row, so the map
        is softmax(relative-position bias) exactly."""
        param = layer.attn.qkv.weight
        width = param.shape[1]
        token = torch.linspace(-1.0, 1.0, width, device=param.device, dtype=param.dtype)
        return layer.norm(token.expand(1, layer.window[0] * layer.window[1], width))

    def reset_timm(self, generator: torch.Generator) -> None:
        reset_with_timm(self.model, generator)

    def reset_kaiming(self, generator: torch.Generator) -> None:
        torch_defaults_(self.model, generator, None, [])
        for layer in self.layers():  # a bare Parameter has no PyTorch default: timm's trunc-normal(0.02)
            nn.init.trunc_normal_(layer.bias_table, std=0.02, generator=generator)

    def measured_layers(self, kernel_size: int, offsets: list[list[Offset]] | None = None) -> list[LayerReport]:
        """Per layer and head, the mass of its window map (on the window pseudo input) at its offset:
        the given one per head, or the best of the f x f kernel."""
        reports = []
        for i, layer in enumerate(self.layers()):
            attn = layer.attention(self.window_pseudo_input(layer)).float()
            if offsets is None:
                heads = best_offsets(attn, kernel_size, layer.window, 0)
            else:
                heads = [
                    HeadReport(o, float(m)) for o, m in zip(offsets[i], offset_mass(attn, offsets[i], layer.window, 0))
                ]
            reports.append(LayerReport(i, heads))
        return reports
