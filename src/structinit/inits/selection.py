"""Weight selection (Xu et al., "Initializing Models with Larger Ones", ICLR 2024): a model initialised
with evenly spaced elements of a larger teacher's weights. The student's tensors take the teacher's of
the same name (so block i takes block i: first-N layer selection), every axis the same evenly spaced
indices (residual channels stay aligned across layers); the classifier is left as the model has it.
`rule=heads` takes whole heads (each student head from one teacher head) in timm's ViT attention;
`qk=impulse` then solves Q/K with the impulse init (docs/selection.md)."""

from __future__ import annotations

import re

import torch
from torch import nn

from ..adapters import ModelAdapter
from ..report import LayerReport
from .impulse import check_impulse, init_impulse
from .options import ImpulseOptions, SelectOptions
from .teacher import Teacher, load_teacher

INDEX_RULE = "every k-th index where the teacher's size is k times the student's, else round(linspace(0, T-1, S))"


def evenly_spaced(teacher: int, student: int) -> torch.Tensor:
    """`student` indices spread evenly over `teacher`: every k-th where it divides, else a rounded linspace."""
    if student > teacher:
        raise ValueError(f"cannot select {student} of {teacher}")
    if teacher % student == 0:
        return torch.arange(student) * (teacher // student)
    return torch.linspace(0, teacher - 1, student).round().long()


def selected(tensor: torch.Tensor, shape: torch.Size, axes: dict[int, torch.Tensor]) -> torch.Tensor:
    """`tensor` cut down to `shape`: on each axis the indices `axes` gives, else evenly spaced ones."""
    for dim, size in enumerate(shape):
        index = axes[dim] if dim in axes else evenly_spaced(tensor.shape[dim], size)
        tensor = tensor.index_select(dim, index)
    return tensor


def check_select(adapter: ModelAdapter, options: SelectOptions) -> None:
    """The refusals of weight selection that need no teacher (init_select makes the others before its
    first write)."""
    if options.teacher is None:
        raise ValueError("select needs a teacher: select[teacher=PATH_OR_TIMM_NAME], or --teacher")
    if options.qk == "impulse":
        check_impulse(adapter, _impulse_options(options))


def init_select(
    adapter: ModelAdapter,
    generator: torch.Generator,
    *,
    kernel_size: int,
    options: SelectOptions,
    source: dict[str, str],
) -> list[LayerReport]:
    """Copy the selected teacher weights into every tensor of the model but its classifier; then, with
    qk=impulse, the impulse init's Q/K (and, if asked, its position scale and V/proj) on top. `source`
    receives what the report records: the teacher, its weights' sha256 and the index rule. Every
    tensor is selected and checked before the first is written."""
    teacher = load_teacher(options.teacher)
    model = adapter.model
    axes = head_axes(adapter, teacher, options.teacher_heads) if options.rule == "heads" else {}
    targets = student_tensors(model)
    _check_names(targets, teacher)
    values = {}
    for name, tensor in targets.items():
        _check_shapes(name, tensor, teacher.state[name])
        values[name] = selected(teacher.state[name], tensor.shape, axes.get(name, {}))
    if options.qk == "impulse" and options.pos_scale is not None:
        _check_position(model, adapter.position_embedding(), values)
    source.update(teacher.record(), indices=INDEX_RULE)
    for name, tensor in targets.items():
        tensor.copy_(values[name].to(tensor.dtype))
    if options.qk == "impulse":
        return init_impulse(adapter, generator, kernel_size=kernel_size, options=_impulse_options(options))
    return adapter.measured_layers(kernel_size)


def _impulse_options(options: SelectOptions) -> ImpulseOptions:
    """The impulse init that qk=impulse runs on the selected model."""
    return ImpulseOptions(target_fidelity=options.target_fidelity, pos_scale=options.pos_scale, vproj=options.vproj)


def _check_position(model: nn.Module, position: torch.Tensor, values: dict[str, torch.Tensor]) -> None:
    """pos_scale rescales a learned position embedding to a standard deviation: refuse a constant one."""
    name = next((name for name, param in model.named_parameters() if param is position), None)
    if name is not None and float(values[name].std()) == 0.0:
        raise ValueError(
            f"the teacher's {name} is constant, and pos_scale rescales it to a standard deviation: "
            "give pos_scale=None, or a teacher whose position embedding is trained or initialised"
        )


def student_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's floating-point parameters and persistent buffers by name (what a teacher's weights hold; a
    non-persistent buffer, Eva's zero k_bias, is the architecture's), less its classifier's."""
    classifier = model.get_classifier() if hasattr(model, "get_classifier") else None
    prefixes = [f"{name}." for name, module in model.named_modules() if module is classifier and name]
    tensors = model.state_dict(keep_vars=True)
    return {
        name: t.detach()  # not .data: a write through it moves the version counter Report.set_tensors reads
        for name, t in tensors.items()
        if t.is_floating_point() and not any(name.startswith(p) for p in prefixes)
    }


