"""torchvision's VisionTransformer (vit_b_16, vit_l_32, ... and any model built from that class):
a class token, a learned position embedding added to every token, pre-norm encoder blocks whose
attention is torch's nn.MultiheadAttention (packed in_proj weight: rows q, k, v)."""

from __future__ import annotations

import torch
from torch import nn
from torchvision.models.vision_transformer import VisionTransformer

from .base import AttentionLayer, ModelAdapter, PackedQKVLayer, class_token_pseudo_tokens
from .timm_vit import _eval, timm_scheme_, torch_defaults_


class MultiheadAttentionLayer(PackedQKVLayer):
    def __init__(self, block: nn.Module) -> None:
        attn = block.self_attention
        self.attn, self.norm = attn, block.ln_1
        self.num_heads, self.head_dim = attn.num_heads, attn.head_dim
        self.scale = self.head_dim**-0.5

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.in_proj_weight, self.attn.in_proj_bias

    def out_weight(self) -> torch.Tensor:
        return self.attn.out_proj.weight


class TorchvisionViTAdapter(ModelAdapter):
    family = "torchvision VisionTransformer (vit_b_16, ...)"
    example = "torchvision.models.vit_b_16(image_size=32, ...) or any VisionTransformer(...)"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        if not isinstance(model.conv_proj, nn.Conv2d):
            raise TypeError("structinit supports torchvision ViTs with a patchify convolution, not a conv stem")

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, VisionTransformer)

    @property
    def grid(self) -> tuple[int, int]:
        side = self.model.image_size // self.model.patch_size
        return side, side

    @property
    def num_prefix_tokens(self) -> int:
        return 1

    def layers(self) -> list[AttentionLayer]:
        return [MultiheadAttentionLayer(block) for block in self.model.encoder.layers]

    def position_embedding(self) -> nn.Parameter:
        return self.model.encoder.pos_embedding

    def pseudo_tokens(self) -> torch.Tensor:
        return class_token_pseudo_tokens(self.model.class_token, self.model.encoder.pos_embedding)

    def patch_projection(self) -> nn.Conv2d:
        return self.model.conv_proj

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        model = self.model
        patches = model._process_input(images)
        tokens = torch.cat([model.class_token.expand(len(images), -1, -1), patches], dim=1)
        return tokens + model.encoder.pos_embedding

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.model._process_input(images)

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.model.encoder.layers[index](x)

    def reset_timm(self, generator: torch.Generator) -> None:
        timm_scheme_(self.model, generator, self.learned_position(), self.prefix_tokens())

    def reset_kaiming(self, generator: torch.Generator) -> None:
        torch_defaults_(self.model, generator, self.learned_position(), self.prefix_tokens())

    def prefix_tokens(self) -> list[nn.Parameter]:
        return [self.model.class_token]
