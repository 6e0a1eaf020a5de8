"""Where a run ran: the device and autocast dtype that `auto` resolved to, the processes, the
machine, and the versions of the libraries, recorded in config.yaml under `environment` (settings
say what was asked, this says what it became: CPU figures differ between CPUs, bf16 or fp32)."""

from __future__ import annotations

import platform
import sys
from typing import Any

import torch

# config.yaml's key for this record; a reader of settings leaves it out
ENVIRONMENT = "environment"


def environment(device: torch.device, amp_dtype: torch.dtype | None, world_size: int) -> dict[str, Any]:
    import timm

    from ..version import __version__

    return {
        "device": str(device),
        "device_name": device_name(device),
        "amp_dtype": str(amp_dtype).removeprefix("torch.") if amp_dtype is not None else "float32",
        "world_size": world_size,
        "torch_threads": torch.get_num_threads(),
        "structinit": __version__,
        "torch": str(torch.__version__),
        "timm": str(timm.__version__),
        "python": platform.python_version(),
        "platform": f"{sys.platform} {platform.machine()}",
    }


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model name with its vector capability (which decides bf16 or fp32)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"
    return device.type


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
