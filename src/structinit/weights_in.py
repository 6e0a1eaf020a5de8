"""Weights entering structinit, by one reader and one rule, wherever they enter: a saved init (`load_init`),
`--initial-checkpoint`, a run's last.pt on `--resume`, a `--teacher`. One reading for every format: a
checkpoint's state dict taken from it, the wrappers' prefixes (DDP's "module.", torch.compile's "_orig_mod.")
taken off every name as timm's `clean_state_dict` does, a name held both bare and prefixed refused. The
rule: dense tensors (not meta, sparse or quantized), floating where the model's are (and in any `.weight`
or `.bias`), finite and within `LARGEST`, the model's shapes, and the very weights a record's sha256 names.
A .safetensors file's header is checked (dtypes, shapes against their byte ranges and the file, size
against the memory left) before its weights are read; .pth/.pt/.bin files and timm's .pth.tar
checkpoints open with weights_only (no code runs) and memory-mapped."""

from __future__ import annotations

import argparse
import json
import math
import os
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
WRAPPERS = ("module.", "_orig_mod.")  # DDP's and torch.compile's prefixes, in either order (timm strips these)
SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
    "C64": torch.complex64,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def weights_suffix(path: Path) -> str | None:
    """The suffix of SUFFIXES that `path` ends with (in any case), or None."""
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def read_weights(path: str | Path, label: str = "", model: nn.Module | None = None) -> tuple[dict, dict[str, str]]:
    """(state dict, a .safetensors file's metadata) of the weights file `path`, which messages name as
    `label` (its role: "teacher") and its path; a training checkpoint gives the state dict it holds. Names
    are read alike in every format (`unwrapped`). With `model`, a .safetensors header that does not fit it
    is refused before its weights are read."""
    path = Path(path)
    where = f"{label} {path}" if label else str(path)
    suffix = weights_suffix(path)
    if suffix is None:
        raise ValueError(f"{where}: give weights as {', '.join(SUFFIXES)}")
    regular_file(path)
    if suffix != ".safetensors":
        state = _torch_file(path, where)
        if isinstance(state, Mapping):
            state = next((state[k] for k in STATE_KEYS if isinstance(state.get(k), Mapping)), state)
        return (unwrapped(state, where) if isinstance(state, Mapping) else state), {}
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    metadata, header = safetensors_header(path, label)
    if model is not None:
        wrong = misfits(model, header)
        if wrong:
            raise ValueError(f"{where} does not fit the model ({wrong}): {keyword_hint(model, header)}")
    nbytes = sum(t.numel() * t.element_size() for t in header.values())
    check_fits(nbytes, f"reading {path.name}", "free memory, or read it on a larger machine")
    try:
        return unwrapped(load_file(str(path)), where), metadata
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(f"{where} is not a readable .safetensors file ({first_line(error)})") from None


def unwrapped(state: Mapping, where: str) -> dict:
    """`state` with the wrappers' prefixes (WRAPPERS, in any order) taken off every name; a ValueError
    where a name is held both bare and prefixed (which of the two to load would be a guess)."""
    names: dict[str, Any] = {}
    for name in state:
        bare = str(name)
        while bare.startswith(WRAPPERS):
            bare = bare.split(".", 1)[1]
        if bare in names:
            raise ValueError(
                f"{where} holds both {names[bare]} and {name}: one tensor twice, under a wrapper's prefix "
                "(DDP's, torch.compile's) too; save the weights once"
            )
        names[bare] = name
    return {bare: state[name] for bare, name in names.items()}


def check_weights(label: str, state: Any, model: nn.Module | None = None, saved: str | None = None) -> str | None:
    """ValueError (one line) unless `state` holds weights by the module's rule: with `model`, its tensors'
    kinds and shapes; `saved`, the sha256 the weights' record names (then returned)."""
    if not isinstance(state, Mapping) or not state:
        raise ValueError(f"{label} holds no state dict (names to tensors)")
    own = model.state_dict() if model is not None else {}
    for name, tensor in state.items():
        fault, fix = _fault(tensor, own.get(name), weight=model is None and str(name).endswith((".weight", ".bias")))
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


def _fault(tensor: Any, mine: torch.Tensor | None, weight: bool) -> tuple[str, str]:
    """What is wrong with one tensor of weights entering (`weight`: a layer's weight or bias, which is
    floating in every model), and the fix; empty where nothing is."""
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
    if weight and not tensor.is_floating_point():
        return f"{tensor.dtype}, where a layer's weights are floating point", "t.float()"
    return "", ""


def _check_values(label: str, state: Mapping) -> None:
    for name, tensor in state.items():
        if tensor.is_floating_point() and tensor.numel():
            wide = tensor.detach() if tensor.dtype in COMMON_FLOATS else tensor.detach().float()  # float8: no aminmax
            low, high = torch.aminmax(wide)
            if not (float(low) >= -LARGEST and float(high) <= LARGEST):  # NaN fails both
                raise ValueError(f"{label}: {name} holds {_beyond(wide, tensor.dtype)}: not weights to train from")


def _beyond(values: torch.Tensor, dtype: torch.dtype) -> str:
    """What a tensor of `dtype` holds beyond the rule, as the file holds it: how many NaNs and infinities
    (a float16 or bfloat16 overflow is one), else its largest magnitude (its dtype's limit named as such)."""
    counts = {what: int(found.sum()) for what, found in (("NaN", values.isnan()), ("inf", values.isposinf()))}
    counts["-inf"] = int(values.isneginf().sum())
    if any(counts.values()):
        held = ", ".join(f"{count:,} {what}" for what, count in counts.items() if count)
        return f"values that are not finite ({held} of its {values.numel():,} {dtype} values)"
    worst = float(values.abs().max())
    limit = f", {dtype}'s largest value: an overflow" if worst == torch.finfo(dtype).max else ""
    return f"{worst:.3g} (beyond +-{LARGEST:g}{limit})"


