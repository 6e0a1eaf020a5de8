"""Global attention with a relative-position bias and no absolute position: timm's
VisionTransformerRelPos (vit_relpos_*, vit_srelpos_*: a bias table or a log-coordinate MLP, per block
or shared), timm's Beit (beit_*) and Hugging Face's BeitModel (a bias table per block or shared, with
three entries for the class token). transformers is optional: its classes are recognised by name."""

from __future__ import annotations

import torch
from timm.layers.pos_embed_rel import RelPosBias, RelPosMlp
from timm.models.beit import Beit
from timm.models.vision_transformer_relpos import ResPostRelPosBlock, VisionTransformerRelPos
from torch import nn

from .base import PackedQKVLayer
from .hf_vit import HFProjections
from .relpos_base import BiasMlp, BiasTable, RelPosAdapter, RelPosLayer, maps_on_uniform_image, table_rows
from .timm_vit import TimmAttentionLayer, timm_scheme_


class RelPosViTLayer(TimmAttentionLayer, RelPosLayer):
    """timm's RelPosAttention: timm's Attention layout (fused qkv, optional q/k norms) with its own or the
    model's shared bias, in a pre-norm block or a post-norm one (ResPostRelPosBlock)."""

    def __init__(self, block: nn.Module, shared: nn.Module | None, grid: tuple[int, int], prefix: int) -> None:
        super().__init__(block.attn, block.norm1, post_norm=isinstance(block, ResPostRelPosBlock))
        self.rel_pos = rel = block.attn.rel_pos if block.attn.rel_pos is not None else shared
        self.window, self.num_prefix = grid, prefix
        if isinstance(rel, RelPosBias):
            rows = table_rows(rel.relative_position_index, rel.window_area, prefix)
            self.source = BiasTable(rel.relative_position_bias_table, rows)
        else:
            rows = rel.relative_position_index.reshape(rel.window_area, rel.window_area)
            gain = rel.bias_gain if rel.mode == "swin" else None
            coords = rel.rel_coords_log.reshape(-1, 2)
            self.source = BiasMlp(rel.mlp.fc1, rel.mlp.fc2, coords, rows, gain, rel.mlp.drop1.p)

    def relative_bias(self) -> torch.Tensor:
        return self.rel_pos.get_bias()[0]


class TimmRelPosAdapter(RelPosAdapter):
    family = "timm VisionTransformerRelPos (vit_relpos_*, vit_srelpos_*)"
    example = "vit_relpos_small_patch16_224 or vit_srelpos_small_patch16_224"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        for i, block in enumerate(model.blocks):
            rel = block.attn.rel_pos if block.attn.rel_pos is not None else model.shared_rel_pos
            if not isinstance(rel, (RelPosBias, RelPosMlp)):
                raise TypeError(f"block {i} of this VisionTransformerRelPos has no relative-position bias")
            if isinstance(rel, RelPosMlp) and not isinstance(rel.mlp.act, nn.ReLU):
                raise TypeError(
                    f"block {i}'s position MLP uses {type(rel.mlp.act).__name__}; structinit sets a ReLU MLP"
                )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, VisionTransformerRelPos)

    def layers(self) -> list[RelPosLayer]:
        model = self.model
        grid, prefix = tuple(model.patch_embed.grid_size), model.num_prefix_tokens
        return [RelPosViTLayer(block, model.shared_rel_pos, grid, prefix) for block in model.blocks]

    def maps(self) -> list[torch.Tensor]:
        if not self.model.num_prefix_tokens:
            return super().maps()
        patch = self.model.patch_embed
        image = torch.zeros(1, patch.proj.in_channels, *patch.img_size)
        return maps_on_uniform_image(self.model, self.layers(), [b.attn for b in self.model.blocks], image)


class BeitLayer(PackedQKVLayer, RelPosLayer):
    """timm's Beit attention: fused qkv weight with separate q/v biases (k has none), and its own bias
    table or the model's shared one; the class token is a prefix token with three table entries."""

    def __init__(self, block: nn.Module, shared: nn.Module | None, grid: tuple[int, int]) -> None:
        attn = block.attn
        self.attn, self.norm, self.shared = attn, block.norm1, shared
        self.num_heads, self.scale = attn.num_heads, attn.scale
        self.head_dim = attn.qkv.out_features // (3 * attn.num_heads)
        self.window, self.num_prefix = grid, 1
        owner = attn if attn.relative_position_bias_table is not None else shared
        area = grid[0] * grid[1]
        self.source = BiasTable(owner.relative_position_bias_table, table_rows(owner.relative_position_index, area, 1))

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.qkv.weight, None

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.attn.q_bias, None

    def out_weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    def relative_bias(self) -> torch.Tensor:
        if self.attn.relative_position_bias_table is not None:
            return self.attn._get_rel_pos_bias()[0]
        return self.shared()


