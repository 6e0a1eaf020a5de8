"""The invariant harness's file states of each path role (invariant_cases.ROLES): the role's valid fixture, and its
damaged or edited forms (an edited record field, NaN or odd-dtype tensors, an impossible header, a padded log,
folders timm and structinit might read apart). Each builder makes `path` from the fixtures; `rng` picks a field."""

from __future__ import annotations

import json
import shutil
import struct
import unicodedata
from pathlib import Path

import numpy as np
from PIL import Image

HOSTILE_VALUES = (-1, 0, 1e308, "x", None, [], {}, True, 2**70, float("nan"), "", [1, 2], -(2**63))
FIXTURE = {"run": "run", "output": "run", "weights": "init.safetensors", "config": "config.yaml",
           "images": "images", "data-spec": "images", "checkpoint": "run/last.pt",
           "output-file": "config.yaml"}  # fmt: skip


def make_images(root: Path, size: int = 16, per_class: int = 4) -> None:
    """A generated ImageFolder: train/ and test/, two classes of random PNGs."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for name in ("a", "b"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(per_class):
                Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(folder / f"{i}.png")


def valid(role: str, path: Path, fixtures: Path, rng: int = 0) -> None:
    source = fixtures / FIXTURE[role]
    if source.is_dir():
        shutil.copytree(source, path, symlinks=True)
    else:
        shutil.copyfile(source, path)


def _edit_json(role, path, fixtures, rng):
    valid("run", path, fixtures)
    record = path / "summary.json"
    data = json.loads(record.read_text())
    key = sorted(data)[rng % len(data)]
    data[key] = HOSTILE_VALUES[rng // 7 % len(HOSTILE_VALUES)]
    record.write_text(json.dumps(data))


def _edit_yaml(role, path, fixtures, rng):
    valid(role if role in ("run", "config") else "run", path, fixtures)
    record = path / "config.yaml" if path.is_dir() else path
    lines = record.read_text().splitlines()
    fields = [i for i, line in enumerate(lines) if ": " in line and not line.startswith(" ")]
    i = fields[rng % len(fields)]
    value = json.dumps(HOSTILE_VALUES[rng // 7 % len(HOSTILE_VALUES)], allow_nan=True).replace("NaN", ".nan")
    lines[i] = f"{lines[i].split(': ')[0]}: {value}"
    record.write_text("\n".join(lines) + "\n")


def _edit_jsonl(role, path, fixtures, rng):
    valid("run", path, fixtures)
    log = path / "metrics.jsonl"
    lines = log.read_text().splitlines()
    i = rng % len(lines)
    entry = json.loads(lines[i])
    key = sorted(entry)[rng // 3 % len(entry)]
    entry[key] = HOSTILE_VALUES[rng // 7 % len(HOSTILE_VALUES)]
    lines[i] = json.dumps(entry)
    log.write_text("\n".join(lines) + "\n")


def _padded_metrics(role, path, fixtures, rng):
    valid("run", path, fixtures)
    with open(path / "metrics.jsonl", "a") as log:
        log.write("{}\n" * 2_000_000)  # 6 MB of short lines


def _truncated_checkpoint(role, path, fixtures, rng):
    valid(role, path, fixtures)
    checkpoint = path / "last.pt" if path.is_dir() else path
    checkpoint.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])


def _no_checkpoint(role, path, fixtures, rng):
    valid("run", path, fixtures)
    (path / "last.pt").unlink()


def _tensor_edit(how: str):
    def build(role, path, fixtures, rng):
        import torch
        from safetensors import safe_open
        from safetensors.torch import save_file

        with safe_open(str(fixtures / "init.safetensors"), "pt") as f:
            metadata, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
        floats = sorted(k for k, v in tensors.items() if v.is_floating_point())
        key = floats[rng % len(floats)]
        t = tensors[key]
        tensors[key] = {
            "nan-tensor": lambda: torch.full_like(t, float("nan")),
            "inf-tensor": lambda: torch.full_like(t, float("inf")),
            "int-tensor": lambda: t.to(torch.int32),
            "wrong-shape": lambda: t.reshape(-1)[:-1].clone() if t.numel() > 1 else torch.zeros(3),
        }[how]()
        save_file(tensors, str(path), metadata=metadata)

    return build


def _truncated(role, path, fixtures, rng):
    data = (fixtures / "init.safetensors").read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _bad_header(role, path, fixtures, rng):
    path.write_bytes(struct.pack("<Q", 40) + b'{"x": {"dtype": "F32", "shape": [2, 2]' + b"\x00" * 16)


def _huge_shape_header(role, path, fixtures, rng):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 16]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\x00" * 16)


def _run_checkpoint(role, path, fixtures, rng):
    shutil.copyfile(fixtures / "run" / "last.pt", path)


def _images_with(change):
    def build(role, path, fixtures, rng):
        valid("images", path, fixtures)
        change(path)

    return build


def _val_and_validation(path: Path) -> None:
    shutil.copytree(path / "test", path / "val")
    shutil.copytree(path / "test", path / "validation")
    (path / "validation" / "b" / "0.png").unlink()


def _unicode_twins(path: Path) -> None:
    for form in ("NFC", "NFD"):
        shutil.copytree(path / "train" / "a", path / "train" / unicodedata.normalize(form, "café"))


def _link_in_tree(path: Path) -> None:
    (path / "train" / "a" / "linked.png").symlink_to(path.parent.parent / "outside" / "missing.png")


def _alias_bomb(role, path, fixtures, rng):
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    path.write_text("\n".join(levels) + "\n")


ROLE_BUILDERS = {
    "valid": valid,
    "another-run": lambda role, path, fixtures, rng: valid("run", path, fixtures),
    "edit-json": _edit_json,
    "edit-yaml": _edit_yaml,
    "edit-jsonl": _edit_jsonl,
    "padded-metrics": _padded_metrics,
    "truncated-checkpoint": _truncated_checkpoint,
    "no-checkpoint": _no_checkpoint,
    "yaml-alias-bomb": _alias_bomb,
    "yaml-list": lambda role, path, fixtures, rng: path.write_text("- 1\n- 2\n"),
    "nan-tensor": _tensor_edit("nan-tensor"),
    "inf-tensor": _tensor_edit("inf-tensor"),
    "int-tensor": _tensor_edit("int-tensor"),
    "wrong-shape": _tensor_edit("wrong-shape"),
    "truncated": _truncated,
    "bad-header": _bad_header,
    "huge-shape-header": _huge_shape_header,
    "run-checkpoint": _run_checkpoint,
    "non-image-file": _images_with(lambda p: (p / "train" / "a" / "notes.txt").write_text("not an image")),
    "corrupt-image": _images_with(lambda p: (p / "train" / "a" / "bad.png").write_bytes(b"\x89PNG garbage")),
    "empty-class": _images_with(lambda p: (p / "train" / "c").mkdir()),
    "val-and-validation": _images_with(_val_and_validation),
    "unicode-twins": _images_with(_unicode_twins),
    "link-in-tree": _images_with(_link_in_tree),
}
