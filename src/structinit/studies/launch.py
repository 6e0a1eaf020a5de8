"""A grid's runs as cluster jobs, through submitit: SLURM, or `local` processes to try a set-up.

Why submitit: it is how timm, DeiT and ConvNeXt users send training to SLURM, and it already does the
job scripts, job arrays, logs, and requeueing on timeout or preemption. structinit only says what one
job is: train one run, and when SLURM stops it, be requeued to resume from the run's last checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import shutil
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RunError, one_line_warning, quiet_notices
from ..version import DISTRIBUTION

if TYPE_CHECKING:
    from ..training.settings import TrainConfig

CLUSTERS = ("slurm", "local")


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where and with what each run of a grid is a job. `parallel`: at most that many jobs at once
    (a SLURM array's %K; None: as the scheduler allows). `slurm_args`: further #SBATCH settings, such
    as {"account": "abc", "qos": "high", "constraint": "a100"}."""

    kind: str = "slurm"
    partition: str | None = None
    timeout_min: int = 24 * 60
    gpus_per_run: int = 1
    cpus_per_run: int = 8
    mem_gb: float | None = None
    parallel: int | None = None
    slurm_args: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in CLUSTERS:
            raise ValueError(f"cluster must be one of {', '.join(CLUSTERS)}, got {self.kind!r}")
        for name in ("timeout_min", "cpus_per_run"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.gpus_per_run < 0:
            raise ValueError(f"gpus_per_run must be 0 or more, got {self.gpus_per_run}")
        if self.parallel is not None and self.parallel < 1:
            raise ValueError(f"parallel must be at least 1, got {self.parallel}")

    def submitit(self) -> Any:
        """The submitit module, or one line saying what this machine lacks for these jobs."""
        try:
            import submitit
        except ImportError:
            raise RunError(f"--cluster needs submitit: pip install '{DISTRIBUTION}[cluster]'") from None
        if self.kind == "slurm" and shutil.which("srun") is None:  # what submitit looks for
            raise RunError(
                "--cluster slurm needs SLURM, and this machine has no srun on its PATH: run the command on the "
                "cluster's login node, or try the grid here with --cluster local"
            )
        return submitit

    def executor(self, folder: Path) -> Any:
        """A submitit executor for these settings, writing job scripts and logs under `folder`."""
        executor = self.submitit().AutoExecutor(folder, cluster=self.kind)
        parameters: dict[str, Any] = {
            "name": "structinit",
            "timeout_min": self.timeout_min,
            "cpus_per_task": self.cpus_per_run,
            "gpus_per_node": self.gpus_per_run,
            "tasks_per_node": 1,
            "nodes": 1,
        }
        if self.mem_gb is not None:
            parameters["mem_gb"] = self.mem_gb
        if self.kind == "slurm":
            parameters["slurm_partition"] = self.partition
            parameters["slurm_array_parallelism"] = self.parallel or 256  # submitit's default
            parameters["slurm_additional_parameters"] = dict(self.slurm_args)
            parameters = {k: v for k, v in parameters.items() if v is not None}
        executor.update_parameters(**parameters)
        return executor


class TrainJob:
    """One run of a grid in a process of its own (a --parallel worker or a cluster job): train it on
    `threads` torch threads, quietly, resuming from its checkpoint if it has one. When SLURM times the
    job out or preempts it, submitit calls `checkpoint` and requeues the job, which then resumes from
    the run's last epoch."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def __call__(self, config: TrainConfig) -> dict[str, Any]:
        import torch

        from ..training.run import train

        torch.set_num_threads(self.threads)
        resume = (Path(config.out) / "last.pt").exists()
        with quiet_notices(config.quiet):  # the grid's quiet; the run's own (no bar) always
            return train(dataclasses.replace(config, resume=resume, quiet=True))

    def checkpoint(self, config: TrainConfig) -> Any:
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(TrainJob(self.threads), config)


class LocalJob(TrainJob):
    """A --parallel worker's run, in a pool of `local_workers`. The grid stops its workers by setting
    their stop event, then sending SIGTERM: a run is interrupted once and cleans up (its lock, temporary
    files) undisturbed by a second signal, and no run starts after. A worker ignores Ctrl-C, and SIGTERM
    between runs: it ends when the grid closes the pool, without a traceback."""

    def __call__(self, config: TrainConfig) -> dict[str, Any]:
        signal.signal(signal.SIGTERM, _interrupt_once)
        try:
            if _STOP is not None and _STOP.is_set():
                raise KeyboardInterrupt
            return super().__call__(config)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)


def local_workers(count: int) -> tuple[ProcessPoolExecutor, Any]:
    """A pool of `count` processes for LocalJob runs (spawned: no forked torch thread pools), and the
    event that tells them the grid is stopping. Submit to it under `new_processes_ignore_signals`."""
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    return ProcessPoolExecutor(count, mp_context=context, initializer=_start_worker, initargs=(stop,)), stop


@contextlib.contextmanager
def new_processes_ignore_signals() -> Iterator[None]:
    """Processes started inside (a pool starts its workers as work is submitted) begin with Ctrl-C and
    SIGTERM ignored, as an ignored signal stays ignored in a new program; a signal to this process in
    these milliseconds is lost. Only the main thread sets handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


_STOP: Any = None  # in a --parallel worker: the grid's event that it is stopping
_STOPPED: list[int] = []  # the signal that stopped this worker's run


def _start_worker(stop: Any) -> None:
    """A worker keeps the grid's stop event, and shows structinit's warnings as the command does."""
    global _STOP
    _STOP = stop
    warnings.formatwarning = one_line_warning


def _interrupt_once(signum: int, frame: Any) -> None:
    if not _STOPPED:
        _STOPPED.append(signum)
        raise KeyboardInterrupt


def run_on_cluster(
    configs: list[TrainConfig],
    cluster: Cluster,
    folder: Path,
    threads: int | None,
    on_done: Callable[[TrainConfig, dict[str, Any]], None],
    poll: Callable[[], None] = lambda: None,
) -> None:
    """Submit every config as one job (a job array on SLURM), each training on `threads` torch threads
    (default: its CPUs), and wait for them all, calling `on_done` as each finishes and `poll` between
    checks. The first failed job stops the wait with its log named; the jobs still queued or running
    carry on (their runs resume or skip on the next call)."""
    executor = cluster.executor(folder)
    jobs = executor.map_array(TrainJob(threads or cluster.cpus_per_run), configs)
    pending = dict(zip(jobs, configs))
    while pending:
        for job in [job for job in pending if job.done()]:
            config = pending.pop(job)
            error = job.exception()
            if error is not None:
                raise RunError(
                    f"job {job.job_id} ({config.out}) failed; its log: {job.paths.stderr}\n{error}"
                ) from None
            on_done(config, job.result())
        poll()
        if pending:
            time.sleep(1.0)
