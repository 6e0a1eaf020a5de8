"""The paper's own solve of Q and K, run to learn how sharp it makes each head's map on a model.

The paper's sin-cos numbers come from github osiriszjq/structured_init (9c2d0e0), read for docs/regimes.md:
per head, Adam (lr 1e-4, 10,000 steps) on the MSE between softmax(d^-1/2 · P Q K^T P^T) and the head's
0/1 shift map, P the layer-normalised position embedding, Q (D x d) and K (d x D) drawn
uniform(±(d·heads)^-1/2), each column's norm reset to Q's initial mean every 100 steps. The solve draws
from its own generator (seed 0) and runs on the device it is given (on a CPU, its heads shared among threads).
Asked to, it stops where it has saturated (the mass on the offset at or above SATURATED, rising): past
that point every solve of benchmarks/solve_grid.py ended at 0.99 or more (docs/bench_solve.md), and
sharpness.py asks it to only within the shapes those solves cover.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import pairwise

import torch

from ..offsets import Offset, assign_offsets, impulse_maps, offset_mass

STEPS, LR, RENORM_EVERY = 10_000, 1e-4, 100
SATURATED = 0.995  # a check at or above it, each of the last RISING checks above the one before: 0.99 is reached
RISING = 3


@dataclass
class PaperSolve:
    """What a solve reached: Q (heads, D, d), K (heads, d, D), the offsets, the mass on them at the end
    (`mass`), the steps run, and the mass at every check (each RENORM_EVERY steps, after the reset)."""

    q: torch.Tensor
    k: torch.Tensor
    offsets: list[Offset]
    mass: float
    steps: int
    trace: list[float]

    @property
    def saturated(self) -> bool:
        return self.steps < STEPS


def paper_solve(
    pseudo: torch.Tensor,
    grid: tuple[int, int],
    heads: int,
    kernel_size: int,
    *,
    steps: int = STEPS,
    seed: int = 0,
    device: torch.device | str = "cpu",
    threads: int = 1,
    stop_saturated: bool = False,
    on_step: Callable[[int], None] | None = None,
) -> PaperSolve:
    """The paper's solve on `pseudo`, the (T, D) tokens of the grid's positions: random offsets of the
    f x f kernel, fitted as the paper's code fits them. On a CPU its heads are shared among `threads`
    threads of one torch thread each (a busy core then slows, not stalls, the others); `on_step(step)`
    now and then with the steps done. With `stop_saturated`, it stops once the trace shows saturation
    (`saturated`)."""
    generator = torch.Generator().manual_seed(seed)
    width = pseudo.shape[1]
    dim = width // heads
    offsets = assign_offsets(heads, kernel_size, "random", generator)
    bound = (dim * heads) ** -0.5
    q = (2 * torch.rand(heads, width, dim, generator=generator) - 1) * bound
    k = (2 * torch.rand(heads, dim, width, generator=generator) - 1) * bound
    pseudo, q, k = (t.to(device) for t in (pseudo.float(), q, k))
    target = impulse_maps(offsets, grid).to(device)
    column_norm, count = q.norm(dim=1).mean(), heads * pseudo.shape[0] ** 2
    shares = torch.arange(heads).tensor_split(1 if torch.device(device).type != "cpu" else min(threads, heads))
    groups = [
        _Heads(pseudo, q[h], k[h], target[h], [offsets[i] for i in h.tolist()], grid, column_norm, count)
        for h in shares
    ]
    trace: list[float] = []
    # the threads meet at every check and every 10 steps (an interrupt waits for 10 steps at most)
    bounds = sorted({0, min(1, steps), min(6, steps), steps, *range(10, steps, 10)})
    with ThreadPoolExecutor(len(groups), initializer=torch.set_num_threads, initargs=(1,)) as pool:
        for start, stop in pairwise(bounds):
            measured = start > 0 and start % RENORM_EVERY == 0  # a check: the masses before this step
            if measured:
                trace.append(sum(pool.map(lambda group: group.measure(start), groups)) / heads)  # noqa: B023
                if stop_saturated and saturated(trace):
                    return PaperSolve(*_joined(groups), offsets, trace[-1], start, trace)
            list(pool.map(lambda group: group.advance(start, stop, measured), groups))  # noqa: B023
            if on_step is not None:
                on_step(stop)
    q, k = _joined(groups)
    mass = float(offset_mass(solved_maps(pseudo, q, k).unsqueeze(0), offsets, grid, 0).mean())
    return PaperSolve(q, k, offsets, mass, steps, trace)


class _Heads:
    """A share of the heads, with its own Adam (elementwise, so it steps as the whole would)."""

    def __init__(self, pseudo, q, k, target, offsets, grid, column_norm, count) -> None:
        self.pseudo, self.q, self.k, self.target, self.offsets, self.grid = pseudo, q, k, target, offsets, grid
        self.column_norm, self.count = column_norm, count
        self.optimizer = torch.optim.Adam([q, k], lr=LR)  # fed the MSE's gradients written out: half autograd's time

    def _gradients(self, step: int) -> torch.Tensor:
        if step % RENORM_EVERY == 0:
            self.q.mul_(self.column_norm / self.q.norm(dim=1, keepdim=True))
            self.k.mul_(self.column_norm / self.k.norm(dim=1, keepdim=True))
        self.q.grad, self.k.grad, maps = _mse_gradients(self.pseudo, self.q, self.k, self.target, self.count)
        return maps

    def measure(self, step: int) -> float:
        """The gradients of `step` and the sum over these heads of the mass on their offsets."""
        maps = self._gradients(step)
        return float(offset_mass(maps.unsqueeze(0), self.offsets, self.grid, 0).sum())

    def advance(self, start: int, stop: int, measured: bool) -> None:
        """Steps start..stop-1 (the gradients of `start` already taken where `measured`)."""
        for step in range(start, stop):
            if step > start or not measured:
                self._gradients(step)
            self.optimizer.step()


def _joined(groups: list[_Heads]) -> tuple[torch.Tensor, torch.Tensor]:
    """Q and K of every head, in order."""
    return torch.cat([g.q for g in groups]), torch.cat([g.k for g in groups])


def saturated(trace: list[float]) -> bool:
    """Whether a solve's checks show saturation: the last at or above SATURATED, each of the last RISING
    above the one before it."""
    last = trace[-RISING - 1 :]
    return len(last) == RISING + 1 and last[-1] >= SATURATED and all(a < b for a, b in pairwise(last))


def _mse_gradients(
    pseudo: torch.Tensor, q: torch.Tensor, k: torch.Tensor, target: torch.Tensor, count: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """d/dQ and d/dK of the MSE's sum over these heads' map entries, divided by `count` (all heads' entries),
    through the softmax's Jacobian (s = d^-1/2 in softmax(s · P Q K P^T)); and the maps."""
    scale = q.shape[-1] ** -0.5
    queries, keys = pseudo @ q, k @ pseudo.T  # (h, T, d), (h, d, T)
    maps = torch.softmax(scale * queries @ keys, dim=-1)
    d_maps = (2.0 / count) * (maps - target)
    d_logits = scale * maps * (d_maps - (d_maps * maps).sum(-1, keepdim=True))
    return pseudo.T @ (d_logits @ keys.transpose(-1, -2)), (queries.transpose(-1, -2) @ d_logits) @ pseudo, maps


def solved_maps(pseudo: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(heads, T, T): softmax(d^-1/2 · P Q K^T P^T), the maps the solve fits."""
    return torch.softmax(q.shape[-1] ** -0.5 * pseudo @ q @ k @ pseudo.T, dim=-1)
