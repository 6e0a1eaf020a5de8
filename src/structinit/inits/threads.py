"""The init's many small factorisations, side by side: each op on one torch thread, as many at once
as torch had threads (survives a busy machine; the numbers do not depend on the thread count)."""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .progress import announce_pool

# the threads torch had before one_torch_thread: parallel_map's pool size
_WORKERS: contextvars.ContextVar[int | None] = contextvars.ContextVar("init_workers", default=None)


@contextlib.contextmanager
def one_torch_thread():
    """Run torch ops with one intra-op thread; parallel_map runs as many at once as torch had threads."""
    before = torch.get_num_threads()
    token = _WORKERS.set(before)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        _WORKERS.reset(token)


def available_threads() -> int:
    """The threads torch had before one_torch_thread (or has): how many single-threaded ops to run at once."""
    return _WORKERS.get() or torch.get_num_threads()


def parallel_map(function: Callable[[Any], Any], items: Iterable[Any], *, task: str | None = None) -> list[Any]:
    """`function` over `items` in a pool of threads, each op inside on one torch thread. A generator's
    items are worked on as it yields them (mimetic's draws overlap its factorisations). Where `task` names
    the work, it is announced if the first result says the whole takes over 2 s (progress.py).

    The init's factorisations are many independent small ones: one OpenMP team splitting each of
    them stalls at every barrier when another process holds the cores (ViT-B impulse 4.6 s instead
    of 1.9 s beside a busy process), while independent single-threaded ops just share the cores.
    One thread per op also makes the init's numbers independent of torch's thread count."""
    workers = max(1, available_threads())
    # a new thread starts at the process's default thread count, not the caller's one: without this each
    # worker's LAPACK call ran on every core beside the others, and its result depended on who won
    # (scipy's BLAS, partial_eigh.py, holds itself to one thread a call)
    with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        started = time.perf_counter()
        futures = [pool.submit(function, item) for item in items]
        if task is not None and futures:
            announce_pool(futures, task, started, workers)
        return [future.result() for future in futures]
