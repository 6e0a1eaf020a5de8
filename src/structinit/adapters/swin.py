"""timm's SwinTransformer (swin_*, v1): attention inside local windows, plus a learnable
relative-position bias per head, and no absolute position embedding.

The tokens carry no position, so the pseudo-input solve of the plain ViT has nothing to work with
(every token of an all-zero image is the same vector, and any Q/K gives a uniform window map);
the relative-position bias is where position enters, and where the impulse init goes (inits/relpos.py,
as for the other relative-position families: adapters/relpos_base.py).
"""

from __future__ import annotations

import torch
from timm.models.swin_transformer import SwinTransformer, WindowAttention
from torch import nn

from .base import PackedQKVLayer
from .relpos_base import BiasTable, RelPosAdapter, RelPosLayer


class SwinWindowLayer(PackedQKVLayer, RelPosLayer):
    """One (shifted) window-attention layer: fused qkv, output projection, relative-position bias table.
    Its logits are those of windows x (B, T, D), T = Wh * Ww, without the shifted windows' mask."""

    def __init__(self, block: nn.Module) -> None:
        attn = block.attn
        self.attn, self.norm = attn, block.norm1
        self.num_heads, self.scale = attn.num_heads, attn.scale
        self.head_dim = attn.qkv.weight.shape[0] // (3 * attn.num_heads)
        self.window: tuple[int, int] = tuple(block.window_size)
        self.shifted = any(block.shift_size)
        area = self.window[0] * self.window[1]
        self.source = BiasTable(attn.relative_position_bias_table, attn.relative_position_index.reshape(area, area))

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.qkv.weight, self.attn.qkv.bias

    def out_weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    def relative_bias(self) -> torch.Tensor:
        return self.attn._get_rel_pos_bias()[0]


class SwinAdapter(RelPosAdapter):
    family = "timm SwinTransformer v1 (swin_*)"
    example = "swin_d6_p2_w4 (preset) or swin_tiny_patch4_window7_224"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        for name, module in model.named_modules():
            if type(module).__name__ == "SwinTransformerBlock" and not isinstance(module.attn, WindowAttention):
                raise TypeError(f"{name} uses {type(module.attn).__name__}; structinit supports timm's WindowAttention")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, SwinTransformer)

    def blocks(self) -> list[nn.Module]:
        return [block for stage in self.model.layers for block in stage.blocks]

    def layers(self) -> list[SwinWindowLayer]:
        return [SwinWindowLayer(block) for block in self.blocks()]
