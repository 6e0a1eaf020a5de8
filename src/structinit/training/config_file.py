"""A run's config.yaml (and a --config file) read back as settings: older versions' keys folded into
today's, damage named in one line."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from ..errors import RunError
from ..files import regular_file
from ..inits.labels import KERNEL_SIZE, InitSpec, with_options
from ..schema import Schema, check, integer, text
from .provenance import ENVIRONMENT
from .setting import check_value
from .settings import SETTINGS, TrainConfig
from .settings_yaml import SettingsError, load_yaml, read_settings_text

FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
# where a run ran (provenance.environment), under config.yaml's `environment` and in a log's environment events;
# every field optional: older versions recorded fewer
ENVIRONMENT_RECORD = Schema(
    {
        **dict.fromkeys(("device", "device_name", "amp_dtype"), text(optional=True)),
        **dict.fromkeys(("world_size", "torch_threads"), integer(1, optional=True)),
        **dict.fromkeys(("structinit", "torch", "timm", "python", "platform"), text(optional=True)),
    }
)


def config_values(values: Any, source: str) -> dict[str, Any]:
    """The settings in a config.yaml (or a checkpoint's copy), ready for TrainConfig: the environment
    record is left out, older versions' `init_kwargs` and `kernel_size` are folded into the init label,
    and an unknown key or a value of the wrong type fails naming the file and the key."""
    if not isinstance(values, dict):
        raise ValueError(f"{source}: expected a mapping of settings (a run's config.yaml), got {type(values).__name__}")
    values = {k: v for k, v in values.items() if k != ENVIRONMENT}
    legacy = dict(values.pop("init_kwargs", None) or {})
    kernel_size = values.pop("kernel_size", None)
    if legacy or kernel_size is not None:
        label = values.get("init", TrainConfig.init)
        if kernel_size is not None and InitSpec.parse(label).kernel_size is None and KERNEL_SIZE not in legacy:
            legacy[KERNEL_SIZE] = kernel_size
        values["init"] = with_options(label, legacy)
    values = with_cooldown_after(values)
    known = set(SETTINGS)
    unknown = sorted(str(k) for k in set(values) - known)
    if unknown:
        raise ValueError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; the settings are {', '.join(sorted(known))}"
        )
    for key, value in values.items():
        try:
            check_value(key, FIELD_TYPES[key], SETTINGS[key].bounds, value, shown=key)
        except ValueError as error:
            raise ValueError(f"{source}: {error}") from None
    return values


def with_cooldown_after(values: dict[str, Any]) -> dict[str, Any]:
    """A run recorded before 0.6.0 (a whole record, `resume` in it, without the settings 0.6.0 added) counted
    its --cooldown-epochs inside --epochs; since, they follow --epochs, as in timm. Its record is read with
    the same schedule in today's terms: --epochs less the cool-down."""
    cooldown, epochs = values.get("cooldown_epochs"), values.get("epochs")
    if "resume" not in values or "lr_base_size" in values or type(cooldown) is not int or type(epochs) is not int:
        return values
    if not 0 < cooldown < epochs:
        return values  # no cool-down, or not a record 0.5 could write: checked as it stands
    return {**values, "epochs": epochs - cooldown}


def read_config(path: str | Path) -> TrainConfig:
    """The TrainConfig of a run's config.yaml; one line naming the file if it is damaged."""
    return read_run_config(path)[0]


def read_run_config(path: str | Path) -> tuple[TrainConfig, dict[str, Any] | None]:
    """The TrainConfig of a run's config.yaml and the environment it records (where the run went on);
    one line naming the file if it is damaged."""
    path = Path(path)
    fix = "restore it, or delete it: --resume writes it again from last.pt"
    regular_file(path)
    try:
        text = read_settings_text(path)
        if not text.endswith("\n"):  # a run writes it whole, ending with a newline
            raise RunError(f"{path} is truncated: {fix}")
        values = load_yaml(text)
    except SettingsError as error:
        raise RunError(f"{path} is damaged ({error}): {fix}") from None
    try:
        config = TrainConfig(**config_values(values, str(path)))
    except (ValueError, TypeError) as error:
        raise RunError(str(error) if str(error).startswith(str(path)) else f"{path}: {error}") from None
    ran = values.get(ENVIRONMENT)
    return config, None if ran is None else check(ran, ENVIRONMENT_RECORD, f"{path}'s {ENVIRONMENT}", fix)


def read_config_file(path: Path) -> dict[str, Any]:
    """The settings of a --config FILE (a run's config.yaml, or any YAML of its keys); one line naming
    the file if it is not such a file, before anything is made."""
    where = f"--config {path}"
    try:
        values = load_yaml(read_settings_text(path))
    except SettingsError as error:
        raise ValueError(f"{where}: {error}") from None
    return expand_home(config_values(values or {}, where))


# the settings that name a path, where a config file's `~/...` means the home folder, as a shell reads it
PATH_SETTINGS = ("data_root", "cache_dir", "out", "initial_checkpoint")


def expand_home(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with a leading `~` of their paths (and of the data's, `imagefolder:~/photos`) expanded."""
    values = dict(values)
    for name in PATH_SETTINGS:
        if isinstance(values.get(name), str):
            values[name] = os.path.expanduser(values[name])
    kind, colon, where = str(values.get("data", "")).partition(":")
    if colon and where.startswith("~"):
        values["data"] = f"{kind}:{os.path.expanduser(where)}"
    return values
