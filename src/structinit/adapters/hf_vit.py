"""Hugging Face transformers' ViT (ViTModel, ViTForImageClassification; transformers >= 5 layout:
`layers[i].attention.{q,k,v,o}_proj`). transformers is an optional dependency: the adapter
recognises the classes by name and never imports it."""

from __future__ import annotations

import torch
from torch import nn

from .base import AttentionLayer, ModelAdapter, class_token_pseudo_tokens
from .timm_vit import _eval, timm_scheme_, torch_defaults_

_CLASSES = {"ViTModel", "ViTForImageClassification", "ViTForMaskedImageModeling"}


class HFAttentionLayer(AttentionLayer):
    def __init__(self, layer: nn.Module) -> None:
        self.attn, self.norm = layer.attention, layer.layernorm_before
        self.num_heads, self.head_dim = self.attn.num_attention_heads, self.attn.head_dim
        self.scale = self.attn.scaling

    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn.q_proj.weight, self.attn.k_proj.weight

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.attn.q_proj.bias, self.attn.k_proj.bias

    def qk_norms(self) -> None:
        return None

    def value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn.v_proj.weight, self.attn.o_proj.weight


class HFViTAdapter(ModelAdapter):
    family = "Hugging Face transformers ViT (ViTModel, ViTForImageClassification; transformers >= 5)"
    example = "ViTForImageClassification(ViTConfig(image_size=32, patch_size=4, ...))"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.vit = model if type(model).__name__ == "ViTModel" else model.vit
        layers = getattr(self.vit, "layers", None)
        if layers is None or not all(hasattr(layer.attention, "q_proj") for layer in layers):
            raise TypeError(
                "this transformers ViT has the layout of transformers < 5 (encoder.layer[i].attention.attention."
                "query); structinit supports the transformers >= 5 layout (layers[i].attention.q_proj)"
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        kind = type(model)
        return kind.__name__ in _CLASSES and kind.__module__.startswith("transformers.models.vit.")

    @property
    def grid(self) -> tuple[int, int]:
        size = self.vit.config.image_size
        patch = self.vit.config.patch_size
        rows, cols = (size, size) if isinstance(size, int) else size
        return rows // patch, cols // patch

    @property
    def num_prefix_tokens(self) -> int:
        return 1

    def layers(self) -> list[AttentionLayer]:
        return [HFAttentionLayer(layer) for layer in self.vit.layers]

    def position_embedding(self) -> nn.Parameter:
        return self.vit.embeddings.position_embeddings

    def pseudo_tokens(self) -> torch.Tensor:
        embeddings = self.vit.embeddings
        return class_token_pseudo_tokens(embeddings.cls_token, embeddings.position_embeddings)

    def patch_projection(self) -> nn.Conv2d:
        return self.vit.embeddings.patch_embeddings.projection

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.vit.embeddings(images)

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit.embeddings.patch_embeddings(images)

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.vit.layers[index](x)

    def prefix_tokens(self) -> list[nn.Parameter]:
        embeddings = self.vit.embeddings
        return [t for t in (embeddings.cls_token, getattr(embeddings, "mask_token", None)) if t is not None]

    def reset_timm(self, generator: torch.Generator) -> None:
        timm_scheme_(self.model, generator, self.learned_position(), self.prefix_tokens())

    def reset_kaiming(self, generator: torch.Generator) -> None:
        torch_defaults_(self.model, generator, self.learned_position(), self.prefix_tokens())
