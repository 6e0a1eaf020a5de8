"""timm's MlpMixer (mixer_*): spatial mixing by a token-mixing MLP per block, the same for every
channel. No attention; its "map" is the MLP's response to a unit impulse on one token."""

from __future__ import annotations

import torch
from timm.layers import Mlp
from timm.models.mlp_mixer import MixerBlock, MlpMixer
from torch import nn

from ..offsets import Offset, offset_mass
from ..report import HeadReport, LayerReport, best_offsets
from .timm_vit import _eval, reset_with_timm, torch_defaults_


class MixerAdapter:
    family = "timm MlpMixer (mixer_*)"
    example = "mixer_d6_p4 (preset) or mixer_s16_224"

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        for i, block in enumerate(model.blocks):
            if not isinstance(block, MixerBlock) or type(block.mlp_tokens) is not Mlp:
                raise TypeError(
                    f"block {i} is a {type(block).__name__}: structinit supports MlpMixer models built from "
                    "MixerBlock with timm's Mlp token mixing (mixer_*), not ResMLP or gMLP"
                )

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, MlpMixer)

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.model.stem.grid_size)

    def token_mlps(self) -> list[Mlp]:
        """Each block's token-mixing MLP: fc1 (hidden, N), activation, fc2 (N, hidden), over the N tokens."""
        return [block.mlp_tokens for block in self.model.blocks]

    def impulse_response(self, mlp: Mlp) -> torch.Tensor:
        """(N, N): R[p, q] = mlp(e_q)[p] - mlp(0)[p], how output token p answers a unit impulse on
        input token q (the same for every channel, as the weights are shared across channels)."""
        param = mlp.fc1.weight
        n = param.shape[1]
        probes = torch.cat([torch.zeros(1, n), torch.eye(n)]).to(param.device, param.dtype)
        with torch.no_grad(), _eval(mlp):
            out = mlp(probes)
        return (out[1:] - out[:1]).T

    def measured_layers(self, kernel_size: int, offsets: list[Offset] | None = None) -> list[LayerReport]:
        """Per block, the share of |R[p, :]| on token p + offset (the given one, or the best of the f x f
        kernel), averaged over the tokens p that have that neighbour."""
        reports = []
        for i, mlp in enumerate(self.token_mlps()):
            response = self.impulse_response(mlp).abs().float()
            shares = (response / response.sum(-1, keepdim=True).clamp_min(1e-30))[None, None]  # (1, 1, N, N)
            if offsets is None:
                heads = best_offsets(shares, kernel_size, self.grid, 0)
            else:
                heads = [HeadReport(offsets[i], float(offset_mass(shares, [offsets[i]], self.grid, 0)[0]))]
            reports.append(LayerReport(i, heads))
        return reports

    def reset_timm(self, generator: torch.Generator) -> None:
        reset_with_timm(self.model, generator)

    def reset_kaiming(self, generator: torch.Generator) -> None:
        torch_defaults_(self.model, generator, None, [])