class TimmBeitAdapter(RelPosAdapter):
    family = "timm Beit (beit_*, with a relative-position bias)"
    example = "beit_base_patch16_224"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        own = [block.attn.relative_position_bias_table is not None for block in model.blocks]
        if (model.rel_pos_bias is None and not all(own)) or (model.rel_pos_bias is not None and any(own)):
            raise TypeError(
                "structinit puts the impulse in a BEiT's relative-position bias: create it with one per block "
                "(use_rel_pos_bias=True, as beit_* do) or one shared (use_shared_rel_pos_bias=True), not both"
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, Beit)

    def layers(self) -> list[RelPosLayer]:
        grid = tuple(self.model.patch_embed.grid_size)
        return [BeitLayer(block, self.model.rel_pos_bias, grid) for block in self.model.blocks]

    def maps(self) -> list[torch.Tensor]:
        patch = self.model.patch_embed
        image = torch.zeros(1, patch.proj.in_channels, *patch.img_size)
        return maps_on_uniform_image(self.model, self.layers(), [b.attn for b in self.model.blocks], image)


_HF_BEIT = {"BeitModel", "BeitForImageClassification", "BeitForMaskedImageModeling"}


class HFBeitLayer(HFProjections, RelPosLayer):
    """transformers' BeitLayer: q/k/v/o projections (k without bias), its own or the model's shared bias."""

    def __init__(self, layer: nn.Module, shared: nn.Module | None, grid: tuple[int, int]) -> None:
        self.attn, self.norm = layer.attention, layer.layernorm_before
        self.bias = layer.relative_position_bias if layer.relative_position_bias is not None else shared
        self.num_heads, self.head_dim, self.scale = self.attn.num_attention_heads, self.attn.head_dim, self.attn.scaling
        self.window, self.num_prefix = grid, 1
        index = self.bias.generate_relative_position_index(grid).to(self.bias.relative_position_bias_table.device)
        self.source = BiasTable(self.bias.relative_position_bias_table, table_rows(index, grid[0] * grid[1], 1))

    def relative_bias(self) -> torch.Tensor:
        tokens = self.window[0] * self.window[1] + 1
        return self.bias(self.window, interpolate_pos_encoding=False, dim_size=tokens)[0]


class HFBeitAdapter(RelPosAdapter):
    family = "Hugging Face transformers BEiT (BeitModel, BeitForImageClassification; relative-position bias)"
    example = "BeitForImageClassification(BeitConfig(image_size=32, patch_size=4, use_relative_position_bias=True))"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.beit = model if type(model).__name__ == "BeitModel" else model.beit
        config = self.beit.config
        if config.use_relative_position_bias == config.use_shared_relative_position_bias:
            raise TypeError(
                "structinit puts the impulse in a BEiT's relative-position bias: create it with "
                "BeitConfig(use_relative_position_bias=True) or use_shared_relative_position_bias=True (one of them)"
            )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        kind = type(model)
        return kind.__name__ in _HF_BEIT and kind.__module__.startswith("transformers.models.beit.")

    def layers(self) -> list[RelPosLayer]:
        config = self.beit.config
        side = config.image_size // config.patch_size
        return [HFBeitLayer(layer, self.beit.shared_position_bias, (side, side)) for layer in self.beit.layers]

    def maps(self) -> list[torch.Tensor]:
        config = self.beit.config
        image = torch.zeros(1, config.num_channels, config.image_size, config.image_size)
        return maps_on_uniform_image(self.model, self.layers(), [layer.attention for layer in self.beit.layers], image)

    def reset_timm(self, generator: torch.Generator) -> None:
        embeddings = self.beit.embeddings
        tokens = [t for t in (embeddings.cls_token, getattr(embeddings, "mask_token", None)) if t is not None]
        timm_scheme_(self.model, generator, None, tokens)
        for source in self.sources():
            nn.init.trunc_normal_(source.table, std=0.02, generator=generator)
