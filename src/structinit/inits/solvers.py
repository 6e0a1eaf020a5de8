"""Solve query/key weights whose softmax attention on a pseudo input reproduces impulse maps.

Shapes: X is (T, D), the pseudo input of one layer (T tokens: P prefix tokens, then the N grid tokens
in raster order); Q and K are (heads, D, d), so that head h's logits are scale * X Q_h K_h^T X^T.

The closed form does not fit the 0/1 target map by least squares and truncate it to rank d, as the
authors' solver does: a shift matrix is nearly full rank, so its rank-d truncation is blurred, which is
why that solver loses fidelity on small heads. Instead every key gets a d-dimensional *code*
psi_q = X K (the rows of the top-d left singular vectors of X, scaled to unit norm: nearly orthogonal
to each other) and every query is mapped onto the code of its target key, X Q = c P_X S psi. A code's
product with itself (1) beats its product with any other code, so the target holds every row's
largest logit whatever the grid and head size; the gain c of each head is set by bisection so that
the head's mean fidelity is exactly the one asked for. How much of that survives the patch content of
real images is measured by benchmarks/bench_init.py.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ..offsets import Offset, impulse_maps, target_indices
from .partial_eigh import all_eigenpairs, largest_eigenpairs


class PseudoInput:
    """A layer's pseudo input X (T, D) in float64 with its SVD, computed once and shared by layers
    whose pseudo inputs are identical (all of them at init when the norms are untrained). It also
    remembers the solution per offset, which every head with that offset shares up to a rotation."""

    def __init__(self, x: torch.Tensor, rcond: float) -> None:
        self.x = x.detach().double().cpu()
        u, s, vh = torch.linalg.svd(self.x, full_matrices=False)
        u, v = fixed_signs(u, vh.T)  # the codes are U's columns: their signs decide the weights
        # Directions with singular values below rcond x the largest are not inverted (as numpy's lstsq
        # `rcond`). At least float32 precision: a LayerNorm output has an exact null direction, the
        # all-ones vector. More for ill-conditioned inputs: weights that read a direction the pseudo
        # input barely uses amplify whatever patch content lies there on real images.
        # The offset solve may go below rcond (down to 1e-5) where the directions above it cannot
        # reach its fidelity (solve_offset); everything else uses the first `rank` directions.
        usable = s > s[0] * 1e-5
        self._u, self._s, self._v = u[:, usable], s[usable], v[:, usable]
        self.rank = int((s > s[0] * max(rcond, 1e-5)).sum())
        self._solved: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def left(self) -> torch.Tensor:
        """(T, rank) left singular vectors above rcond."""
        return self._u[:, : self.rank]

    @property
    def values(self) -> torch.Tensor:
        return self._s[: self.rank]

    @property
    def right(self) -> torch.Tensor:
        """(D, rank) right singular vectors above rcond."""
        return self._v[:, : self.rank]

    def solve_offset(
        self, offset: Offset, grid: tuple[int, int], num_prefix: int, fidelity: float, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q, K (D, head_dim) for one offset, with logits X Q K^T X^T of mean fidelity `fidelity`.

        With the directions above rcond only, codes can be too alike to single out every target
        (a fixed sin-cos table of 256 tokens keeps 11 directions for heads of dimension 16: fidelity
        0.77, with Q/K weights pushed 7x larger by the search for a gain that does not exist). Then
        the next directions are added one at a time until the fidelity is reached (13 there: 0.98
        with the smaller weights); if none reaches it, the solution above rcond stays."""
        key = (offset, grid, num_prefix, fidelity, head_dim)
        if key not in self._solved:
            target, valid = target_indices([offset], grid)
            target = target + num_prefix
            for count in range(self.rank, len(self._s) + 1):
                q, k, reached = self._solve_with(count, target, valid, num_prefix, fidelity, head_dim)
                if count == self.rank:
                    self._solved[key] = (q, k)  # kept if no count reaches the fidelity
                if reached >= fidelity - 1e-3:
                    self._solved[key] = (q, k)
                    break
        return self._solved[key]

    def _solve_with(
        self, count: int, target: torch.Tensor, valid: torch.Tensor, num_prefix: int, fidelity: float, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor, float]:
        """Q, K and the fidelity they reach, solved on the top `count` directions of X."""
        x, tokens = self.x, self.x.shape[0]
        left, pinv = self._u[:, :count], (self._v[:, :count] / self._s[:count]) @ self._u[:, :count].T
        width = min(head_dim, count)
        codes = x.new_zeros(tokens, head_dim)
        # unit rows: a code's product with itself (1) beats its product with any other code
        codes[:, :width] = torch.nn.functional.normalize(left[:, :width], dim=1)
        shifted = x.new_zeros(tokens, head_dim)
        shifted[num_prefix:] = codes[target[0]] * valid[0].unsqueeze(-1)
        q, k = pinv @ shifted, pinv @ codes
        logits = ((x @ q) @ (x @ k).T).unsqueeze(0)
        gain = gain_for_fidelity(logits, target, valid, num_prefix, fidelity)
        reached = float(mean_target_mass(gain.view(-1, 1, 1) * logits, target, valid, num_prefix)[0])
        balance = math.sqrt(float(q.norm() / k.norm().clamp_min(1e-30)))
        return q * math.sqrt(float(gain[0])) / balance, k * math.sqrt(float(gain[0])) * balance, reached


