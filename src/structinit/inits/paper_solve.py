"""How sharp the paper's own solve makes each head's map on a model: the sharpness `impulse` takes.

The paper's sin-cos numbers come from github osiriszjq/structured_init (9c2d0e0), read for docs/regimes.md:
per head, Adam (lr 1e-4, 10,000 steps) on the MSE between softmax(d^-1/2 · P Q K^T P^T) and the head's
0/1 shift map, P the layer-normalised position embedding, Q (D x d) and K (d x D) drawn
uniform(±(d·heads)^-1/2), each column's norm reset to Q's initial mean every 100 steps. `impulse` solves
its Q/K in closed form at the mean offset mass this solve reaches on the model's own pseudo input
(docs/methods.md); for a learned embedding, on a trunc-normal draw of its shape (seed 0: the solve
reached 0.25 on each of three seeds' own draws, docs/studies/default-rule.md). The solve draws from its own
generator (seed 0), so `impulse` and `impulse[target_fidelity=<that value>]` give the same weights; a value
once solved is kept in ~/.cache/structinit, by the pseudo input's bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from pathlib import Path

import torch

from ..errors import Notice
from ..files import atomic_write_text
from ..offsets import assign_offsets, impulse_maps, offset_mass

STEPS, LR, RENORM_EVERY = 10_000, 1e-4, 100
DECIMALS = 2  # the solve's mass is kept to 0.01 (docs/methods.md: its spread over the solve's seeds), in [0.01, 0.99]
CACHE_NAME = "paper-sharpness.json"


def paper_solve(
    pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int, steps: int = STEPS, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Q (heads, D, d) and K (heads, d, D), fitted to random offsets of the f x f kernel on `pseudo`, the
    (T, D) tokens of the grid's positions, as the paper's code fits them; and the offsets."""
    generator = torch.Generator().manual_seed(seed)
    width = pseudo.shape[1]
    dim = width // heads
    offsets = assign_offsets(heads, kernel_size, "random", generator)
    target = impulse_maps(offsets, grid)
    bound = (dim * heads) ** -0.5
    q = (2 * torch.rand(heads, width, dim, generator=generator) - 1) * bound
    k = (2 * torch.rand(heads, dim, width, generator=generator) - 1) * bound
    column_norm = q.norm(dim=1).mean()
    optimizer = torch.optim.Adam([q, k], lr=LR)  # fed the MSE's gradients written out: half autograd's time
    for step in range(steps):
        if step % RENORM_EVERY == 0:
            q.mul_(column_norm / q.norm(dim=1, keepdim=True))
            k.mul_(column_norm / k.norm(dim=1, keepdim=True))
        q.grad, k.grad = _mse_gradients(pseudo, q, k, target)
        optimizer.step()
    return q, k, offsets


def _mse_gradients(
    pseudo: torch.Tensor, q: torch.Tensor, k: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """d/dQ and d/dK of mean((softmax(s · P Q K P^T) - H)^2), s = d^-1/2, through the softmax's Jacobian."""
    scale = q.shape[-1] ** -0.5
    queries, keys = pseudo @ q, k @ pseudo.T  # (h, T, d), (h, d, T)
    maps = torch.softmax(scale * queries @ keys, dim=-1)
    d_maps = (2.0 / maps.numel()) * (maps - target)
    d_logits = scale * maps * (d_maps - (d_maps * maps).sum(-1, keepdim=True))
    return pseudo.T @ (d_logits @ keys.transpose(-1, -2)), (queries.transpose(-1, -2) @ d_logits) @ pseudo


def solved_maps(pseudo: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(heads, T, T): softmax(d^-1/2 · P Q K^T P^T), the maps the solve fits."""
    return torch.softmax(q.shape[-1] ** -0.5 * pseudo @ q @ k @ pseudo.T, dim=-1)


def reached_mass(pseudo: torch.Tensor, grid: tuple[int, int], q: torch.Tensor, k: torch.Tensor, offsets) -> float:
    """The mean mass the solved maps put on each head's offset (valid queries only)."""
    return float(offset_mass(solved_maps(pseudo, q, k).unsqueeze(0), offsets, grid, 0).mean())


def paper_sharpness(pseudo: torch.Tensor, grid: tuple[int, int], heads: int, kernel_size: int) -> float:
    """The mass the paper's solve reaches on the grid tokens `pseudo`, to 0.01 and within [0.01, 0.99] (a
    target the closed form can meet); solved once per pseudo input and kept (a cache that cannot be read
    is solved again and rewritten)."""
    pseudo = pseudo.detach().to("cpu", torch.float32).contiguous()
    digest = hashlib.sha256(pseudo.numpy().tobytes()).hexdigest()[:16]
    key = f"{digest}-{tuple(pseudo.shape)}-g{grid[0]}x{grid[1]}-h{heads}-f{kernel_size}-{STEPS}"
    path = cache_home() / CACHE_NAME
    kept = _read(path)
    if key not in kept:
        note = f"impulse: the paper's solve on this model's {pseudo.shape[0]} position tokens, once (~1 minute a CPU "
        warnings.warn(note + f"core at 256 tokens; kept in {path}; target_fidelity=X skips it)", Notice, stacklevel=2)
        mass = reached_mass(pseudo, grid, *paper_solve(pseudo, grid, heads, kernel_size))
        kept = {**_read(path), key: min(max(round(mass, DECIMALS), 0.01), 0.99)}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(kept, indent=1, sort_keys=True) + "\n")
    return kept[key]


def cache_home() -> Path:
    """~/.cache/structinit, or $STRUCTINIT_CACHE where set."""
    return Path(os.environ.get("STRUCTINIT_CACHE") or Path.home() / ".cache" / "structinit")


def _read(path: Path) -> dict[str, float]:
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}
