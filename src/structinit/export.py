"""The init as a file: weights that timm's `load_checkpoint` (and so train.py's
`--initial-checkpoint`), `model.load_state_dict` and other trainers take.

`.safetensors` files carry a record as metadata: how to build the model again (its timm name and
keywords, the preset it came from) and the init (method, seed, options, structinit version, the
weights' sha256); `load_init` builds the model from that record and loads the weights. `.pth`/`.pt`
files hold the bare state dict, which is what `model.load_state_dict(torch.load(path))` expects.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .adapters import unwrap
from .errors import first_line
from .files import atomic_save, refuse_replacing, regular_file, weights_sha256
from .models import check_model_kwargs, constructor, create_model, shape_model
from .report import Report
from .weights_in import check_weights, misfits, read_weights, safetensors_header, weights_suffix

SUFFIXES = (".safetensors", ".pth", ".pt")


def check_init_path(path: str | Path) -> Path:
    """`path` if save_init can write there, else a ValueError that names the fix (before any work)."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise ValueError(f"save the init as one of {', '.join(SUFFIXES)}, got {path.name!r}")
    if path.is_dir():
        raise ValueError(f"{path} is a directory: give a file name, e.g. {path / ('init' + SUFFIXES[0])}")
    if not path.parent.is_dir():
        above = next((p for p in path.parents if p.exists()), None)
        if above is not None and not above.is_dir():  # a file on the way, not a missing folder
            raise ValueError(f"{above} is a file, not a folder: {path} cannot be written under it")
        raise ValueError(f"{path.parent} does not exist: create it first")
    return path