def head_axes(adapter: ModelAdapter, teacher: Teacher, teacher_heads: int | None) -> dict[str, dict[int, torch.Tensor]]:
    """rule=heads: per tensor name, the indices of its head axes, so that each student head takes its
    dimensions from one teacher head (evenly spaced heads, evenly spaced dimensions within them)."""
    heads = teacher_heads or teacher.heads
    if heads is None:
        raise ValueError(
            "rule=heads needs the teacher's head count, which its weights alone do not say: give teacher_heads=N"
        )
    axes = {}
    for i, layer in enumerate(adapter.layers()):
        prefix = f"blocks.{i}.attn."
        if f"{prefix}qkv.weight" not in teacher.state or not hasattr(getattr(layer, "attn", None), "qkv"):
            raise ValueError(
                "rule=heads knows timm's ViT attention (blocks.N.attn.qkv, blocks.N.attn.proj); this model or "
                "teacher is laid out otherwise: use rule=uniform"
            )
        width = teacher.state[f"{prefix}qkv.weight"].shape[0] // 3
        if heads % layer.num_heads or width % heads or layer.head_dim > width // heads:
            raise ValueError(
                f"rule=heads: the student's {layer.num_heads} heads of {layer.head_dim} cannot each come from one "
                f"of the teacher's {heads} heads of {width // heads} (the head counts must divide)"
            )
        within = evenly_spaced(width // heads, layer.head_dim)
        channels = (evenly_spaced(heads, layer.num_heads)[:, None] * (width // heads) + within).flatten()
        rows = torch.cat([part * width + channels for part in range(3)])
        axes.update({f"{prefix}qkv.weight": {0: rows}, f"{prefix}qkv.bias": {0: rows}})
        axes[f"{prefix}proj.weight"] = {1: channels}
    return axes


def _check_names(targets: dict[str, torch.Tensor], teacher: Teacher) -> None:
    missing = [name for name in targets if name not in teacher.state]
    if not missing:
        return
    depth = re.compile(r"^(.*?)\.(\d+)\.")
    found = depth.match(missing[0])
    if found:
        indices = [int(m[2]) for n in teacher.state if (m := depth.match(n)) and m[1] == found[1]]
        ours = [int(m[2]) for n in targets if (m := depth.match(n)) and m[1] == found[1]]
        if indices and max(ours) > max(indices):
            raise ValueError(
                f"the student is deeper than the teacher: {max(ours) + 1} {found[1]} against {max(indices) + 1}"
            )
    raise ValueError(
        f"the teacher has no {missing[0]} (nor {len(missing) - 1} more of the student's tensors): is it of "
        "another family, or built with other options (class token, position embedding, qkv bias)?"
    )


def _check_shapes(name: str, student: torch.Tensor, teacher: torch.Tensor) -> None:
    shapes = f"{name} is {tuple(student.shape)} in the student, {tuple(teacher.shape)} in the teacher"
    if student.dim() != teacher.dim():
        raise ValueError(f"cannot select: {shapes}")
    if name.endswith("pos_embed") and student.shape[:-1] != teacher.shape[:-1]:
        raise ValueError(
            f"the position embeddings hold other token counts ({shapes}): build the student at the teacher's "
            "image size, patch size and prefix tokens"
        )
    if any(s > t for s, t in zip(student.shape, teacher.shape)):
        raise ValueError(f"the student is wider than the teacher: {shapes}")
