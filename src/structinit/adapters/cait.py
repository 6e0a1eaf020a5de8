"""timm's CaiT (cait_*): self-attention blocks over the patch tokens (with a learned position
embedding, no class token), then class-attention blocks in which only the class token attends.

The patch blocks take the plain ViT's solve: their attention is a softmax over patch tokens once its
talking heads (proj_l mixing the heads' logits, proj_w their maps) are the identity, which the
impulse init sets (inits/cait.py). The class-attention blocks are left as they are.
"""

from __future__ import annotations

import torch
from timm.layers import Attention, trunc_normal_
from timm.models.cait import Cait, TalkingHeadAttn
from torch import nn

from .base import ModelAdapter, PackedQKVLayer
from .timm_vit import _eval, check_blocks, reset_with_timm, torch_defaults_


class CaitAttentionLayer(PackedQKVLayer):
    """A patch block's attention: fused qkv, and talking heads where it has them."""

    def __init__(self, block: nn.Module) -> None:
        self.attn, self.norm = block.attn, block.norm1
        self.num_heads, self.scale = self.attn.num_heads, self.attn.scale
        self.head_dim = self.attn.qkv.out_features // (3 * self.num_heads)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.qkv.weight, self.attn.qkv.bias

    def out_weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    def talking_heads(self) -> tuple[nn.Linear, nn.Linear] | None:
        """proj_l (on the logits, across heads) and proj_w (on the maps), or None for plain attention."""
        return (self.attn.proj_l, self.attn.proj_w) if isinstance(self.attn, TalkingHeadAttn) else None

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Each head's map; after talking heads that mix the maps (proj_w), signed weights, as the share of
        their magnitude each key takes (as the Mixer's): a share is never below zero."""
        heads = self.talking_heads()
        if heads is None:
            return super().attention(x)
        proj_l, proj_w = heads  # Linear layers across the heads: (B, T, T, heads)
        logits = proj_l(self.logits(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        mixed = proj_w(torch.softmax(logits, dim=-1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2).abs()
        return mixed / mixed.sum(-1, keepdim=True).clamp_min(1e-30)  # the identity's maps: the softmax itself


class CaitAdapter(ModelAdapter):
    family = "timm CaiT (cait_*; its patch self-attention blocks)"
    example = "cait_xxs24_224"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        check_blocks(model.blocks, (TalkingHeadAttn, Attention), "Cait", "TalkingHeadAttn or timm's `Attention`")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, Cait)

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.model.patch_embed.grid_size)

    @property
    def num_prefix_tokens(self) -> int:
        return 0  # the class token joins in the class-attention blocks only

    def layers(self) -> list[CaitAttentionLayer]:
        return [CaitAttentionLayer(block) for block in self.model.blocks]

    def position_embedding(self) -> nn.Parameter:
        return self.model.pos_embed

    def pseudo_tokens(self) -> torch.Tensor:
        return self.model.pos_embed[0]

    def patch_projection(self) -> nn.Conv2d | None:
        patch = self.model.patch_embed
        return patch.proj if isinstance(patch.norm, nn.Identity) else None

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        return self.patch_tokens(images) + self.model.pos_embed

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.model.patch_embed(images)

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.model.blocks[index](x)

    def prefix_tokens(self) -> list[nn.Parameter]:
        return []

    def reset_timm(self, generator: torch.Generator) -> None:
        model = self.model

        def init() -> None:  # what Cait's constructor does
            trunc_normal_(model.pos_embed, std=0.02)
            trunc_normal_(model.cls_token, std=0.02)
            model.apply(model._init_weights)

        reset_with_timm(model, generator, init)

    def reset_kaiming(self, generator: torch.Generator) -> None:
        torch_defaults_(self.model, generator, self.learned_position(), [])
