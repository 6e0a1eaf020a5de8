"""What an init did, per layer and head, in a form to print, log or save as JSON."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .offsets import Offset, kernel_offsets, offset_mass
from .schema import Schema, listing, mapping, problem

MEASURED = "measured"  # the method of a report that measured a model (measure.fidelity): its offsets are its finding


@dataclass
class HeadReport:
    offset: Offset | None  # the head's impulse offset (dy, dx): assigned, or the best one when measured
    fidelity: float | None  # mean attention mass valid queries put on the key at that offset
    assigned: bool = True  # the init set the offset (an impulse init), not a measurement that found it


@dataclass
class LayerReport:
    index: int
    heads: list[HeadReport]
    seconds: float = 0.0  # time spent solving this layer


@dataclass
class Report:
    """Per-layer, per-head offsets and fidelities; `mean_fidelity`/`min_fidelity` summarise them."""

    method: str
    model: str
    layers: list[LayerReport]
    seconds: float = 0.0
    seed: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    measured_on: str = "pseudo input"
    unit: str = "head"  # what carries an offset: an attention head, a ConvMixer filter, a Mixer token mixer
    source: dict[str, str] = field(default_factory=dict)  # where the weights came from (select: the teacher)
    constructor: dict[str, Any] = field(default_factory=dict)  # how to build the model again (models.constructor)
    on_images: dict[str, Any] | None = None  # the same fidelity on real images (fidelity.measure_on_images)
    set_tensors: list[str] = field(default_factory=list)  # the model's tensors (state_dict names) the init wrote

    def _fidelities(self) -> list[float]:
        return [h.fidelity for layer in self.layers for h in layer.heads if h.fidelity is not None]

    @property
    def mean_fidelity(self) -> float | None:
        values = self._fidelities()
        return sum(values) / len(values) if values else None

    @property
    def min_fidelity(self) -> float | None:
        values = self._fidelities()
        return min(values) if values else None

    @property
    def max_fidelity(self) -> float | None:
        values = self._fidelities()
        return max(values) if values else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "model": self.model,
            "seed": self.seed,
            "options": dict(self.options),
            **({"source": dict(self.source)} if self.source else {}),
            **({"constructor": dict(self.constructor)} if self.constructor else {}),
            "measured_on": self.measured_on,
            "unit": self.unit,
            "mean_fidelity": self.mean_fidelity,
            "min_fidelity": self.min_fidelity,
            **({"on_images": dict(self.on_images)} if self.on_images else {}),
            "seconds": self.seconds,
            "layers": [
                {
                    "index": layer.index,
                    "seconds": layer.seconds,
                    "heads": [
                        {"offset": list(h.offset) if h.offset else None, "fidelity": h.fidelity} for h in layer.heads
                    ],
                }
                for layer in self.layers
            ],
        }

    def __str__(self) -> str:
        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}"

        options = ", ".join(f"{k}={v}" for k, v in self.options.items())
        unit = self.unit
        # an init that assigns no offsets (timm, mimetic, ...) is not an impulse filter: its heads show only
        # the largest share one kernel offset holds, not an offset that would read as assigned
        offsets = self.method == MEASURED or any(h.assigned and h.offset for layer in self.layers for h in layer.heads)
        lines = [
            f"{self.method} init of {self.model} (seed {self.seed}) in {self.seconds:.3f} s"
            + (f" [{options}]" if options else ""),
            f"fidelity on {self.measured_on}: mean {fmt(self.mean_fidelity)}, worst {unit} {fmt(self.min_fidelity)}",
            f"layer  seconds  {unit}s: offset (dy,dx) fidelity"
            if offsets
            else f"layer  seconds  {unit}s: largest share on one offset (no offsets assigned)",
        ]
        if self.on_images:
            lines[2:2] = images_lines(self.mean_fidelity, self.on_images, unit)
        if self.source:
            lines.insert(1, "from " + ", ".join(f"{k} {v}" for k, v in self.source.items()))
        shown = 16  # a ConvMixer layer has hundreds of filters: show the first few
        for layer in self.layers:
            cells = "  ".join(
                (f"{f'({h.offset[0]:+d},{h.offset[1]:+d})' if h.offset else '(  -  )'} " if offsets else "")
                + fmt(h.fidelity)
                for h in layer.heads[:shown]
            )
            more = f"  ... {len(layer.heads) - shown} more" if len(layer.heads) > shown else ""
            lines.append(f"{layer.index:>5}  {layer.seconds:7.3f}  {cells}{more}")
        return "\n".join(lines)


# a mean fidelity on images this far under the pseudo input's: the report says where the structure lives
APART = 0.25


def images_lines(pseudo: float | None, on_images: dict[str, Any], unit: str = "head") -> list[str]:
    """The report's lines on real images: their fidelity beside a uniform map's, and, where it is far under
    the pseudo input's, where the structure lives."""
    mean, worst, uniform = on_images["mean"], on_images["min"], on_images["uniform"]
    count = on_images["images"]
    lines = [f"fidelity on {count} images: mean {mean:.3f}, worst {unit} {worst:.3f} (a uniform map: {uniform:.3f})"]
    if pseudo is not None and pseudo - mean > APART:
        lines.append(
            "the structure is on the pseudo input (the position embedding alone), not yet on images: there the "
            "patch embedding outweighs the position embedding inside the LayerNorm and scales down the part the "
            "Q/K read; training decides whether the structure is used"
        )
    return lines


# what a saved report's layers hold that is read back (weight selection's teacher, a grid's result rows)
RECORDED_LAYERS = Schema({"layers": listing(mapping(Schema({"heads": listing(at_least=1)})), optional=True, null=True)})


def recorded_heads(record: dict[str, Any]) -> int | None:
    """The heads (units) per layer that a saved report (`Report.to_dict`) records, from its first layer;
    None if it records no layers. ValueError (why) if its layers are not a report's: each a mapping
    with a list of its heads, one at least."""
    why = problem(record, RECORDED_LAYERS)
    if why:
        raise ValueError(why)
    layers = record.get("layers")
    return len(layers[0]["heads"]) if layers else None


def best_offsets(attn: torch.Tensor, kernel_size: int, grid: tuple[int, int], num_prefix: int) -> list[HeadReport]:
    """For each head, the offset of an f x f kernel that holds the most mass, and that mass."""
    candidates = kernel_offsets(kernel_size)
    heads = attn.shape[1]
    masses = torch.stack([offset_mass(attn, [o] * heads, grid, num_prefix) for o in candidates], dim=1)
    best = masses.argmax(dim=1)
    return [HeadReport(candidates[int(i)], float(masses[h, i]), assigned=False) for h, i in enumerate(best)]