def save_init(
    model: nn.Module,
    path: str | Path,
    report: Report | None = None,
    *,
    model_kwargs: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> str:
    """Write `model`'s weights (unwrapped from torch.compile/DDP) to `path` and return their sha256.

    A `.safetensors` file records how to build the model again: its timm name and keywords, which a
    `report` of `build_model` holds; for a model built in Python, give the keywords it was built with
    as `model_kwargs`. A record that load_init could not build this model from (no name or keywords,
    keywords JSON cannot hold, another shape) is refused before anything is written (a `.pt` file holds
    the bare weights). Pass the `Report` that `initialize` returned to record the init too. An existing
    file is replaced only with `overwrite=True`."""
    path = check_init_path(path)
    refuse_replacing(path)
    if path.exists() and not overwrite:
        raise ValueError(f"{path} exists: give another file, or overwrite=True to replace it")
    model = unwrap(model)
    # own, contiguous CPU copies: safetensors refuses tensors that share storage
    state = {name: t.detach().cpu().contiguous().clone() for name, t in model.state_dict().items()}
    digest = weights_sha256(state)
    if path.suffix == ".safetensors":
        from safetensors.torch import save

        built = report.constructor if report is not None and report.constructor else constructor(model, model_kwargs)
        check_rebuildable(built, state)
        metadata = {"format": "pt", "weights_sha256": digest, **_record(report, built)}
        write = lambda tensors, f: f.write(save(tensors, metadata=metadata))  # noqa: E731
    else:
        write = None
    try:
        atomic_save(state, path, write=write, new=not overwrite)
    except FileExistsError:
        raise ValueError(f"{path} exists (written meanwhile): give another file, or overwrite=True") from None
    return digest


def check_rebuildable(built: dict[str, Any], state: dict[str, torch.Tensor]) -> None:
    """ValueError unless load_init can build, from `built` (models.constructor's record), a model that
    `state` fits: a timm name or preset, keywords that JSON keeps as they are, the same tensors and shapes."""
    missing = [what for what, keys in MISSING if not set(keys) & set(built)]
    if missing:
        raise ValueError(
            f"the record would lack {' and '.join(missing)} it was built with, and load_init could not rebuild it: "
            f"{MISSING_FIX} (or save it as .pt: the bare weights)"
        )
    kwargs = dict(built.get("kwargs", {}))
    kept = json.loads(json.dumps(kwargs, default=repr))
    changed = sorted(key for key in kwargs if kept.get(key) != kwargs[key] and not isinstance(kwargs[key], tuple))
    if changed:
        raise ValueError(
            f"model_kwargs {', '.join(changed)}: {changed[0]}={kwargs[changed[0]]!r} cannot be recorded as text "
            "(give values that are numbers, text, lists or None; or save it as .pt: the bare weights)"
        )
    try:
        rebuilt = shape_model(built.get("model") or built["preset"], kwargs)
    except (TypeError, ValueError, RuntimeError, KeyError) as error:
        raise ValueError(f"load_init could not build the model from its record ({first_line(error)})") from None
    wrong = misfits(rebuilt, state)
    if wrong:
        raise ValueError(
            f"the record builds another model than these weights ({wrong}): give the keywords it was built with"
        )


def _record(report: Report | None, built: dict[str, Any]) -> dict[str, str]:
    from .version import __version__

    record: dict[str, Any] = {"structinit": __version__}
    if report is not None:
        record.update(method=report.method, seed=report.seed, options=report.options)
        record.update(report.source)
        record["mean_fidelity"] = report.mean_fidelity
    record.update({MODEL_KEYS.get(key, key): value for key, value in built.items()})
    return {key: value if isinstance(value, str) else json.dumps(value, default=str) for key, value in record.items()}


# the record's keys for models.constructor's, and what a record lacks without them
MODEL_KEYS = {"class": "model_class", "kwargs": "model_kwargs"}
MISSING = (("the timm name", ("model", "preset")), ("the keywords", ("kwargs",)))
MISSING_FIX = "build it by name with timm.create_model and give save_init(..., model_kwargs=...) its keywords"


def read_record(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The record of an init that save_init wrote as .safetensors (JSON values decoded) and its tensors on
    the meta device, read from its header alone."""
    path = Path(path)
    if weights_suffix(path) != ".safetensors":
        raise ValueError(
            f"{path.name} holds bare weights with no record of the model: load it into the model it was made for "
            "(model.load_state_dict(torch.load(path))), or save the init as .safetensors"
        )
    regular_file(path)
    record, header = safetensors_header(path, "")
    return decoded(path, record), header


def decoded(path: Path, record: dict[str, str]) -> dict[str, Any]:
    """A .safetensors record with the values save_init wrote as JSON decoded."""
    try:
        return {key: json.loads(value) if key in JSON_KEYS else value for key, value in record.items()}
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} has a damaged record (not JSON where JSON belongs: {error})") from None
    except RecursionError:
        raise ValueError(f"{path} has a damaged record (nested too deep to read)") from None


JSON_KEYS = ("seed", "options", "mean_fidelity", "model_kwargs")  # what _record writes as JSON; the rest is text


def saved_sha256(path: Path, record: dict[str, Any]) -> str | None:
    """The sha256 of the weights a record names: every record save_init writes holds one, so a record
    of structinit's without it (or with another value than a digest) was edited."""
    if "structinit" not in record:
        return None  # a .safetensors file of another tool: its weights are checked, not its digest
    saved = record.get("weights_sha256")
    if not isinstance(saved, str) or len(saved) != 64:
        raise ValueError(f"{path}: its record lacks the weights' sha256 that save_init writes: the record was edited")
    return saved


def load_init(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The model a .safetensors init was saved from, built again from its record alone (through
    `create_model`: timm's name and keywords, or the preset's class) and loaded with the file's weights
    (strict); returns (model, record). The weights are checked as weights_in says (the record's model
    fits them, read from the header before any weight is; finite; the sha256 the record holds).
    A ValueError names the fault."""
    path = Path(path)
    record, header = read_record(path)
    kwargs, name = record.get("model_kwargs"), record.get("model") or record.get("preset")
    if not isinstance(kwargs, dict) or not isinstance(name, str):
        lacks = record.get("missing") or (
            "written by structinit before 0.2, which kept no record" if "structinit" not in record else "damaged"
        )
        raise ValueError(f"{path} does not record how to build its model ({lacks})")
    saved = saved_sha256(path, record)
    blocks = {name.split(".")[1] for name in header if name.startswith("blocks.")}
    if isinstance(kwargs.get("depth"), int) and blocks and kwargs["depth"] != len(blocks):
        raise ValueError(
            f"{path}: its record asks for depth {kwargs['depth']} and its weights hold {len(blocks)} blocks: "
            "the record is damaged"
        )
    try:
        check_model_kwargs(kwargs, f"{path}: its record's model_kwargs")
        shape = shape_model(name, dict(kwargs))  # on the meta device: no memory, no weights drawn
    except (TypeError, ValueError, RuntimeError, KeyError) as error:
        raise ValueError(f"{path}: its record builds no model ({first_line(error)}): the record is damaged") from None
    wrong = misfits(shape, header)
    if wrong:
        raise ValueError(f"{path}: its weights do not fit the model its record builds ({wrong})")
    state, _ = read_weights(path)
    check_weights(str(path), state, shape, saved)
    kwargs = dict(kwargs)
    classes, channels = kwargs.pop("num_classes", 1000), kwargs.pop("in_chans", 3)  # timm's defaults
    model = create_model(name, num_classes=classes, in_chans=channels, data_size=None, **kwargs)
    model.load_state_dict(state)
    return model, record


def load_weights(model: nn.Module, path: str | Path) -> str:
    """Load the weights of `path` into `model` (strict; a saved init, a bare state dict, or a training
    checkpoint of timm's or structinit's holding one) and return their sha256. They are checked as
    weights_in says (a saved init's digest included); a ValueError names the fault, the model unchanged."""
    path = Path(path)
    state, metadata = read_weights(path, model=unwrap(model))
    saved = saved_sha256(path, decoded(path, metadata)) if metadata else None
    digest = check_weights(str(path), state, unwrap(model), saved) or weights_sha256(state)
    unwrap(model).load_state_dict(state)
    return digest