def keyword_hint(model: nn.Module, state: Mapping[str, torch.Tensor]) -> str:
    """What to do about weights of another model: the keyword to save them with where the channels or the
    classes alone differ (`init vit_digits` built 3 channels for 1000 classes before 0.5.0); the prefix
    every name carries where a wrapper's other than WRAPPERS (Lightning's "model.") holds the model."""
    own, wanted, found = model.state_dict(), [], []
    for name, axis, keyword in (("patch_embed.proj.weight", 1, "in_chans"), ("head.weight", 0, "num_classes")):
        theirs, mine = state.get(name), own.get(name)
        both = theirs is not None and mine is not None and theirs.dim() == mine.dim() > axis
        if both and theirs.shape[axis] != mine.shape[axis]:
            wanted.append(f"{keyword}={mine.shape[axis]}")
            found.append(f"{keyword} {theirs.shape[axis]}")
    if wanted:
        return f"save them for this data with --model-kwargs {','.join(wanted)} (the file's: {', '.join(found)})"
    first = next(iter(own), "")
    prefix = next((name[: -len(first)] for name in state if first and name.endswith(f".{first}")), "")
    if prefix and all(prefix + name in state for name in own):
        return f"its names carry the prefix {prefix!r} before the model's: save the wrapped model's own state_dict"
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
    """(metadata, tensors on the meta device, names read as `unwrapped` reads them) of a .safetensors
    file, from its header alone (the format's 8-byte length and JSON; nothing mapped, so a file larger than
    the memory left is read too). Every entry's dtype, shape and byte range are checked against each other
    and the file before anything is allocated."""
    where = f"{label} {path}" if label else str(path)
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        length = int.from_bytes(file.read(8), "little")
        if not 2 <= length <= min(HEADER_LIMIT, size - 8):
            raise ValueError(f"{where} is not a readable .safetensors file (a header of {length:,} bytes)")
        text = file.read(length)
    try:
        header = json.loads(text)
        metadata = header.pop("__metadata__", None) or {}
        if not all(isinstance(v, str) for v in metadata.values()):
            raise TypeError("metadata values that are not text")
    except (ValueError, UnicodeDecodeError, RecursionError, AttributeError, TypeError) as error:  # JSON's too
        raise ValueError(f"{where} is not a readable .safetensors file ({first_line(error)})") from None
    data = size - 8 - length
    entries = {name: _entry(name, fields, where, data) for name, fields in header.items()}
    end = 0  # the byte ranges tile the data, in order, as the format has them
    for name, (_, start, stop) in sorted(entries.items(), key=lambda item: item[1][1:]):
        if start != end:
            raise ValueError(f"{where}: {name}'s data starts at byte {start:,} of the data, not at {end:,}: damaged")
        end = stop
    if end != data:
        raise ValueError(f"{where}: its tensors' data ends at byte {end:,}, its file's at {data:,}: damaged")
    return metadata, unwrapped({name: tensor for name, (tensor, _, _) in entries.items()}, where)


def _entry(name: str, fields: Any, where: str, data: int) -> tuple[torch.Tensor, int, int]:
    """A header entry as a meta tensor of its dtype and shape, and its byte range, checked: within the
    file's `data` bytes, and filled exactly by the shape's values (so no larger than the file)."""
    if not isinstance(fields, dict) or not {"dtype", "shape", "data_offsets"} <= fields.keys():
        raise ValueError(f"{where}: {name} is no tensor entry (a dtype, shape and data_offsets): damaged")
    kind, shape, offsets = fields["dtype"], fields["shape"], fields["data_offsets"]
    dtype = SAFETENSORS_DTYPES.get(kind) if isinstance(kind, str) else None
    if dtype is None:
        raise ValueError(f"{where}: {name} is {str(kind)[:40]}, a dtype structinit does not train from")
    counts = isinstance(shape, list) and all(type(n) is int and n >= 0 for n in shape)
    ranged = isinstance(offsets, list) and len(offsets) == 2 and all(type(n) is int for n in offsets)
    if not (counts and ranged and 0 <= offsets[0] <= offsets[1]):
        raise ValueError(f"{where}: {name} has the shape {str(shape)[:60]} and data_offsets {str(offsets)[:60]}")
    if offsets[1] > data:
        raise ValueError(f"{where}: {name}'s data_offsets {offsets} lie beyond the file's {data:,} bytes of data")
    if math.prod(shape) * dtype.itemsize != offsets[1] - offsets[0]:
        raise ValueError(
            f"{where}: {name}'s shape {str(shape)[:60]} of {kind} is not the {offsets[1] - offsets[0]:,} bytes "
            f"of its data_offsets {offsets}: damaged"
        )
    try:
        return torch.empty(shape, dtype=dtype, device="meta"), offsets[0], offsets[1]
    except (RuntimeError, TypeError, OverflowError):  # a count beyond torch's sizes beside a 0
        raise ValueError(f"{where}: {name} has the shape {str(shape)[:60]}, which torch cannot hold") from None


def _torch_file(path: Path, where: str) -> Any:
    """A torch.save archive opened with weights_only=True (timm's argparse.Namespace of settings allowed)."""
    if not zipfile.is_zipfile(path):
        raise ValueError(f"{where} is not a torch.save archive (truncated, damaged or another format)")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        raise ValueError(
            f"{where} holds Python objects beyond tensors ({first_line(error)[:80]}): structinit does not "
            "unpickle them; save its state_dict, or as .safetensors"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as error:
        raise ValueError(f"{where} is damaged ({first_line(error)})") from None
