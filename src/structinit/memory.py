"""The memory this process can still take, and the refusal of a request that needs more before it is
allocated (a model of 10^8 classes, a 5 GB weights file, a batch of 10^6 images): one line with the
numbers, where the allocation itself would be a MemoryError traceback or the kernel's kill."""

from __future__ import annotations

import contextlib
import math
import resource
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from .errors import RunError

# the tensor factories a model's constructor allocates its weights with
FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.empty_strided}


def available_bytes() -> int | None:
    """The bytes this process can still allocate: the least of the machine's available memory, the
    address space its limit (ulimit -v) leaves, and its cgroup's room; None where none is known."""
    room = [_meminfo("MemAvailable")]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        used = _status("VmSize")
        room.append(soft - used if used is not None else None)
    limit, current = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and current is not None:
        room.append(limit - current)
    known = [r for r in room if r is not None]
    return max(0, min(known)) if known else None


def check_fits(nbytes: int, what: str, fix: str) -> None:
    """RunError (one line, the numbers) where `what` needs more than `available_bytes()`."""
    room = available_bytes()
    if room is not None and nbytes > room:
        raise RunError(
            f"{what} needs {size_text(nbytes)} of memory, and this process can have {size_text(room)}: {fix}"
        )


def check_images_fit(splits: list[torch.Tensor], size: int) -> None:
    """RunError where `splits` of images resized to `size` x `size` would not fit: the resized uint8
    images, and one split at a time in float32 while resizing."""
    count, channels = sum(len(x) for x in splits), splits[0].shape[1]
    check_fits(
        channels * size * size * (count + 4 * max(len(x) for x in splits)),
        f"--img-size {size}: {count:,} images of {channels}x{size}x{size} in memory",
        "give a smaller --img-size",
    )


def size_text(nbytes: float) -> str:
    """Bytes as people read them: 77.0 GB, 512.0 MB."""
    units = ("bytes", "KB", "MB", "GB", "TB", "PB")
    power = min(len(units) - 1, int(math.log(max(nbytes, 1), 1000)))
    return f"{nbytes / 1000**power:.1f} {units[power]}" if power else f"{int(nbytes)} bytes"


@contextlib.contextmanager
def allocations_checked(what: str, fix: str) -> Iterator[None]:
    """Within it, the tensors factories (torch.empty, zeros, ...) allocate in the CPU's memory are counted
    against the room left when it began: the one that would take the total past it is refused (`check_fits`'s
    line) before torch allocates it, whether one huge tensor or a great many small ones."""
    with _FactoryGuard(what, fix, available_bytes()):
        yield


class _FactoryGuard(TorchFunctionMode):
    def __init__(self, what: str, fix: str, room: int | None) -> None:
        super().__init__()
        self.what, self.fix, self.room, self.total = what, fix, room, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in FACTORIES and self.room is not None:
            nbytes = _factory_bytes(args, kwargs) or 0
            self.total += nbytes
            if self.total > self.room:
                values = (
                    f"a tensor of {nbytes // _itemsize(kwargs):,} values" if nbytes > self.room // 2 else "its tensors"
                )
                have = size_text(self.room)
                raise RunError(
                    f"{self.what} ({values}) needs {size_text(self.total)} of memory or more, and this process "
                    f"can have {have}: {self.fix}"
                )
        return func(*args, **kwargs)


def _factory_bytes(args: tuple, kwargs: dict) -> int | None:
    device = kwargs.get("device") or torch.get_default_device()
    if torch.device(device).type != "cpu":
        return None
    shape = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)) else args
    if not shape or not all(isinstance(n, int) for n in shape):
        return None
    return math.prod(shape) * _itemsize(kwargs)


def _itemsize(kwargs: dict) -> int:
    return (kwargs.get("dtype") or torch.get_default_dtype()).itemsize


def _meminfo(key: str) -> int | None:
    return _field(Path("/proc/meminfo"), key)


def _status(key: str) -> int | None:
    return _field(Path("/proc/self/status"), key)


def _field(path: Path, key: str) -> int | None:
    """A `key: N kB` line of a /proc file, in bytes."""
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def _read_int(path: str) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(Path(path).read_text().strip())
    return None
