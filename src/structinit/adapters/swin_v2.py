"""Window attention with a relative-position bias, beside timm's Swin v1 (adapters/swin.py): timm's
SwinTransformerV2 (swinv2_*) and SwinTransformerV2Cr (swinv2_cr_*), torchvision's SwinTransformer
(swin_t, swin_v2_t and their family) and Hugging Face's SwinModel. Swin v2 computes its bias with a
small MLP over log-spaced relative coordinates (16 sigmoid of it in swinv2 and torchvision, the raw
output in swinv2_cr) and its attention is cosine with a learned temperature."""

from __future__ import annotations

import math

import torch
from timm.models.swin_transformer_v2 import SwinTransformerV2
from timm.models.swin_transformer_v2_cr import SwinTransformerV2Cr
from torch import nn
from torchvision.models.swin_transformer import ShiftedWindowAttentionV2, SwinTransformerBlock
from torchvision.models.swin_transformer import SwinTransformer as TorchvisionSwin

from .base import PackedQKVLayer
from .hf_vit import HFProjections
from .relpos_base import BiasMlp, BiasTable, RelPosAdapter, RelPosLayer
from .timm_vit import timm_scheme_


class WindowLayer(PackedQKVLayer, RelPosLayer):
    """A window-attention module with a fused qkv Linear and an output projection `proj`; `log_scale_max`
    is set where the attention is cosine (the clamp of its learned log temperature)."""

    log_scale_max: float | None = None

    def __init__(self, attn: nn.Module, norm: nn.Module, window: tuple[int, int], source: BiasTable | BiasMlp) -> None:
        self.attn, self.norm, self.window, self.source = attn, norm, tuple(window), source
        self.num_heads = attn.num_heads
        self.head_dim = attn.qkv.out_features // (3 * attn.num_heads)
        self.scale = self.head_dim**-0.5

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.qkv.weight, self.attn.qkv.bias

    def out_weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.log_scale_max is None:
            return super().logits(x)
        wq, wk = self.qk_weights()
        bq, bk = self.qk_biases()
        split = (*x.shape[:2], self.num_heads, self.head_dim)
        q = nn.functional.linear(x, wq, bq).reshape(split).transpose(1, 2)
        k = nn.functional.linear(x, wk, bk).reshape(split).transpose(1, 2)
        cosine = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(k, dim=-1).transpose(-1, -2)
        temperature = self.attn.logit_scale.reshape(-1, 1, 1).clamp(max=self.log_scale_max).exp()
        return cosine * temperature + self.relative_bias()


def _mlp_bias(mlp: nn.Module, coords: torch.Tensor, rows: torch.Tensor, heads: int) -> torch.Tensor:
    """(heads, T, T) the MLP's output at each pair's coordinates (the model's MLP, called as it calls it)."""
    return mlp(coords).reshape(-1, heads)[rows].permute(2, 0, 1)


class TimmSwinV2Layer(WindowLayer):
    log_scale_max = math.log(100.0)

    def __init__(self, block: nn.Module) -> None:
        attn = block.attn
        area = attn.window_size[0] * attn.window_size[1]
        rows = attn.relative_position_index.reshape(area, area)
        mlp = BiasMlp(attn.cpb_mlp[0], attn.cpb_mlp[2], attn.relative_coords_table.reshape(-1, 2), rows, 16.0)
        super().__init__(attn, block.norm1, attn.window_size, mlp)

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.attn.q_bias, None

    def relative_bias(self) -> torch.Tensor:
        attn = self.attn
        return 16 * torch.sigmoid(_mlp_bias(attn.cpb_mlp, attn.relative_coords_table, self.source.rows, self.num_heads))


class TimmSwinV2CrLayer(WindowLayer):
    log_scale_max = math.log(100.0)

    def __init__(self, block: nn.Module) -> None:
        attn = block.attn
        area = attn.window_size[0] * attn.window_size[1]
        rows = torch.arange(area * area, device=attn.relative_coordinates_log.device).reshape(area, area)
        meta = attn.meta_mlp
        mlp = BiasMlp(meta.fc1, meta.fc2, attn.relative_coordinates_log, rows, None, meta.drop1.p)
        super().__init__(attn, nn.Identity(), attn.window_size, mlp)  # post-norm blocks

    def relative_bias(self) -> torch.Tensor:
        return self.attn._relative_positional_encodings()[0]


