"""timm's VisionTransformer (vit_*, deit_*, and every model built from that class)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from timm.layers import Attention
from timm.models.vision_transformer import (
    ParallelScalingBlock,
    ParallelThingsBlock,
    ResPostBlock,
    VisionTransformer,
)
from torch import nn

from .base import AttentionLayer, ModelAdapter, PackedQKVLayer, timm_embeddings_


class TimmAttentionLayer(PackedQKVLayer):
    """timm's `Attention`: fused qkv Linear, optional q/k norms, output projection; after the norm of a
    pre-norm block (`Block`, a branch of `ParallelThingsBlock`) or read as it is in a post-norm one
    (`ResPostBlock`, whose norm1 normalises the attention's output)."""

    def __init__(self, attn: nn.Module, norm: nn.Module, post_norm: bool = False) -> None:
        self.post_norm = post_norm
        self.attn, self.norm = attn, nn.Identity() if post_norm else norm
        self.num_heads, self.head_dim, self.scale = attn.num_heads, attn.head_dim, attn.scale

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attn.qkv.weight, self.attn.qkv.bias

    def out_weight(self) -> torch.Tensor:
        return self.attn.proj.weight

    def qk_norms(self) -> tuple[nn.Module, nn.Module] | None:
        return _qk_norms(self.attn)


class ParallelScalingLayer(PackedQKVLayer):
    """The attention of timm's `ParallelScalingBlock` (vit_pwee_*): its q, k and v are rows of the one
    in_proj that also makes the MLP's hidden units, its output projection attn_out_proj (or the first
    columns of a fused out_proj)."""

    def __init__(self, block: nn.Module) -> None:
        self.block, self.norm = block, block.in_norm
        self.num_heads, self.head_dim, self.scale = block.num_heads, block.head_dim, block.scale
        self.hidden = block.in_split[0]

    def packed(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = self.block.in_proj.bias
        return self.block.in_proj.weight[self.hidden :], None if bias is None else bias[self.hidden :]

    def out_weight(self) -> torch.Tensor:
        block = self.block
        return block.attn_out_proj.weight if block.out_proj is None else block.out_proj.weight[:, : block.in_split[1]]

    def qk_norms(self) -> tuple[nn.Module, nn.Module] | None:
        return _qk_norms(self.block)


def _qk_norms(attn: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    if isinstance(attn.q_norm, nn.Identity) and isinstance(attn.k_norm, nn.Identity):
        return None
    return attn.q_norm, attn.k_norm


def block_layers(index: int, block: nn.Module) -> list[AttentionLayer]:
    """The attention layers of one block of a VisionTransformer, in the order they read the stream; a
    TypeError naming the block's class where its attention is not a plain softmax that structinit reads."""
    if isinstance(block, ParallelScalingBlock):
        return [ParallelScalingLayer(block)]
    if isinstance(block, ParallelThingsBlock):
        branches = [(branch.attn, branch.norm) for branch in block.attns]
    else:
        branches = [(getattr(block, "attn", None), getattr(block, "norm1", None))]
    for attn, _ in branches:
        if not isinstance(attn, Attention) or getattr(attn, "gate", None) is not None:
            holds = _holds(attn, Attention)
            raise TypeError(
                f"block {index} of this VisionTransformer ({type(block).__name__}) has {holds}; structinit supports "
                "blocks whose `attn` is timm's standard `Attention` (fused qkv, optional qk-norm), and the parallel "
                "blocks ParallelThingsBlock and ParallelScalingBlock"
            )
    return [TimmAttentionLayer(attn, norm, isinstance(block, ResPostBlock)) for attn, norm in branches]


class TimmViTAdapter(ModelAdapter):
    family = "timm VisionTransformer (vit_*, deit_*, ...)"
    example = "vit_tiny_patch16_224"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self._layers = [(layer, block) for i, block in enumerate(model.blocks) for layer in block_layers(i, block)]

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return isinstance(model, VisionTransformer)

    @property
    def grid(self) -> tuple[int, int]:
        return tuple(self.model.patch_embed.grid_size)

    @property
    def num_prefix_tokens(self) -> int:
        return self.model.num_prefix_tokens

    def layers(self) -> list[AttentionLayer]:
        return [layer for layer, _ in self._layers]

    def position_embedding(self) -> torch.Tensor | None:
        return self.model.pos_embed

    def _add_position(self, patches: torch.Tensor) -> torch.Tensor:
        """Prefix tokens and position embedding around patch embeddings, as the model's forward adds them."""
        return self.model._pos_embed(patches)

    def pseudo_tokens(self) -> torch.Tensor:
        model = self.model
        gh, gw = self.grid
        param = next(model.parameters())
        zeros = torch.zeros(1, gh, gw, model.embed_dim, device=param.device, dtype=param.dtype)
        if not model.dynamic_img_size:
            zeros = zeros.flatten(1, 2)
        with _eval(model):
            return model.norm_pre(self._add_position(zeros))[0]

    def patch_projection(self) -> nn.Conv2d | None:
        patch = self.model.patch_embed
        proj = getattr(patch, "proj", None)
        if not isinstance(proj, nn.Conv2d) or not isinstance(getattr(patch, "norm", nn.Identity()), nn.Identity):
            return None
        return proj

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        model = self.model
        with _eval(model):
            return model.norm_pre(self._add_position(model.patch_embed(images)))

    def patch_tokens(self, images: torch.Tensor) -> torch.Tensor:
        with _eval(self.model):
            return self.model.patch_embed(images)

    def run_block(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """What layer index + 1 reads: the output of layer index's block, or, where both are branches of
        one ParallelThingsBlock, the same input."""
        block = self._layers[index][1]
        if index + 1 < len(self._layers) and self._layers[index + 1][1] is block:
            return x
        with _eval(self.model):
            return block(x)

    def reset_timm(self, generator: torch.Generator) -> None:
        """The model's own timm init; a fixed position table (sin-cos) is the architecture's, not the init's:
        timm's draw for it goes to a stand-in (the same draws follow), and the table is never written."""
        model, pos = self.model, self.model.pos_embed
        if pos is None or self.learned_position() is not None:
            reset_with_timm(model, generator)
            return
        model.pos_embed = nn.Parameter(torch.empty_like(pos), requires_grad=False)
        try:
            reset_with_timm(model, generator)
        finally:
            model.pos_embed = pos

    def reset_kaiming(self, generator: torch.Generator) -> None:
        # weight_init="skip" leaves the position embedding and tokens uninitialised: timm's values
        torch_defaults_(self.model, generator, self.learned_position(), self.prefix_tokens())

    def prefix_tokens(self) -> list[nn.Parameter]:
        model = self.model
        return [t for t in (model.cls_token, model.reg_token, getattr(model, "dist_token", None)) if t is not None]


def check_blocks(blocks: nn.Module, attention: type | tuple[type, ...], model: str, supported: str) -> None:
    """Refuse, naming the block's class and what it holds, a block whose `attn` is not an ungated
    `attention` (timm's newer gated attention, or a block without one: parallel attention and MLP)."""
    for i, block in enumerate(blocks):
        attn = getattr(block, "attn", None)
        if isinstance(attn, attention) and getattr(attn, "gate", None) is None:
            continue
        raise TypeError(
            f"block {i} of this {model} ({type(block).__name__}) has {_holds(attn, attention)}; structinit supports "
            f"blocks whose `attn` is {supported}"
        )


def _holds(attn: nn.Module | None, attention: type | tuple[type, ...]) -> str:
    if attn is None:
        return "no `attn` module"
    return f"{'a gated ' if isinstance(attn, attention) else ''}{type(attn).__name__} as its `attn`"


def reset_with_timm(model: nn.Module, generator: torch.Generator, init: Callable[[], None] | None = None) -> None:
    """Run the model's own timm init (`init_weights()`, or `init` for a model without one), which draws
    from the global RNG, on a forked RNG seeded from `generator`: the same seed gives the same weights,
    and the caller's RNG is untouched."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    devices = [p.device for p in model.parameters() if p.device.type == "cuda"][:1]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        (init or model.init_weights)()


def timm_scheme_(
    model: nn.Module, generator: torch.Generator, position: nn.Parameter | None, tokens: list[nn.Parameter]
) -> None:
    """timm's ViT scheme on another library's ViT: trunc-normal(0.02) Linear and packed in_proj
    weights, zero biases, LayerNorm 1/0, trunc-normal(0.02) learned position embedding, prefix tokens
    N(0, 1e-6); the patchify convolution keeps its own init (timm leaves convolutions alone too)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=0.02, generator=generator)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.MultiheadAttention):
            nn.init.trunc_normal_(module.in_proj_weight, std=0.02, generator=generator)
            nn.init.zeros_(module.in_proj_bias)
        elif isinstance(module, nn.LayerNorm) and module.elementwise_affine:
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    timm_embeddings_(position, tokens, generator)


def torch_defaults_(
    model: nn.Module, generator: torch.Generator, position: nn.Parameter | None, tokens: list[nn.Parameter]
) -> None:
    """PyTorch's defaults: kaiming_uniform(a=sqrt(5)) Linear/Conv, xavier_uniform packed in_proj with
    zero biases (nn.MultiheadAttention's own reset, after its out_proj's Linear default, as its constructor
    runs them), LayerNorm 1/0; the position embedding (if given) and prefix tokens as in timm, as they have
    no PyTorch default."""
    attentions = [module for module in model.modules() if isinstance(module, nn.MultiheadAttention)]
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            _torch_default_(module, generator)
        elif isinstance(module, nn.MultiheadAttention):
            nn.init.xavier_uniform_(module.in_proj_weight, generator=generator)
        elif isinstance(module, nn.LayerNorm) and module.elementwise_affine:
            nn.init.ones_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for attention in attentions:  # modules() reaches its out_proj after it: the biases zeroed once both are drawn
        for bias in (attention.in_proj_bias, attention.out_proj.bias):
            if bias is not None:
                nn.init.zeros_(bias)
    timm_embeddings_(position, tokens, generator)


def _torch_default_(module: nn.Module, generator: torch.Generator) -> None:
    """`reset_parameters()` of Linear/Conv (kaiming_uniform with a=sqrt(5)), with an explicit generator."""
    nn.init.kaiming_uniform_(module.weight, a=math.sqrt(5), generator=generator)
    if module.bias is not None:
        fan_in = module.weight[0].numel()
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(module.bias, -bound, bound, generator=generator)


class _eval:
    """Context manager: module in eval mode (no dropout) inside, its previous mode restored after."""

    def __init__(self, module: nn.Module) -> None:
        self.module, self.was_training = module, module.training

    def __enter__(self) -> None:
        self.module.eval()

    def __exit__(self, *exc) -> None:
        self.module.train(self.was_training)
