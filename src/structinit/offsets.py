"""Convolution kernels as attention targets: the f x f offsets, their assignment to heads, the impulse
attention maps they define on a token grid, and how much of a map sits on an offset."""

from __future__ import annotations

import torch

Offset = tuple[int, int]

# The authors' order for a 3x3 kernel: centre, up, right, left, down, then the four diagonals.
_AUTHORS_3X3 = [(0, 0), (-1, 0), (0, 1), (0, -1), (1, 0), (-1, -1), (-1, 1), (1, -1), (1, 1)]


def check_kernel_size(kernel_size: int, grid: tuple[int, int], patch: int | None = None) -> None:
    """Raise ValueError unless `kernel_size` is an odd integer >= 1 that fits inside `grid`; the
    message names the largest kernel that fits and, given the model's `patch`, a patch that fits the
    kernel (a grid of about 8 x 8 tokens or more)."""
    if isinstance(kernel_size, bool) or not isinstance(kernel_size, int):
        raise TypeError(f"kernel_size must be an odd int (3 or 5 in the paper), got {kernel_size!r}")
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1 (3 or 5 in the paper), got {kernel_size}")
    if kernel_size > min(grid):
        largest = min(grid) - 1 + min(grid) % 2
        fix = f"kernel_size {largest}" if largest == 1 else f"a kernel_size of at most {largest}"
        side = min(grid) * patch if patch else None
        smaller = max(1, side // max(8, kernel_size)) if side else None
        if smaller and smaller < patch and side // smaller >= kernel_size:
            fix = (
                f"build the model with patch_size={smaller} for {side // smaller}x{side // smaller} tokens "
                f"(--model-kwargs patch_size={smaller}), or use {fix}"
            )
        else:
            fix = f"use {fix}, or a model with more patches"
        raise ValueError(f"kernel_size {kernel_size} does not fit the {grid[0]}x{grid[1]} token grid: {fix}")


def kernel_offsets(kernel_size: int, order: str = "raster") -> list[Offset]:
    """All (dy, dx) offsets of an f x f kernel.

    `order="raster"` is row-major; `order="ordered"` is centre first, then by distance from the centre
    (for f = 3 exactly the authors' order: centre, 4-neighbours, diagonals).
    """
    r = kernel_size // 2
    offsets = [(dy, dx) for dy in range(-r, r + 1) for dx in range(-r, r + 1)]
    if order == "raster":
        return offsets
    if order != "ordered":
        raise ValueError(f"order must be 'raster' or 'ordered', got {order!r}")
    if kernel_size == 3:
        return list(_AUTHORS_3X3)
    return sorted(offsets, key=lambda o: (o[0] ** 2 + o[1] ** 2, offsets.index(o)))


def assign_offsets(num_heads: int, kernel_size: int, assignment: str, generator: torch.Generator) -> list[Offset]:
    """One offset per head.

    `"random"`: random permutations of all f^2 offsets, concatenated, so every offset is used once
    before any is repeated. `"ordered"`: the fixed order of `kernel_offsets(..., "ordered")`, cycled.
    """
    if assignment == "ordered":
        pool = kernel_offsets(kernel_size, "ordered")
        return [pool[h % len(pool)] for h in range(num_heads)]
    if assignment != "random":
        raise ValueError(f"assignment must be 'random' or 'ordered', got {assignment!r}")
    pool = kernel_offsets(kernel_size)
    chosen: list[Offset] = []
    while len(chosen) < num_heads:
        perm = torch.randperm(len(pool), generator=generator).tolist()
        chosen.extend(pool[i] for i in perm)
    return chosen[:num_heads]


def grid_coordinates(grid: tuple[int, int]) -> torch.Tensor:
    """(N, 2) float64 (row, col) coordinates of the tokens of a grid, in raster order."""
    gh, gw = grid
    rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
    return torch.stack([rows.flatten(), cols.flatten()], dim=1).double()


def target_indices(offsets: list[Offset], grid: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """For each head and query token, the index of its target key and whether that key exists.

    Returns `(target, valid)`, both (heads, N). Queries whose p + offset leaves the grid (zero padding
    in convolution terms) are not valid: they have no target and are not counted in fidelity.
    """
    gh, gw = grid
    coords = grid_coordinates(grid).long()
    delta = torch.tensor(offsets, dtype=torch.long).view(-1, 1, 2)
    moved = coords.unsqueeze(0) + delta
    valid = (moved[..., 0] >= 0) & (moved[..., 0] < gh) & (moved[..., 1] >= 0) & (moved[..., 1] < gw)
    target = moved[..., 0].clamp(0, gh - 1) * gw + moved[..., 1].clamp(0, gw - 1)
    return target, valid


def impulse_maps(offsets: list[Offset], grid: tuple[int, int]) -> torch.Tensor:
    """(heads, N, N) target attention maps: H[h, p, p + offset_h] = 1 where that key exists."""
    target, valid = target_indices(offsets, grid)
    n = grid[0] * grid[1]
    maps = torch.zeros(len(offsets), n, n)
    maps.scatter_(2, target.unsqueeze(-1), valid.unsqueeze(-1).float())
    return maps


def offset_mass(attn: torch.Tensor, offsets: list[Offset], grid: tuple[int, int], num_prefix: int) -> torch.Tensor:
    """Per head, the mean mass that valid grid queries put on their key at the head's offset.

    attn: (B, heads, T, T) attention maps; offsets: one per head. Returns (heads,).
    """
    target, valid = target_indices(offsets, grid)
    target, valid = target.to(attn.device), valid.to(attn.device)
    grid_rows = attn[:, :, num_prefix:, :]
    mass = grid_rows.gather(-1, (target + num_prefix).expand(attn.shape[0], -1, -1).unsqueeze(-1)).squeeze(-1)
    return ((mass * valid).sum(-1) / valid.sum(-1).clamp_min(1)).mean(0)
