"""Eigenpairs of a symmetric float64 matrix: the largest ones and no others, LAPACK's dsyevx (bisection
and inverse iteration for the chosen ones), the routine scipy.linalg.eigh(subset_by_index=...) calls;
or all of them, dsyevd.
It is called through scipy's table of LAPACK functions (scipy.linalg.cython_lapack) by ctypes, which
lets go of Python's lock: calls on two threads (mimetic's factorisations, threads.parallel_map) run side
by side, where through scipy's own wrapper they ran one at a time (docs/bench_details.md).
Where that table cannot be read, scipy's wrapper is used: the same numbers, one at a time. Each call runs
on one thread of scipy's OpenBLAS (the calls run side by side instead: an OpenBLAS team beside a busy core
stalled, 1.9 s a 768 x 768 call instead of 0.06 s).
"""

from __future__ import annotations

import ctypes
import functools
import threading

import numpy as np
import scipy.linalg
from scipy.linalg import cython_lapack
from threadpoolctl import ThreadpoolController

_P = ctypes.c_void_p


def largest_eigenpairs(a: np.ndarray, count: int, overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The `count` largest eigenvalues of the symmetric (n, n) float64 `a` (its lower triangle read; with
    `overwrite`, spoilt), ascending, and their eigenvectors (n, count), as
    scipy.linalg.eigh(a, subset_by_index=[n - count, n - 1], driver="evx")."""
    size = a.shape[0]
    routine = _lapack("dsyevx", 20)
    if routine is None:
        with _one_thread():
            return scipy.linalg.eigh(a.T, lower=False, subset_by_index=[size - count, size - 1], driver="evx")
    a = _buffer(a, overwrite)
    values, vectors = np.zeros(size), np.zeros((size, count), order="F")
    iwork, ifail = np.zeros(5 * size, dtype=np.int32), np.zeros(size, dtype=np.int32)
    ints = {name: ctypes.c_int(value) for name, value in dict(n=size, il=size - count + 1, iu=size).items()}
    found, info = ctypes.c_int(0), ctypes.c_int(0)
    bounds = [ctypes.c_double(0.0) for _ in range(3)]  # vl, vu (unused for a range of indices), abstol

    def call(work: np.ndarray, lwork: int) -> None:
        routine(
            *(ctypes.byref(ctypes.c_char(flag)) for flag in (b"V", b"I", b"U")),
            ctypes.byref(ints["n"]), a.ctypes.data_as(_P), ctypes.byref(ints["n"]),
            ctypes.byref(bounds[0]), ctypes.byref(bounds[1]), ctypes.byref(ints["il"]), ctypes.byref(ints["iu"]),
            ctypes.byref(bounds[2]), ctypes.byref(found), values.ctypes.data_as(_P), vectors.ctypes.data_as(_P),
            ctypes.byref(ints["n"]), work.ctypes.data_as(_P), ctypes.byref(ctypes.c_int(lwork)),
            iwork.ctypes.data_as(_P), ifail.ctypes.data_as(_P), ctypes.byref(info),
        )  # fmt: skip

    query = np.zeros(1)
    with _one_thread():
        call(query, -1)  # the workspace it wants
        call(np.zeros(max(int(query[0]), 8 * size)), max(int(query[0]), 8 * size))
    if info.value != 0 or found.value != count:
        raise np.linalg.LinAlgError(f"dsyevx failed (info {info.value}, {found.value} of {count} eigenvalues)")
    return values[:count], vectors


def all_eigenpairs(a: np.ndarray, overwrite: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every eigenvalue of the symmetric float64 `a` (its lower triangle read; with `overwrite`, spoilt),
    ascending, and its eigenvectors: LAPACK's dsyevd (divide and conquer), as scipy.linalg.eigh(a,
    driver="evd"), without the GIL."""
    size = a.shape[0]
    routine = _lapack("dsyevd", 11)
    if routine is None:
        with _one_thread():
            return scipy.linalg.eigh(a.T, lower=False, driver="evd")  # the same call as below
    a = _buffer(a, overwrite)  # overwritten by the eigenvectors, column by column
    values, n, info = np.zeros(size), ctypes.c_int(size), ctypes.c_int(0)

    def call(work: np.ndarray, lwork: int, iwork: np.ndarray, liwork: int) -> None:
        routine(
            ctypes.byref(ctypes.c_char(b"V")), ctypes.byref(ctypes.c_char(b"U")), ctypes.byref(n),
            a.ctypes.data_as(_P), ctypes.byref(n), values.ctypes.data_as(_P), work.ctypes.data_as(_P),
            ctypes.byref(ctypes.c_int(lwork)), iwork.ctypes.data_as(_P), ctypes.byref(ctypes.c_int(liwork)),
            ctypes.byref(info),
        )  # fmt: skip

    query, iquery = np.zeros(1), np.zeros(1, dtype=np.int32)
    with _one_thread():
        call(query, -1, iquery, -1)
        lwork, liwork = max(int(query[0]), 1 + 6 * size + 2 * size * size), max(int(iquery[0]), 3 + 5 * size)
        call(np.zeros(lwork), lwork, np.zeros(liwork, dtype=np.int32), liwork)
    if info.value != 0:
        raise np.linalg.LinAlgError(f"dsyevd failed (info {info.value})")
    return values, a.T


def _buffer(a: np.ndarray, overwrite: bool) -> np.ndarray:
    """`a` row by row, for LAPACK to overwrite: its column-major view is a's transpose, whose upper triangle
    ("U") is a's lower one. `a` itself where it may be (no copy of a 768 x 768 matrix a head)."""
    if overwrite and a.dtype == np.float64 and a.flags.c_contiguous and a.flags.writeable:
        return a
    return np.array(a, dtype=np.float64, order="C")


class _OneThread:
    """scipy's OpenBLAS held to one thread while any call is in flight, on any thread. Its thread count is the
    process's: a limit set and lifted a call (0.4.0) gave a call on another thread OpenBLAS's whole team each
    time a call beside it ended first (mimetic's factorisations on two threads, and OpenBLAS's team, spun on
    each other's cores)."""

    def __init__(self) -> None:
        self.lock, self.calls, self.limit = threading.Lock(), 0, None

    def __enter__(self) -> None:
        with self.lock:
            if self.calls == 0:
                self.limit = _openblas().limit(limits=1)
            self.calls += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.calls -= 1
            if self.calls == 0 and self.limit is not None:
                self.limit.restore_original_limits()
                self.limit = None


_ONE_THREAD = _OneThread()


def _one_thread() -> _OneThread:
    return _ONE_THREAD


@functools.cache
def _openblas() -> ThreadpoolController:
    return ThreadpoolController().select(internal_api="openblas")


@functools.cache
def _lapack(name: str, arguments: int) -> ctypes._CFuncPtr | None:
    """A LAPACK routine of `arguments` pointers from scipy's table, as a ctypes function (which releases
    the GIL); None where the table cannot be read."""
    try:
        capsule = cython_lapack.__pyx_capi__[name]
        api = ctypes.pythonapi
        name_of = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", api))
        pointer_of = ctypes.PYFUNCTYPE(_P, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_GetPointer", api))
        address = pointer_of(capsule, name_of(capsule))
    except (AttributeError, KeyError, ValueError, TypeError):
        return None
    return ctypes.CFUNCTYPE(None, *[_P] * arguments)(address) if address else None