def closed_form(
    pseudo: PseudoInput,
    offsets: list[Offset],
    grid: tuple[int, int],
    num_prefix: int,
    target_fidelity: float,
    scale: float,
    head_dim: int,
    generator: torch.Generator,
    zero_mean: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q, K (heads, D, head_dim), float32, whose attention on X has mean fidelity `target_fidelity`.

    Prefix tokens keep their own codes as keys and have no target as queries (their rows stay near
    uniform). Each head's Q and K are turned by its own random rotation of the head dimensions, which
    leaves its logits unchanged, so that heads sharing an offset do not share weights. With
    `zero_mean` (for q/k LayerNorms) the codes use head_dim - 1 dimensions, rotated away from the
    all-ones direction, so that every q and k has zero mean and the norm only rescales it.
    """
    width = head_dim - int(zero_mean)
    solved = [pseudo.solve_offset(offset, grid, num_prefix, target_fidelity, width) for offset in offsets]
    gauss = torch.empty(len(offsets), head_dim, width, dtype=torch.float64).normal_(generator=generator)
    if zero_mean:
        gauss -= gauss.mean(1, keepdim=True)
    rotations = orthonormal_basis(gauss).transpose(1, 2)  # (heads, width, head_dim), orthonormal rows
    root = 1.0 / math.sqrt(scale)
    q = torch.stack([q for q, _ in solved]) @ rotations  # in float64: rounded once, the same on every CPU
    k = torch.stack([k for _, k in solved]) @ rotations
    return (q * root).float(), (k * root).float()


def orthonormal_basis(gauss: torch.Tensor) -> torch.Tensor:
    """The orthonormal columns of the QR of `gauss` (..., m, n), R's diagonal made positive: that QR is
    unique, so every LAPACK kernel gives the same columns (kernels differ in the signs they return)."""
    basis, triangle = torch.linalg.qr(gauss)
    return basis * triangle.diagonal(dim1=-2, dim2=-1).sign().unsqueeze(-2)


def authors_closed_form(
    pseudo: PseudoInput,
    offsets: list[Offset],
    grid: tuple[int, int],
    num_prefix: int,
    head_dim: int,
    generator: torch.Generator,
    qk_scale: float = 7.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The authors' solver, as the paper and their code describe it, for comparison.

    Target logits L = 1000 H + 3 n on the grid tokens (n ~ trunc-normal(0.6) where H = 0), the
    rank-d pseudo-inverse X_d+ of the grid tokens' pseudo input, M = X_d+ L X_d+^T, its rank-d SVD
    U S V^T, Q = U sqrt(S) and K = V sqrt(S) each scaled to unit Frobenius norm, then times
    `qk_scale` (7). M is never formed: with X_d = U_x S_x V_x^T, M = V_x C V_x^T with the d x d core
    C = S_x^-1 U_x^T L U_x S_x^-1, whose SVD gives M's exactly.
    """
    x = pseudo.x[num_prefix:]
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    u, v = fixed_signs(u[:, :head_dim], vh[:head_dim].T)
    s = s[:head_dim]
    maps = impulse_maps(offsets, grid).double()
    noise = torch.empty(maps.shape, dtype=torch.float64).normal_(0.0, 0.6, generator=generator).clamp_(-2.0, 2.0)
    logits = 1000.0 * maps + 3.0 * noise * (maps == 0)
    core = (u.T @ logits @ u) / s.view(-1, 1) / s.view(1, -1)
    cu, cs, cvh = torch.linalg.svd(core)
    cu, cv = fixed_signs(cu, cvh.transpose(-1, -2))
    q = v @ cu * cs.sqrt().unsqueeze(-2)
    k = v @ cv * cs.sqrt().unsqueeze(-2)
    q = q / q.norm(dim=(1, 2), keepdim=True) * qk_scale
    k = k / k.norm(dim=(1, 2), keepdim=True) * qk_scale
    # fewer grid tokens than head dimensions: M's rank is at most the token count, its other factors 0
    width = (0, head_dim - q.shape[-1])
    return torch.nn.functional.pad(q, width).float(), torch.nn.functional.pad(k, width).float()


def gain_for_fidelity(
    logits: torch.Tensor,
    target: torch.Tensor,
    valid: torch.Tensor,
    num_prefix: int,
    fidelity: float,
    shared: bool = False,
) -> torch.Tensor:
    """Per head, the factor c for which softmax(c * logits) has mean target mass `fidelity` (bisection;
    the mass grows with c as long as the target is each row's largest logit). With `shared`, one c
    for all heads, reaching `fidelity` on average over them."""
    lo = torch.zeros(1 if shared else logits.shape[0], dtype=logits.dtype)
    hi = torch.full_like(lo, 1e4)
    for _ in range(60):
        mid = (lo + hi) / 2
        mass = mean_target_mass(mid.view(-1, 1, 1) * logits, target, valid, num_prefix)
        short = (mass.mean(0, keepdim=True) if shared else mass) < fidelity
        lo, hi = torch.where(short, mid, lo), torch.where(short, hi, mid)
    return hi


def mean_target_mass(logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, num_prefix: int) -> torch.Tensor:
    """Per head, the mean softmax mass that valid grid queries put on their target key (an index
    into all T keys). logits: (heads, T, T); target, valid: (heads, N)."""
    mass = torch.softmax(logits[:, num_prefix:], dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
    return (mass * valid).sum(-1) / valid.sum(-1).clamp_min(1)


def fixed_signs(u: torch.Tensor, *others: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`u` (..., m, r) and `others` (..., n, r) with each column's sign flipped where u's largest entry
    is negative: a factorisation's columns are fixed up to sign, and LAPACK kernels differ in the signs
    they return, while the weights must not."""
    largest = u.gather(-2, u.abs().argmax(-2, keepdim=True)).sign()
    largest[largest == 0] = 1
    return u * largest, *(other * largest for other in others)


def balanced_factors(m: torch.Tensor, rank: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Factors L (..., D, r), R (..., D', r), float32, with L R^T the best rank-r approximation of m.

    L = U sqrt(S), R = V sqrt(S) as from the SVD, computed from the top r eigenpairs of m m^T (about
    twice as fast as an SVD on a CPU); R = m^T U / sqrt(S) keeps L R^T = U U^T m exact, with U's signs
    fixed. In float64: the singular values of alpha Z + beta I crowd, so float32 factors moved by 2e-5
    with a CPU's rounding, while float64 ones round to the same float32 weights on every kernel path
    measured but for a rare last bit (docs/methods.md).
    """
    rank = rank or m.shape[-2]
    m = m.double()
    evals, evecs = top_eigenpairs(lower_gram(m), rank, overwrite=True)
    (evecs,) = fixed_signs(evecs)
    root = evals.clamp_min(evals[..., :1] * 1e-12).sqrt().sqrt()  # S^(1/2)
    left = evecs * root.unsqueeze(-2)
    right = (m.transpose(-1, -2) @ evecs) / root.unsqueeze(-2)
    return left.float(), right.float()


def lower_gram(m: torch.Tensor) -> torch.Tensor:
    """The lower triangle of m m^T, all the eigenpairs read (the rest zero): the two diagonal blocks and
    the lower off-diagonal one of a 2 x 2 split, 3/4 of the product's work."""
    half = m.shape[-2] // 2
    top, bottom = m[..., :half, :], m[..., half:, :]
    gram = m.new_zeros(*m.shape[:-1], m.shape[-2])
    gram[..., :half, :half] = top @ top.transpose(-1, -2)
    gram[..., half:, :half] = bottom @ top.transpose(-1, -2)
    gram[..., half:, half:] = bottom @ bottom.transpose(-1, -2)
    return gram


def top_eigenpairs(a: torch.Tensor, rank: int, overwrite: bool = False) -> tuple[torch.Tensor, ...]:
    """The `rank` largest eigenvalues (..., r) of symmetric float64 matrices (their lower triangles read;
    with `overwrite`, spoilt) and their eigenvectors (..., n, r), largest first, by LAPACK through
    partial_eigh.py: fewer than all, only those, at float64 in the time torch's float32 eigh takes for all
    of them (docs/bench_details.md)."""
    size = a.shape[-1]
    rank = min(rank, size)
    solve = all_eigenpairs if rank == size else functools.partial(largest_eigenpairs, count=rank)
    pairs = [solve(one, overwrite=overwrite) for one in a.reshape(-1, size, size).numpy()]
    stack = np.stack if len(pairs) > 1 else lambda arrays: arrays[0][None]  # one matrix: no copy
    evals = torch.from_numpy(stack([values for values, _ in pairs])).flip(-1)
    evecs = torch.from_numpy(stack([vectors for _, vectors in pairs])).flip(-1)
    return evals.reshape(*a.shape[:-2], rank), evecs.reshape(*a.shape[:-1], rank)


def refine(
    pseudos: list[PseudoInput],
    qs: list[torch.Tensor],
    ks: list[torch.Tensor],
    scales: list[float],
    offsets: list[list[Offset]],
    grid: tuple[int, int],
    num_prefix: int,
    steps: int = 100,
    lr: float = 0.01,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The paper's Algorithm 1: Adam on || softmax(scale X Q K^T X^T) - H ||^2 over valid queries,
    from the given Q, K, batched over every head of every layer.

    Only the part of Q and K in X's row space changes the logits, so the optimisation runs in that
    r-dimensional space (r <= T), several times cheaper than in D dimensions for wide models, and in
    units of each tensor's RMS, so that `lr` is a relative step whatever the weights' scale.
    The objective sees raw logits: with q/k norms, the caller sets the norms' gain afterwards.
    """
    with torch.enable_grad():
        coords, starts, params, units, targets = [], [], [], [], []
        for pseudo, q, k, offs in zip(pseudos, qs, ks, offsets):
            qk = pseudo.right.T @ torch.cat([q, k], -1).double()  # (heads, r, 2d)
            unit = qk.pow(2).mean().sqrt()
            coords.append((pseudo.left * pseudo.values).float())  # X in the row-space basis: (T, r)
            starts.append(qk)
            params.append(torch.nn.Parameter((qk / unit).float()))
            units.append(unit)
            target, valid = target_indices(offs, grid)
            targets.append((target + num_prefix, valid))
        optimiser = torch.optim.Adam(params, lr=lr)
        for _ in range(steps):
            optimiser.zero_grad(set_to_none=True)
            loss = sum(
                _impulse_mse(c, p * float(u), s, t, v, num_prefix)
                for c, p, u, s, (t, v) in zip(coords, params, units, scales, targets)
            )
            loss.backward()
            optimiser.step()
    out_q, out_k = [], []
    for pseudo, start, p, u, q, k in zip(pseudos, starts, params, units, qs, ks):
        d = q.shape[-1]
        moved = pseudo.right @ (p.detach().double() * u - start)
        out_q.append(q.double() + moved[..., :d])
        out_k.append(k.double() + moved[..., d:])
    return out_q, out_k


def _impulse_mse(
    x: torch.Tensor, qk: torch.Tensor, scale: float, target: torch.Tensor, valid: torch.Tensor, num_prefix: int
) -> torch.Tensor:
    d = qk.shape[-1] // 2
    attn = torch.softmax(scale * (x @ qk[..., :d]) @ (x @ qk[..., d:]).transpose(-1, -2), dim=-1)[:, num_prefix:]
    onehot = torch.zeros_like(attn).scatter_(-1, target.unsqueeze(-1), 1.0)
    err = (attn - onehot).pow(2).sum(-1)
    return (err * valid).sum() / valid.sum().clamp_min(1)
