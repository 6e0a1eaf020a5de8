"""Stratified training subsets and validation splits: deterministic in the seed and the labels."""

from __future__ import annotations

from collections.abc import Iterator

import torch


def stratified_subset(
    labels: torch.Tensor, per_class: int | None, fraction: float | None, seed: int
) -> torch.Tensor | None:
    """Indices of a deterministic stratified subset: `per_class` images of every class, or `fraction`
    of each class (rounded, at least one). The draw depends on `seed` and the labels only."""
    return stratified_split(labels, per_class, fraction, None, seed)[0]


def stratified_split(
    labels: torch.Tensor,
    per_class: int | None,
    fraction: float | None,
    val_per_class: int | None,
    seed: int,
    classes: list[str] | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(training indices, validation indices), both stratified and deterministic (seed and labels).

    Each class's images are shuffled once: the training subset is the head of that order (`per_class`
    images, `fraction` of the class, or all but the validation images), the validation split its last
    `val_per_class` images. So a training subset is the same with or without a validation split, and
    with a subset smaller than the class the validation images are ones it does not use.
    None for a part that is not asked for (training: the whole set). `classes` names them in errors."""
    if per_class is not None and fraction is not None:
        raise ValueError("give --per-class or --train-fraction, not both")
    if per_class is not None and per_class < 1:
        raise ValueError(f"--per-class must be >= 1, got {per_class}")
    if fraction is not None and not 0 < fraction <= 1:
        raise ValueError(f"--train-fraction must be in (0, 1], got {fraction}")
    if val_per_class is not None and val_per_class < 1:
        raise ValueError(f"--val-per-class must be >= 1, got {val_per_class}")
    if per_class is None and fraction is None and val_per_class is None:
        return None, None
    train, val = [], []
    for cls, order in shuffled_classes(labels, seed):
        name = repr(classes[cls]) if classes is not None and cls < len(classes) else cls
        n, held = len(order), val_per_class or 0
        if per_class is not None:
            count = per_class
        elif fraction is not None:
            count = max(1, round(fraction * n))
        else:
            count = n - held
        if count > n:
            raise ValueError(f"--per-class {per_class}: class {name} has only {n} training images")
        if count < 1 or count + held > n:
            raise ValueError(
                f"--val-per-class {val_per_class}: class {name} has {n} training images, too few for "
                f"{max(count, 1)} training and {held} validation images"
            )
        train.append(order[:count])
        if held:
            val.append(order[n - held :])
    return torch.cat(train).sort().values, torch.cat(val).sort().values if val else None


def stratified_head(labels: torch.Tensor, per_class: int, seed: int) -> torch.Tensor:
    """Indices of up to `per_class` images of every class (all of a smaller class), drawn once from `seed`:
    the same evaluation subset at every evaluation of a run, and of every run on the same data."""
    return torch.cat([order[:per_class] for _, order in shuffled_classes(labels, seed)]).sort().values


def shuffled_classes(labels: torch.Tensor, seed: int) -> Iterator[tuple[int, torch.Tensor]]:
    """Each class and the indices of its images in one shuffled order, drawn from `seed` class by class: the
    head of that order is a subset, its tail a validation split."""
    generator = torch.Generator().manual_seed(seed)
    for cls in torch.unique(labels).tolist():
        members = torch.nonzero(labels == cls).flatten()
        yield cls, members[torch.randperm(len(members), generator=generator)]
