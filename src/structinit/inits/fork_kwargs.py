"""The authors' fork of timm (osiriszjq/structured_initialization, 7cd02f1) sets its init with
`--model-kwargs weight_init=W post_weight_init=X`: timm's init W first ('skip': none, PyTorch's defaults
stay), then X on top ('default': nothing more, 'mimetic', 'impulse': Q/K solved, position embedding x18,
V/proj mimetic). Here each pair is the init label that makes the same weights."""

from __future__ import annotations

from typing import Any

WEIGHT_INITS = ("", "jax", "jax_nlhb", "moco", "skip")  # timm's VisionTransformer(weight_init=...)
# post_weight_init -> the label on PyTorch's defaults (after 'skip'), and on the weights timm's init left
AUTHORS = {
    "default": ("kaiming", "default"),
    "mimetic": ("mimetic[base=kaiming]", "mimetic"),
    "impulse": ("impulse-neurips", "impulse-neurips[base=keep]"),
}


def fork_init(kwargs: dict[str, Any], where: str = "--model-kwargs") -> tuple[str | None, dict[str, Any]]:
    """(the init label, the keywords left for timm) of model keywords that may name the fork's init: with
    post_weight_init, its label (weight_init=skip: on PyTorch's defaults, which structinit's base draws;
    another weight_init: on timm's, which timm draws from the keyword); weight_init alone is timm's own
    (label 'default': the model as timm made it). None: neither keyword."""
    weight_init, post = kwargs.get("weight_init"), kwargs.get("post_weight_init")
    if weight_init is None and post is None:
        return None, kwargs
    if weight_init is not None and weight_init not in WEIGHT_INITS:
        shown = ", ".join(repr(w) for w in WEIGHT_INITS)
        raise ValueError(f"{where} weight_init={weight_init}: timm's ViTs take {shown}")
    if post is None:
        return "default", kwargs
    if post not in AUTHORS:
        raise ValueError(
            f"{where} post_weight_init={post}: the authors' fork takes default, mimetic or impulse (its scaled "
            "forms such as impulse18_7_1: give --init impulse-neurips[pos_scale=...] instead)"
        )
    rest = {k: v for k, v in kwargs.items() if k != "post_weight_init"}
    if weight_init == "skip":  # structinit's base=kaiming draws PyTorch's defaults
        del rest["weight_init"]
        return AUTHORS[post][0], rest
    return AUTHORS[post][1], rest  # timm draws its init (the fork's default weight_init: '')
