"""The memory this process can still take, and the refusal of a request that needs more before it is
allocated (a model of 10^8 classes or 10^5 blocks, an init's maps of 4096 heads, a 5 GB weights file, a
batch of 10^6 images): one line with the numbers, where the allocation itself would be a MemoryError
traceback or the kernel's kill, or minutes of work before either."""

from __future__ import annotations

import contextlib
import math
import resource
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .errors import RunError

# the tensor factories a model's constructor allocates its weights with
FACTORIES = {torch.empty, torch.zeros, torch.ones, torch.full, torch.rand, torch.randn, torch.empty_strided}
# keywords that repeat a block: ViT's and ConvMixer's depth, Swin's depths (a count per stage), MLP-Mixer's
# num_blocks, CaiT's class-attention blocks
DEPTHS = ("depth", "depths", "num_blocks", "depth_token_only")
# What an init holds beside the model, from peak memory measured on ViTs (one thread each: heads 4-256,
# tokens 65-1025, width 64-2048, depth 1-8), rounded up: bytes per entry of one layer's attention maps
# (heads x tokens^2: the report's measure 8; the impulse solves, the paper's and refine, 21-28; the
# authors' least squares 49), float64 copies of a width x width matrix for the first factorisation and
# for each further thread (mimetic 4.7, impulse 6.8), and float32 copies held for every layer (impulse
# 2.6; mimetic draws a target for each head of every layer at once: heads + 9.5 with 64 heads, of which
# 2 x heads drawing the last layer's).
MAP_BYTES, SOLVE_MAP_BYTES, AUTHORS_MAP_BYTES = 12, 32, 64
SOLVE_COPIES, THREAD_COPIES, HELD_COPIES = 8, 4, 4
BASELINES = ("timm", "kaiming")  # drawn, not solved: the report's maps alone
SOLVING = ("impulse", "qk-norm", "select")  # the paper's solve or refine may fit the maps
PER_HEAD_TARGETS = ("mimetic", "auto")  # auto: mimetic on the ViTs


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


def estimated_bytes(
    build: Callable[..., nn.Module], options: Mapping[str, Any], cost: Callable[[nn.Module], int], room: int
) -> int | None:
    """`cost` of the model `build(**options)` makes, from sketches of it (`sketched`): with each block count
    of DEPTHS over 2 set to 1, the cost bounded from above (no block costs more than that model, which holds
    one of each) and, where the bound is over `room`, with each count in turn set to 2, extrapolated exactly
    to the counts asked; milliseconds however deep the model is asked to be. None where a sketch cannot be
    built (the model's own build then says why)."""
    counts = [(key, index, n) for key, index, n in _block_counts(options) if n > 2]
    cut = _recounted(options, [(key, index, 1) for key, index, _ in counts])
    try:
        base = cost(sketched(build, cut))
        bound = base * (1 + sum(n - 1 for *_, n in counts))
        if bound <= room:
            return bound
        grown = [cost(sketched(build, _recounted(cut, [(key, index, 2)]))) for key, index, _ in counts]
    except Exception:  # whatever stops a sketch stops the build too, which then says why in its own words
        return None
    return base + sum((n - 1) * max(0, more - base) for (_, _, n), more in zip(counts, grown))


def sketched(build: Callable[..., nn.Module], options: Mapping[str, Any]) -> nn.Module:
    """The model `build(**options)` makes, with its tensors on the meta device and their values never
    drawn: its sizes alone, in a fraction of a real build's time; torch's random state left as it was."""
    with torch.random.fork_rng(devices=[]), _Sketch():
        return build(**options)


def model_bytes(model: nn.Module) -> int:
    """The bytes of a model's parameters and buffers."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def init_work(layers: list[tuple[int, int, int]], method: str, solver: str | None = None) -> int:
    """The bytes init `method` (with `solver`, impulse's) holds beside the model it initialises, whose
    attention layers are (heads, tokens, width): one layer's maps, the width x width factorisations of
    every thread at once, and what it keeps of every layer (the constants above)."""
    if not layers:
        return 0
    per_entry = AUTHORS_MAP_BYTES if solver == "authors" else SOLVE_MAP_BYTES if method in SOLVING else MAP_BYTES
    maps = per_entry * max(heads * tokens**2 for heads, tokens, _ in layers)
    if method in BASELINES:
        return maps
    widest = max(width for *_, width in layers)
    solves = (SOLVE_COPIES + THREAD_COPIES * (torch.get_num_threads() - 1)) * widest**2 * 8
    targets = method in PER_HEAD_TARGETS  # every head's target kept; a layer's drawn as a sample and its scaling
    held = sum((HELD_COPIES + heads * targets) * width**2 * 4 for heads, _, width in layers)
    drawn = targets * max(2 * heads * width**2 * 4 for heads, _, width in layers)
    return maps + solves + held + drawn


def _block_counts(options: Mapping[str, Any]) -> Iterator[tuple[str, int | None, int]]:
    """(keyword, index in its sequence or None, count) of each block count that `options` sets."""
    for key in DEPTHS:
        value = options.get(key)
        if type(value) is int:
            yield key, None, value
        elif isinstance(value, list | tuple) and all(type(n) is int for n in value):
            yield from ((key, index, n) for index, n in enumerate(value))


def _recounted(options: Mapping[str, Any], counts: list[tuple[str, int | None, int]]) -> dict[str, Any]:
    """`options` with the block counts `counts` set in them."""
    changed = dict(options)
    for key, index, n in counts:
        value = changed[key]
        changed[key] = n if index is None else type(value)(n if i == index else m for i, m in enumerate(value))
    return changed


class _Sketch(TorchFunctionMode):
    """Within it, the factories make meta tensors and the in-place draws and fills that would give them
    values are skipped (torch's meta kernels for them cost more than a real build of a small model)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func in FACTORIES:
            return func(*args, **{**kwargs, "device": "meta"})
        name = getattr(func, "__name__", "")
        if name.endswith("_") and not name.startswith("_") and args and getattr(args[0], "is_meta", False):
            return args[0]
        return func(*args, **kwargs)


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