class TorchvisionSwinLayer(WindowLayer):
    """torchvision's ShiftedWindowAttention (v1: a bias table) or ShiftedWindowAttentionV2 (an MLP, cosine
    attention; its k bias is zeroed in the forward)."""

    def __init__(self, block: nn.Module) -> None:
        attn = block.attn
        area = attn.window_size[0] * attn.window_size[1]
        rows = attn.relative_position_index.reshape(area, area)
        if isinstance(attn, ShiftedWindowAttentionV2):
            self.log_scale_max = math.log(100.0)
            source = BiasMlp(attn.cpb_mlp[0], attn.cpb_mlp[2], attn.relative_coords_table.reshape(-1, 2), rows, 16.0)
        else:
            source = BiasTable(attn.relative_position_bias_table, rows)
        super().__init__(attn, block.norm1, attn.window_size, source)

    def qk_biases(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        q, k = super().qk_biases()
        return (q, None) if self.log_scale_max is not None else (q, k)

    def relative_bias(self) -> torch.Tensor:
        return self.attn.get_relative_position_bias()[0]


class HFSwinLayer(HFProjections, RelPosLayer):
    """transformers' SwinLayer: q/k/v/o projections and a bias table."""

    def __init__(self, block: nn.Module) -> None:
        attn, bias = block.attention, block.attention.relative_position_bias
        self.attn, self.norm, self.bias, self.window = attn, block.layernorm_before, bias, tuple(bias.window_size)
        self.num_heads, self.head_dim, self.scale = attn.num_attention_heads, attn.head_dim, attn.scaling
        rows = bias.relative_position_index.reshape(bias.window_area, bias.window_area)
        self.source = BiasTable(bias.relative_position_bias_table, rows)

    def relative_bias(self) -> torch.Tensor:
        return self.bias()[0]


class TimmSwinV2Adapter(RelPosAdapter):
    family = "timm SwinTransformerV2 (swinv2_*)"
    example = "swinv2_tiny_window8_256"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, SwinTransformerV2)

    def layers(self) -> list[RelPosLayer]:
        return [TimmSwinV2Layer(block) for stage in self.model.layers for block in stage.blocks]


class TimmSwinV2CrAdapter(RelPosAdapter):
    family = "timm SwinTransformerV2Cr (swinv2_cr_*)"
    example = "swinv2_cr_tiny_ns_224"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, SwinTransformerV2Cr)

    def layers(self) -> list[RelPosLayer]:
        return [TimmSwinV2CrLayer(block) for stage in self.model.stages for block in stage.blocks]


class TorchvisionSwinAdapter(RelPosAdapter):
    family = "torchvision SwinTransformer (swin_t, swin_v2_t, ...)"
    example = "torchvision.models.swin_t(num_classes=10) or swin_v2_t(...)"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, TorchvisionSwin)

    def layers(self) -> list[RelPosLayer]:
        return [TorchvisionSwinLayer(m) for m in self.model.modules() if isinstance(m, SwinTransformerBlock)]

    def reset_timm(self, generator: torch.Generator) -> None:
        _timm_scheme_with_tables(self, generator)


_HF_SWIN = {"SwinModel", "SwinForImageClassification", "SwinForMaskedImageModeling"}


class HFSwinAdapter(RelPosAdapter):
    family = "Hugging Face transformers Swin (SwinModel, SwinForImageClassification)"
    example = "SwinForImageClassification(SwinConfig(image_size=32, patch_size=2, window_size=4, ...))"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.swin = model if type(model).__name__ == "SwinModel" else model.swin

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        kind = type(model)
        return kind.__name__ in _HF_SWIN and kind.__module__.startswith("transformers.models.swin.")

    def layers(self) -> list[RelPosLayer]:
        return [HFSwinLayer(block) for stage in self.swin.encoder.layers for block in stage.blocks]

    def reset_timm(self, generator: torch.Generator) -> None:
        _timm_scheme_with_tables(self, generator)


def _timm_scheme_with_tables(adapter: RelPosAdapter, generator: torch.Generator) -> None:
    """timm's scheme on another library's Swin: its Linear and LayerNorm layers as timm_scheme_ sets them,
    the bias tables trunc-normal(0.02) as timm's Swin v1."""
    timm_scheme_(adapter.model, generator, None, [])
    for source in adapter.sources():
        if isinstance(source, BiasTable):
            nn.init.trunc_normal_(source.table, std=0.02, generator=generator)
