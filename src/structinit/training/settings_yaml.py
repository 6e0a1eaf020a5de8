"""Settings as YAML: how every settings file (a --config file, a run's config.yaml, a preset) is read.
Numbers are read as a user writes them (`lr: 1e-3` is 0.001, where YAML 1.1 reads text). Plain YAML
only: no Python objects, no anchors, aliases or merge keys (a 1 KB file of nested aliases is a billion
values), every key a name given once, the file small and shallow. A file that breaks these rules is a
SettingsError saying why, for the caller to name the file."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from ..errors import RunError, first_line, quoted
from ..files import regular_file

MAX_BYTES = 64 << 10  # a run's config.yaml is about 2 KB; PyYAML takes seconds to read 64 KB
MAX_DEPTH = 16  # settings nest two or three levels (model_kwargs: {name: [values]})
MERGE = "tag:yaml.org,2002:merge"
# a number as a user writes it, YAML 1.2's float: 1e-3 and 5E4 too, which YAML 1.1 reads as text
FLOAT = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$")


class SettingsError(ValueError):
    """Text or a file that is not settings as YAML; the message says why, without the file's name."""


def read_settings_text(path: Path) -> str:
    """The text of the settings file `path`: a regular file of UTF-8 text of at most MAX_BYTES."""
    if path.is_dir():
        raise SettingsError("a directory, not a file")
    if not path.exists():
        raise SettingsError("no such file")
    try:
        regular_file(path)  # a FIFO or a device: named for what it is, before it is opened
    except RunError as error:
        raise SettingsError(str(error)) from None
    with open(path, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise SettingsError(f"larger than {MAX_BYTES >> 10} KiB (settings are a few lines)")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise SettingsError("not text (a binary file?)") from None


def load_yaml(text: str) -> Any:
    """The settings in YAML `text` (see the module); SettingsError if it is not such YAML."""
    try:
        return yaml.load(text, Loader=_SettingsLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as error:
        raise SettingsError(f"not valid YAML ({first_line(error)})") from None


class _SettingsLoader(yaml.SafeLoader):
    """yaml.safe_load, refusing what settings never need before it is built: anchors and aliases,
    merge keys, nesting deeper than MAX_DEPTH, keys that are not names, a key given twice in one
    mapping (PyYAML keeps the last silently)."""

    depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        line = f"line {event.start_mark.line + 1}"
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise SettingsError(f"{line}: anchors and aliases (& and *) are not supported: write each value out")
        if self.depth >= MAX_DEPTH:
            raise SettingsError(f"{line}: nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = set()
        for key_node, _ in node.value:
            line = f"line {key_node.start_mark.line + 1}"
            if key_node.tag == MERGE:
                raise SettingsError(f"{line}: merge keys (<<) are not supported: write the keys out")
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                raise SettingsError(f"{line}: a key must be a name, got {quoted(key)}")
            if key in keys:
                raise SettingsError(f"{line}: {key} given twice")
            keys.add(key)
        return super().construct_mapping(node, deep=deep)


# an integer stays an integer: PyYAML tries the int resolver first, then this one
_SettingsLoader.add_implicit_resolver("tag:yaml.org,2002:float", FLOAT, list("-+0123456789."))


def dump_yaml(values: dict[str, Any]) -> str:
    """`values` as YAML that load_yaml reads back as they are: text that would read as a number here
    (`--out 1e400`, which YAML 1.1 writes bare) is quoted."""
    return yaml.dump(values, Dumper=_SettingsDumper, sort_keys=False)


class _SettingsDumper(yaml.SafeDumper):
    """yaml.safe_dump, quoting the text that _SettingsLoader's number resolver would read as a number."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "'" if FLOAT.match(value) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_SettingsDumper.add_representer(str, _text)
