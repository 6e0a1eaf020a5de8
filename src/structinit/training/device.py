"""Where a run computes: its device, its autocast precision and its processes (torchrun, DDP)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def distributed_processes() -> Dist:
    """The processes torchrun describes in the environment (RANK, WORLD_SIZE, LOCAL_RANK), checked
    before any work: integers, ranks below the world size. One process (no WORLD_SIZE, or 1) is rank 0:
    a RANK or LOCAL_RANK other than 0 there (a leftover of torchrun) is refused, as it would make the
    only process a silent one that is not the main one."""
    values = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        text = os.environ.get(name)
        if text is None:
            continue
        try:
            values[name] = int(text)
        except ValueError:
            raise ValueError(f"the environment sets {name}={text!r}, not an integer (torchrun sets it)") from None
    world, rank, local = values.get("WORLD_SIZE", 1), values.get("RANK", 0), values.get("LOCAL_RANK", 0)
    if world < 1:
        raise ValueError(f"the environment sets WORLD_SIZE={world}: the processes of a run are 1 or more")
    if world == 1 and (rank or local):
        raise ValueError(
            f"the environment sets RANK={rank}, LOCAL_RANK={local} but no WORLD_SIZE above 1: a run of one "
            "process is rank 0; unset them (torchrun sets all three for the processes it starts)"
        )
    if world > 1 and "RANK" not in values:
        raise ValueError(f"the environment sets WORLD_SIZE={world} but no RANK: start the processes with torchrun")
    if not (0 <= rank < world and 0 <= local < world):
        raise ValueError(f"the environment sets RANK={rank}, LOCAL_RANK={local}: each must lie in 0..{world - 1}")
    return Dist(rank, world, local)


def setup_distributed(device: torch.device, processes: Dist) -> Dist:
    """Join the process group of `processes` (distributed_processes) where there are several (gloo on
    CPU, nccl on CUDA)."""
    if processes.world == 1:
        return processes
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(dist.get_rank(), dist.get_world_size(), processes.local_rank)


def resolve_device(name: str, local_rank: int) -> torch.device:
    if name != "auto":
        try:
            device = torch.device(name)
        except RuntimeError:
            raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps") from None
        if device.type not in ("cpu", "cuda", "mps"):
            raise ValueError(f"--device {name!r}: expected auto, cpu, cuda, cuda:N or mps")
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {name}: PyTorch sees no CUDA GPU here; use --device cpu (or auto)")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: there are {torch.cuda.device_count()} CUDA GPUs")
        if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ValueError(f"--device {name}: MPS is not available here; use --device cpu (or auto)")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank)
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def resolve_amp(amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype: bf16 on CPUs with AVX-512/AMX and on CUDA with bf16, fp16 on other GPUs."""
    if amp == "none":
        return None
    if amp == "bf16":
        return torch.bfloat16
    if amp == "fp16":
        return torch.float16
    if amp != "auto":
        raise ValueError(f"amp must be auto, bf16, fp16 or none, got {amp!r}")
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        return torch.bfloat16 if capability.startswith(("AVX512", "AMX")) else None
    return None


def prefer_math_attention(model: nn.Module, device: torch.device, amp_dtype: torch.dtype | None) -> None:
    """On CPU under bf16 autocast, timm's attention runs faster unfused: torch's CPU
    scaled_dot_product_attention has no fast bf16 path for short sequences of small heads
    (2.4x faster with 12 heads of dimension 16: benchmarks/bench_train.py). Same maths."""
    if device.type == "cpu" and amp_dtype == torch.bfloat16:
        for module in model.modules():
            if isinstance(getattr(module, "fused_attn", None), bool):
                module.fused_attn = False


def all_reduce_sum(value: torch.Tensor, world: Dist) -> torch.Tensor:
    if world.world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity where the system has one), as torch's DataLoader
    counts them."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1
