"""timm's Eva (EVA-01 / EVA-02 style ViTs: eva_*, and eva02_* built with an absolute position
embedding only). The same token sequence as VisionTransformer; the attention has its own layout
(fused qkv with separate q/v biases, or separate q/k/v projections) and blocks may be post-norm.

Eva models with rotary position embeddings (RoPE) are adapters/rope.py's.
"""

from __future__ import annotations

import torch
from timm.models.eva import Eva, EvaAttention, EvaBlockPostNorm
from torch import nn

from .base import AttentionLayer
from .timm_vit import TimmViTAdapter, _eval, check_blocks


class EvaAttentionLayer(AttentionLayer):
    def __init__(self, block: nn.Module) -> None:
        attn = block.attn
        self.attn = attn
        self.post_norm = isinstance(block, EvaBlockPostNorm)
        self.norm = nn.Identity() if self.post_norm else block.norm1
        self.num_heads, self.scale = attn.num_heads, attn.scale
        # timm < 1.0.17 keeps no head_dim on EvaAttention; the projection's width says it
        width = attn.qkv.out_features // 3 if attn.qkv is not None else attn.q_proj.out_features
        self.head_dim = width // attn.num_heads

    def _split(self, tensor: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = self.num_heads * self.head_dim
        return tensor[:width], tensor[width : 2 * width], tensor[2 * width :]

    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attn.qkv is not None:
            q, k, _ = self._split(self.attn.qkv.weight)
            return q, k
        return self.attn.q_proj.weight, self.attn.k_proj.weight

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        attn = self.attn
        if attn.qkv is not None:
            if attn.q_bias is not None:
                return attn.q_bias, None  # k_bias is a fixed zero buffer
            return self._split(attn.qkv.bias)[:2] if attn.qkv.bias is not None else (None, None)
        return attn.q_proj.bias, attn.k_proj.bias

    def qk_norms(self) -> tuple[nn.Module, nn.Module] | None:
        if isinstance(self.attn.q_norm, nn.Identity) and isinstance(self.attn.k_norm, nn.Identity):
            return None
        return self.attn.q_norm, self.attn.k_norm

    def value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attn.qkv is not None:
            return self._split(self.attn.qkv.weight)[2], self.attn.proj.weight
        return self.attn.v_proj.weight, self.attn.proj.weight


class TimmEvaAdapter(TimmViTAdapter):
    family = "timm Eva (eva_*, eva02_* without RoPE)"
    example = "eva02_tiny_patch14_224 with use_rot_pos_emb=False"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        check_blocks(model.blocks, EvaAttention, "Eva", "Eva's `EvaAttention`")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, Eva) and model.rope is None

    def layers(self) -> list[AttentionLayer]:
        return [EvaAttentionLayer(block) for block in self.model.blocks]

    def _add_position(self, patches: torch.Tensor) -> torch.Tensor:
        return self.model._pos_embed(patches)[0]  # (tokens, rotary embedding): no rotary embedding here

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.model.blocks[index](x, rope=None)

    def reset_kaiming(self, generator: torch.Generator) -> None:
        super().reset_kaiming(generator)
        for block in self.model.blocks:
            for name in ("q_bias", "v_bias"):  # separate biases: no PyTorch default; zero
                if (bias := getattr(block.attn, name, None)) is not None:
                    nn.init.zeros_(bias)
