"""The eigenpairs behind mimetic's factors (inits/partial_eigh.py), and the finiteness check every init
ends with: the same numbers as the slower ways, in less time."""

import ctypes

import numpy as np
import pytest
import torch

from structinit.inits import partial_eigh
from structinit.inits.api import _finite
from structinit.inits.partial_eigh import all_eigenpairs, largest_eigenpairs


def symmetric(size, seed=0):
    x = np.random.default_rng(seed).standard_normal((size, size))
    return x @ x.T


@pytest.mark.parametrize("count", [1, 7, 40])
def test_the_largest_eigenpairs_are_torchs_largest(count):
    a = symmetric(60)
    values, vectors = largest_eigenpairs(a, count)
    expected_values, expected_vectors = torch.linalg.eigh(torch.from_numpy(a))
    assert np.allclose(values, expected_values[-count:].numpy(), rtol=1e-12, atol=1e-10)
    overlap = np.abs(np.sum(vectors * expected_vectors[:, -count:].numpy(), axis=0))  # each vector, up to its sign
    assert np.allclose(overlap, 1.0, atol=1e-9)


def test_all_eigenpairs_are_torchs():
    a = symmetric(50, seed=1)
    values, vectors = all_eigenpairs(a)
    expected_values, _ = torch.linalg.eigh(torch.from_numpy(a))
    assert np.allclose(values, expected_values.numpy(), rtol=1e-12, atol=1e-10)
    assert np.allclose(vectors @ np.diag(values) @ vectors.T, a, atol=1e-9)


def test_without_scipys_table_scipys_wrapper_gives_the_same_bits(monkeypatch):
    a = symmetric(40, seed=2)
    direct = largest_eigenpairs(a, 5), all_eigenpairs(a)
    monkeypatch.setattr(partial_eigh, "_lapack", lambda name, arguments: None)
    wrapped = largest_eigenpairs(a, 5), all_eigenpairs(a)
    for (v1, w1), (v2, w2) in zip(direct, wrapped):
        assert np.array_equal(v1, v2) and np.array_equal(np.abs(w1), np.abs(w2))


def test_the_routines_are_called_through_ctypes():
    """ctypes, unlike scipy's wrapper, runs two calls side by side (mimetic's workers: docs/bench_details.md);
    scipy's table holds both routines."""
    for name, arguments in (("dsyevx", 20), ("dsyevd", 11)):
        routine = partial_eigh._lapack(name, arguments)
        assert isinstance(routine, ctypes._CFuncPtr) and len(routine.argtypes) == arguments


def test_an_eigen_failure_is_an_error_not_a_wrong_answer():
    a = symmetric(10)
    a[0, 0] = np.nan
    with pytest.raises(np.linalg.LinAlgError):
        largest_eigenpairs(a, 3)


def test_finite_finds_every_nan_and_infinity_and_nothing_else():
    weights = torch.randn(1000)
    assert _finite(weights)
    for bad in (float("nan"), float("inf"), -float("inf")):
        spoilt = weights.clone()
        spoilt[17] = bad
        assert not _finite(spoilt)
    both = weights.clone()
    both[3], both[4] = float("inf"), -float("inf")  # a sum of NaN
    assert not _finite(both)
    assert _finite(torch.full((10,), 3e38))  # finite, though their float32 sum overflows
