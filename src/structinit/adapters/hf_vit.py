"""Hugging Face transformers' ViT, DeiT and Dinov2 (ViTModel, DeiTForImageClassification, Dinov2Model, ...;
transformers >= 5 layout: `attention.{q,k,v,o}_proj`). DeiT has a distillation token beside the class
token; Dinov2 its own position interpolation (the pseudo tokens take its position embedding as its
forward interpolates it) and LayerScale, which Q/K do not see. transformers is an optional dependency:
the adapter recognises the classes by name and never imports it."""

from __future__ import annotations

import torch
from torch import nn

from .base import AttentionLayer, ModelAdapter
from .timm_vit import _eval, timm_scheme_, torch_defaults_

# the families (modules transformers.models.<family>), each the name of its task models' backbone attribute
_FAMILIES = ("vit", "deit", "dinov2")
_TASKS = ("Model", "ForImageClassification", "ForImageClassificationWithTeacher", "ForMaskedImageModeling")


class HFProjections:
    """The weights of a Hugging Face attention (transformers >= 5: q/k/v/o_proj Linears, no q/k norms) as
    the layer interface reads them; `attn` is the attention module."""

    attn: nn.Module

    def qk_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn.q_proj.weight, self.attn.k_proj.weight

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.attn.q_proj.bias, self.attn.k_proj.bias

    def qk_norms(self) -> None:
        return None

    def value_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.attn.v_proj.weight, self.attn.o_proj.weight


class HFAttentionLayer(HFProjections, AttentionLayer):
    def __init__(self, layer: nn.Module) -> None:
        self.attn = layer.attention
        self.norm = layer.norm1 if hasattr(layer, "norm1") else layer.layernorm_before  # Dinov2's, ViT's and DeiT's
        self.num_heads, self.head_dim = self.attn.num_attention_heads, self.attn.head_dim
        self.scale = self.attn.scaling


class HFViTAdapter(ModelAdapter):
    family = (
        "Hugging Face transformers ViT, DeiT, Dinov2 (ViTModel, DeiTForImageClassification, ...; transformers >= 5)"
    )
    example = "ViTForImageClassification(ViTConfig(image_size=32, patch_size=4, ...))"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        name = type(model).__name__
        self.vit = model if name.endswith("Model") else getattr(model, _family(model))
        # ViT's and DeiT's layers, Dinov2's encoder.layer
        self.blocks = getattr(self.vit, "layers", None) or getattr(getattr(self.vit, "encoder", None), "layer", None)
        if self.blocks is None or not all(hasattr(layer.attention, "q_proj") for layer in self.blocks):
            raise TypeError(
                "this transformers ViT has the layout of transformers < 5 (encoder.layer[i].attention.attention."
                "query); structinit supports the transformers >= 5 layout (layers[i].attention.q_proj)"
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        family, name = _family(model), type(model).__name__
        return family in _FAMILIES and any(name.lower() == f"{family}{task}".lower() for task in _TASKS)

    @property
    def grid(self) -> tuple[int, int]:
        size = self.vit.config.image_size
        patch = self.vit.config.patch_size
        rows, cols = (size, size) if isinstance(size, int) else size
        return rows // patch, cols // patch

    @property
    def num_prefix_tokens(self) -> int:
        return 1 + (getattr(self.vit.embeddings, "distillation_token", None) is not None)

    def layers(self) -> list[AttentionLayer]:
        return [HFAttentionLayer(layer) for layer in self.blocks]

    def position_embedding(self) -> nn.Parameter:
        return self.vit.embeddings.position_embeddings

    def pseudo_tokens(self) -> torch.Tensor:
        """Class (and distillation) token and all-zero patch embeddings, plus the position embedding as the
        forward adds it at the configured image size (Dinov2 interpolates it there when it must)."""
        embeddings, (rows, cols) = self.vit.embeddings, self.grid
        prefix = [
            t[0] for t in (embeddings.cls_token, getattr(embeddings, "distillation_token", None)) if t is not None
        ]
        tokens = torch.cat([*prefix, prefix[0].new_zeros(rows * cols, prefix[0].shape[-1])])[None]
        patch = self.vit.config.patch_size
        return (tokens + embeddings.interpolate_pos_encoding(tokens, rows * patch, cols * patch))[0]

    def patch_projection(self) -> nn.Conv2d:
        return self.vit.embeddings.patch_embeddings.projection

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.vit.embeddings(images)

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        return self.vit.embeddings.patch_embeddings(images)

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.blocks[index](x)

    def prefix_tokens(self) -> list[nn.Parameter]:
        embeddings = self.vit.embeddings
        names = ("cls_token", "distillation_token", "mask_token")
        return [t for t in (getattr(embeddings, name, None) for name in names) if t is not None]

    def reset_timm(self, generator: torch.Generator) -> None:
        timm_scheme_(self.model, generator, self.learned_position(), self.prefix_tokens())

    def reset_kaiming(self, generator: torch.Generator) -> None:
        torch_defaults_(self.model, generator, self.learned_position(), self.prefix_tokens())


def _family(model: nn.Module) -> str:
    """The transformers family a model class comes from (transformers.models.<family>.modeling_...)."""
    parts = type(model).__module__.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["transformers", "models"] else ""
