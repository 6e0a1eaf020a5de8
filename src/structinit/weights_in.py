"""Weights entering structinit, by one reader and one rule, wherever they enter: a saved init (`load_init`),
`--initial-checkpoint`, a run's last.pt on `--resume`, a `--teacher`. The rule: dense tensors (not meta,
sparse or quantized), floating where the model's are, finite and within `LARGEST`, the model's shapes, and
the very weights a record's sha256 names. A .safetensors file's header is checked (names, shapes, dtypes,
size against the memory left) before its weights are read; .pth/.pt/.bin files and timm's .pth.tar
checkpoints open with weights_only (no code runs) and memory-mapped."""

from __future__ import annotations

import argparse
import json
import math
import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .errors import first_line
from .files import regular_file, weights_sha256
from .memory import check_fits

SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".pth.tar")  # any case: timm writes checkpoint-3.pth.tar
HEADER_LIMIT = 100_000_000  # the safetensors format's own bound on its header
LARGEST = 1e6  # a weight beyond it overflows a forward pass; trained ViTs stay within 1e3
COMMON_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
STATE_KEYS = ("state_dict", "model", "state_dict_ema")  # where timm's and structinit's checkpoints keep weights
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def weights_suffix(path: Path) -> str | None:
    """The suffix of SUFFIXES that `path` ends with (in any case), or None."""
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def read_weights(path: str | Path, label: str, model: nn.Module | None = None) -> tuple[dict, dict[str, str]]:
    """(state dict, a .safetensors file's metadata) of the weights file `path`, which `label` names in
    messages; a training checkpoint gives the state dict it holds, DDP's "module." dropped. With `model`,
    a .safetensors header that does not fit it is refused before its weights are read."""
    path = Path(path)
    suffix = weights_suffix(path)
    if suffix is None:
        raise ValueError(f"{label} {path.name}: give weights as {', '.join(SUFFIXES)}")
    regular_file(path)
    if suffix == ".safetensors":
        return _safetensors(path, label, model)
    state = _torch_file(path, label)
    if isinstance(state, Mapping):
        state = next((state[k] for k in STATE_KEYS if isinstance(state.get(k), Mapping)), state)
    if isinstance(state, Mapping):
        state = {str(name).removeprefix("module."): tensor for name, tensor in state.items()}
    return state, {}


def check_weights(label: str, state: Any, model: nn.Module | None = None, saved: str | None = None) -> str | None:
    """ValueError (one line) unless `state` holds weights by the module's rule: with `model`, its tensors'
    kinds and shapes; `saved`, the sha256 the weights' record names (then returned)."""
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"{label} holds no state dict (names to tensors)")
    own = model.state_dict() if model is not None else {}
    for name, tensor in state.items():
        fault, fix = _fault(tensor, own.get(name))
        if fault:
            raise ValueError(f"{label}: {name} is {fault}: not weights to train from (save {fix} for each tensor t)")
    if model is not None:
        wrong = misfits(model, state)
        if wrong:
            raise ValueError(f"{label} does not fit the model ({wrong}): {keyword_hint(model, state)}")
    _check_values(label, state)
    if saved is not None and saved != weights_sha256(state):
        raise ValueError(
            f"{label}: its weights are not those it was saved with (the record's sha256 {saved[:12]}... differs): "
            "the file was changed after save_init wrote it"
        )
    return saved


def _fault(tensor: Any, mine: torch.Tensor | None) -> tuple[str, str]:
    """What is wrong with one tensor of weights entering, and the fix (empty where nothing is)."""
    if not isinstance(tensor, torch.Tensor):
        return f"a {type(tensor).__name__}, not a tensor", "a tensor"
    if tensor.is_meta:
        return "on the meta device (a shape without values)", "the tensor with its values"
    if tensor.layout != torch.strided:
        return f"a sparse tensor ({tensor.layout})", "t.to_dense()"
    if tensor.is_quantized:
        return f"quantized ({tensor.dtype})", "t.dequantize()"
    if tensor.is_complex():
        return f"complex ({tensor.dtype})", "a real tensor"
    if mine is not None and mine.is_floating_point() != tensor.is_floating_point():
        return f"{tensor.dtype} where the model's is {mine.dtype}", f"t.to({mine.dtype})"
    return "", ""


