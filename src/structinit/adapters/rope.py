"""timm's Eva with rotary position embeddings (RoPE): eva02_*, the vit_*_rope_* models (axial or mixed,
learned frequencies, with or without an absolute embedding, grouped-query attention), DINOv3's and the
Perception Encoder's ViTs.

RoPE rotates each head's q and k of grid token p by angles linear in p's coordinates, so the logit of
query p and key q depends on p - q through the rotation: position lives in the rotation, not in the
tokens, and the impulse init goes there (inits/rope.py). The maps are measured with the rotations the
model applies (its own rope embedding, the same rotation function).
"""

from __future__ import annotations

import torch
from timm.layers import AttentionRope, apply_rot_embed_cat
from timm.models.eva import Eva, EvaAttention, EvaBlockPostNorm
from torch import nn

from ..offsets import Offset, offset_mass
from ..report import HeadReport, LayerReport, best_offsets
from .base import AttentionLayer
from .timm_eva import TimmEvaAdapter
from .timm_vit import _eval, check_blocks


class RopeAttentionLayer(AttentionLayer):
    """EvaAttention or AttentionRope with its block's rope embedding: fused qkv or separate q/k/v,
    k/v heads shared by groups of query heads (grouped-query attention), prefix tokens not rotated."""

    def __init__(self, block: nn.Module, rope: torch.Tensor) -> None:
        attn = block.attn
        self.post_norm = isinstance(block, EvaBlockPostNorm)
        self.attn, self.rope = attn, rope
        self.norm = nn.Identity() if self.post_norm else block.norm1
        self.num_heads, self.scale = attn.num_heads, attn.scale
        width = attn.qkv.out_features // 3 if attn.qkv is not None else attn.q_proj.out_features
        self.head_dim = width // attn.num_heads
        self.kv_heads = getattr(attn, "num_kv_heads", attn.num_heads)
        self.num_prefix, self.half = attn.num_prefix_tokens, attn.rotate_half

    def _widths(self) -> list[int]:
        return [self.num_heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]

    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.attn.qkv is not None:
            q, k, _ = self.attn.qkv.weight.split(self._widths())
            return q, k
        return self.attn.q_proj.weight, self.attn.k_proj.weight

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        attn = self.attn
        if isinstance(attn, EvaAttention) and attn.qkv is not None:
            return attn.q_bias, None  # k_bias is a fixed zero buffer
        if attn.qkv is not None:
            return tuple(attn.qkv.bias.split(self._widths())[:2]) if attn.qkv.bias is not None else (None, None)
        return attn.q_proj.bias, attn.k_proj.bias

    def qk_norms(self) -> None:
        return None  # q/k norms are refused (inits/rope.py)

    def value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        wv = self.attn.qkv.weight.split(self._widths())[2] if self.attn.qkv is not None else self.attn.v_proj.weight
        return wv, self.attn.proj.weight

    def turn(self, grid_tokens: torch.Tensor) -> torch.Tensor:
        """(B, heads, N, d) q or k of the grid tokens, rotated as the model rotates them."""
        return apply_rot_embed_cat(grid_tokens, self.rope.to(grid_tokens), half=self.half)

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """(B, heads, T, d) q or k with the grid tokens rotated, the prefix tokens as they are."""
        n = self.num_prefix
        return torch.cat([x[:, :, :n], self.turn(x[:, :, n:])], dim=2)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        (wq, wk), (bq, bk) = self.qk_weights(), self.qk_biases()
        q = nn.functional.linear(x, wq, bq).reshape(batch, tokens, self.num_heads, -1).transpose(1, 2)
        k = nn.functional.linear(x, wk, bk).reshape(batch, tokens, self.kv_heads, -1).transpose(1, 2)
        k = self.rotate(k).repeat_interleave(self.num_heads // self.kv_heads, dim=1)
        return (self.rotate(q) * self.scale) @ k.transpose(-1, -2)


class RopeEvaAdapter(TimmEvaAdapter):
    family = "timm Eva with rotary position embeddings (eva02_*, vit_*_rope_*: axial, mixed, +APE, GQA)"
    example = "vit_small_patch16_rope_224"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        check_blocks(model.blocks, (EvaAttention, AttentionRope), "Eva", "EvaAttention or AttentionRope")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, Eva) and model.rope is not None

    def redraw_embeddings(self, generator: torch.Generator) -> None:
        """A learned position embedding and the prefix tokens trunc-normal(0.02), as Eva's own init draws
        them: tokens of N(0, 1e-6) (timm's ViT) would be, once normalised, nearly the constant of the
        rotary init (inits/rope.py), which tells a prefix key from a grid key by its direction."""
        for param in (self.learned_position(), *self.prefix_tokens()):
            if param is not None:
                nn.init.trunc_normal_(param, std=0.02, generator=generator)

    def rope_embeddings(self) -> list[torch.Tensor]:
        """Each block's rope embedding (N, 2 d), or (heads, N, 2 d) with mixed RoPE, as the forward makes it."""
        model, (gh, gw) = self.model, self.grid
        param = next(model.parameters())
        zeros = torch.zeros(1, gh, gw, model.embed_dim, device=param.device, dtype=param.dtype)
        with _eval(model):
            rope = model._pos_embed(zeros if model.dynamic_img_size else zeros.flatten(1, 2))[1]
        return list(rope) if model.rope_mixed else [rope] * len(model.blocks)

    def layers(self) -> list[RopeAttentionLayer]:
        return [RopeAttentionLayer(b, rope) for b, rope in zip(self.model.blocks, self.rope_embeddings())]

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.model.blocks[index](x, rope=self.rope_embeddings()[index])

    def measured_layers(self, kernel_size: int, offsets: list[list[Offset]] | None = None) -> list[LayerReport]:
        """Per layer and head, the mass of its map on the pseudo input (rotated: with or without an
        absolute embedding, RoPE gives the maps position) at its offset: the given one, or the best."""
        reports = []
        for i, (layer, x) in enumerate(zip(self.layers(), self.pseudo_inputs())):
            attn, prefix = layer.attention(x).float(), self.num_prefix_tokens
            if offsets is None:
                heads = best_offsets(attn, kernel_size, self.grid, prefix)
            else:
                mass = offset_mass(attn, offsets[i], self.grid, prefix)
                heads = [HeadReport(o, float(m)) for o, m in zip(offsets[i], mass)]
            reports.append(LayerReport(i, heads))
        return reports