def _check_values(label: str, state: Mapping) -> None:
    for name, tensor in state.items():
        if tensor.is_floating_point() and tensor.numel():
            wide = tensor.detach() if tensor.dtype in COMMON_FLOATS else tensor.detach().float()  # float8: no aminmax
            low, high = torch.aminmax(wide)
            if not (float(low) >= -LARGEST and float(high) <= LARGEST):  # NaN fails both
                worst = float(high) if math.isnan(float(high)) or abs(float(high)) > abs(float(low)) else float(low)
                what = (
                    "values that are not finite" if not math.isfinite(worst) else f"{worst:.3g} (beyond +-{LARGEST:g})"
                )
                raise ValueError(f"{label}: {name} holds {what}: not weights to train from")


def keyword_hint(model: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """What to do about weights of another model: the keyword to save them with where the channels or the
    classes alone differ (`init vit_digits` built 3 channels for 1000 classes before 0.5.0)."""
    own, wanted, found = model.state_dict(), [], []
    for name, axis, keyword in (("patch_embed.proj.weight", 1, "in_chans"), ("head.weight", 0, "num_classes")):
        theirs, mine = state.get(name), own.get(name)
        both = theirs is not None and mine is not None and theirs.dim() == mine.dim() > axis
        if both and theirs.shape[axis] != mine.shape[axis]:
            wanted.append(f"{keyword}={mine.shape[axis]}")
            found.append(f"{keyword} {theirs.shape[axis]}")
    if wanted:
        return f"save them for this data with --model-kwargs {','.join(wanted)} (the file's: {', '.join(found)})"
    return "give the weights of this model"


def misfits(model: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """The first tensors of `state` that do not fit `model` (of another shape, missing, unexpected), or ''."""
    own = model.state_dict()
    wrong = [
        f"{name} {tuple(state[name].shape)} (the model's {tuple(t.shape)})"
        for name, t in own.items()
        if name in state and state[name].shape != t.shape
    ]
    missing, extra = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
    return "; ".join(
        f"{len(items)} {what}: {', '.join(items[:3])}{', ...' if len(items) > 3 else ''}"
        for what, items in (("of another shape", wrong), ("missing", missing), ("unexpected", extra))
        if items
    )


def safetensors_header(path: Path, label: str) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    """(metadata, tensors on the meta device) of a .safetensors file, read from its header alone (the
    format's 8-byte length and JSON; nothing mapped, so a file larger than the memory left is read too)."""
    where = f"{label} {path}" if label else str(path)
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        if not 2 <= length <= HEADER_LIMIT:
            raise ValueError(f"{where} is not a readable .safetensors file (a header of {length:,} bytes)")
        text = file.read(length)
    try:
        header = json.loads(text)
        metadata = header.pop("__metadata__", None) or {}
        if not all(isinstance(v, str) for v in metadata.values()):
            raise TypeError("metadata values that are not text")
        return metadata, {name: _shaped(name, entry, where) for name, entry in header.items()}
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, AttributeError, TypeError, KeyError) as error:
        raise ValueError(f"{where} is not a readable .safetensors file ({first_line(error)})") from None


def _safetensors(path: Path, label: str, model: nn.Module | None) -> tuple[dict, dict[str, str]]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    metadata, header = safetensors_header(path, label)
    if model is not None:
        wrong = misfits(model, header)
        if wrong:
            raise ValueError(f"{label} does not fit the model ({wrong}): {keyword_hint(model, header)}")
    nbytes = sum(t.numel() * t.element_size() for t in header.values())
    check_fits(nbytes, f"reading {path.name}", "free memory, or read it on a larger machine")
    try:
        return load_file(str(path)), metadata
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{label} {path} is not a readable .safetensors file ({first_line(error)})") from None


def _shaped(name: str, entry: dict[str, Any], where: str) -> torch.Tensor:
    """A meta tensor of a safetensors header entry's dtype and shape."""
    dtype, shape = SAFETENSORS_DTYPES.get(entry["dtype"]), entry["shape"]
    if dtype is None:
        raise ValueError(f"{where}: {name} is {entry['dtype']}, a dtype structinit does not train from")
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise TypeError(f"{name} has the shape {shape!r}")
    return torch.empty(shape, dtype=dtype, device="meta")


def _torch_file(path: Path, label: str) -> Any:
    """A torch.save archive opened with weights_only=True (timm's argparse.Namespace of settings allowed)."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{label} {path} is not a torch.save archive (truncated, damaged or another format)")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{label} {path} holds Python objects beyond tensors ({first_line(error)[:80]}): structinit does not "
            "unpickle them; save its state_dict, or as .safetensors"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ValueError(f"{label} {path} is damaged ({first_line(error)})") from None
