"""What an init's weights keep across CPUs: each pinned init (tests/test_pinned_inits.py) written under
several of MKL's kernel paths on this machine, and how far the quantities apart.

A factorisation (mimetic's SVDs, the impulse solve's rotations) is not unique: the factors W_q, W_k, W_v,
W_proj move when a kernel rounds differently (another CPU, another MKL path), while what the method
defines stays: the per-head products W_q,h^T W_k,h, the layer's W_proj W_v, and each factor's norm (a
balanced factor's squared norm is the product's nuclear norm). This script measures both, so that the
pinned test's tolerances are measured, not guessed (docs/methods.md, "What holds across CPUs").

    python benchmarks/cross_cpu.py              # the table, every pinned case under every path
    python benchmarks/cross_cpu.py --against OLD.json  # and against pins another CPU wrote in the old
                                                        # format (every tensor's three sums), by kind
    python benchmarks/cross_cpu.py --emit DIR   # (internal) one path's fingerprints on stdout, weights in DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from safetensors.torch import load_file, save

from structinit.cli.model_flags import PRESET_DATA
from structinit.errors import RunError
from structinit.files import atomic_write, read_json_object
from structinit.inits.labels import BUNDLE
from structinit.schema import Field, Schema, check, mapping, number
from structinit.studies.ledger import one_line_refusals
from structinit.training.provenance import device_name

# (model, --model-kwargs, init label, seed): what `structinit init` writes for each is pinned
CASES = [
    ("vit_digits", "", "impulse", 3),
    ("vit_digits", "", BUNDLE, 3),
    ("vit_digits", "", "impulse-soft", 3),
    ("vit_digits", "", "impulse-neurips", 3),
    ("vit_digits", "", "mimetic", 3),
    ("vit_digits", "", "timm", 3),
    ("vit_digits", "", "kaiming", 3),
    ("vit_digits", "", "qk-norm", 3),
    (
        "vit_tiny_p4",
        "img_size=32",
        "impulse[kernel_size=5,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
        0,
    ),
    ("vit_tiny_p4", "img_size=32", "mimetic[base=kaiming]", 0),
    ("swin_d6_p2_w4", "img_size=32", "impulse", 1),
    ("mixer_d6_p4", "img_size=32", "impulse", 1),
    ("convmixer_d6_p4", "", "impulse", 1),
    ("convmixer_d6_p4", "", "random", 1),
]
# MKL's conditional numerical reproducibility modes take other kernels than its default on this CPU:
# the nearest this machine has to another CPU (the default path on AVX-512 differs again)
PATHS = {"default": {}, "MKL_CBWR=COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"}, "MKL_CBWR=AVX2": {"MKL_CBWR": "AVX2"}}
KINDS = ("tensors", "norms", "products", "factors")


PINS_FIX = "give pins in the old format: {case: {tensor: [shape, [sum, sum of squares, signed sum]]}} of every case"


SUM = number(-math.inf)  # any finite number


def _is_pin(value: object) -> bool:
    """[shape, [three finite sums]]: a tensor's pin in the old format."""
    sums = value[1] if isinstance(value, list) and len(value) == 2 else None
    return isinstance(sums, list) and len(sums) == 3 and all(map(SUM.test, sums))


PIN = Field("[shape, [sum, sum of squares, signed sum]]", _is_pin)


def case_id(case: tuple) -> str:
    model, kwargs, init, seed = case
    return f"{model}{'(' + kwargs + ')' if kwargs else ''} {init} seed {seed}"


def written_weights(case: tuple, folder: Path) -> dict[str, torch.Tensor]:
    """The weights `structinit init MODEL --init X --seed N --save F` writes."""
    from structinit.cli import main

    model, kwargs, init, seed = case
    path = folder / "init.safetensors"
    argv = ["init", model, "--init", init, "--seed", str(seed), "--save", str(path), "--overwrite"]  # one scratch file
    if model in PRESET_DATA:  # pinned when `init vit_digits` built timm's 1000 classes and 3 channels: kept so
        argv += ["--num-classes", "1000"]
        kwargs = ",".join(filter(None, [kwargs, "in_chans=3"]))
    assert main([*argv, "--model-kwargs", kwargs] if kwargs else argv) == 0
    return load_file(path)


def sums(tensor: torch.Tensor) -> list[float]:
    """Its sum, sum of squares and sum against a fixed random sign pattern (float64)."""
    values = tensor.detach().double().flatten()
    signs = torch.randint(0, 2, values.shape, generator=torch.Generator().manual_seed(0)).double() * 2 - 1
    return [values.sum().item(), values.square().sum().item(), (values * signs).sum().item()]


def attention_products(case: tuple, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The model's per-head W_q,h^T W_k,h (heads, D, D) and W_proj W_v (D, D) per attention layer, and the
    names of the state's tensors that hold those factors."""
    from structinit.inits.labels import parse_assignments
    from structinit.inits.registry import family_of
    from structinit.models import create_model

    name, kwargs, _, _ = case
    options = parse_assignments(kwargs or None, "--model-kwargs")
    model = create_model(name, num_classes=1000, in_chans=3, data_size=None, **options)
    model.load_state_dict(state)
    try:
        adapter = family_of(model)[1]
    except TypeError:  # a ConvMixer: no attention
        return {}, set()
    products, storages = {}, set()
    for i, layer in enumerate(adapter.layers() if hasattr(adapter, "layers") else []):
        (wq, wk), (wv, wo) = layer.qk_weights(), layer.value_weights()
        heads, width = layer.num_heads, layer.head_dim
        q, k = (w.detach().double().reshape(heads, width, -1) for w in (wq, wk))
        products[f"layer{i}.qk"] = q.transpose(1, 2) @ k
        products[f"layer{i}.vproj"] = wo.detach().double() @ wv.detach().double()
        storages |= {w.untyped_storage().data_ptr() for w in (wq, wk, wv, wo)}
    factor_names = {n for n, p in model.state_dict().items() if p.untyped_storage().data_ptr() in storages}
    return products, factor_names


def fingerprint(case: tuple, state: dict[str, torch.Tensor]) -> dict[str, dict[str, list]]:
    """What the method defines, by kind: `tensors` (every tensor but the attention factors: their three
    sums), `norms` (each factor tensor's sum of squares), `products` (the attention products' sums);
    and `factors` (the factor tensors' sums: what a CPU may change, for the record)."""
    products, factor_names = attention_products(case, state)
    prints: dict[str, dict[str, list]] = {kind: {} for kind in KINDS}
    for name, tensor in sorted(state.items()):
        if name in factor_names:
            prints["norms"][name] = [list(tensor.shape), [sums(tensor)[1]]]
            prints["factors"][name] = [list(tensor.shape), sums(tensor)]
        else:
            prints["tensors"][name] = [list(tensor.shape), sums(tensor)]
    for name, product in products.items():
        prints["products"][name] = [list(product.shape), sums(product)]
    return prints


def deviation(now: list, pinned: list) -> float:
    """The largest |difference| of two fingerprints' sums, relative to the largest |sum| pinned."""
    scale = max(abs(s) for s in pinned[1]) or 1.0
    return max(abs(a - b) for a, b in zip(now[1], pinned[1])) / scale


def read_pins(path: Path) -> dict[str, dict[str, list]]:
    """--against's pins, read within files.read_json_object's bound and checked before any path runs: a pin of
    every tensor of every case (PIN); one line (RunError) naming the file and what is wrong otherwise."""
    pins = read_json_object(path, PINS_FIX)
    cases = {case_id(case): mapping(Schema({}, patterns={".*": PIN})) for case in CASES}
    return check(pins, Schema(cases), str(path), PINS_FIX)


def emit(keep: Path) -> None:
    """Each case's fingerprint as JSON on stdout; its weights kept in `keep` for a bit-by-bit comparison."""
    prints = {}
    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(sys.stderr):
        for i, case in enumerate(CASES):
            state = written_weights(case, Path(folder))
            data = save(state)
            atomic_write(keep / f"{i}.safetensors", lambda f, data=data: f.write(data))
            prints[case_id(case)] = fingerprint(case, state)
    json.dump(prints, sys.stdout)


def differing_bits(folder: Path, reference: Path) -> str:
    """How many of the weights' entries differ in any bit from the reference path's, of how many."""
    differ = total = 0
    for i in range(len(CASES)):
        a, b = load_file(folder / f"{i}.safetensors"), load_file(reference / f"{i}.safetensors")
        differ += sum(int((a[n].view(-1) != b[n].view(-1)).sum()) for n in a)
        total += sum(a[n].numel() for n in a)
    return f"{differ} of {total}"


def table(against: Path | None) -> None:
    old = read_pins(against) if against is not None else None  # a damaged file: one line before minutes of work
    with tempfile.TemporaryDirectory() as scratch:
        runs = paths_table(Path(scratch))
    if old is not None:
        row = against_old(old, runs["default"], against)
        print(f"| {against.name} | " + " | ".join(row) + " | - |")


def paths_table(root: Path) -> dict[str, dict]:
    """Every pinned case written under every path, in its own process: the table of how far the paths differ
    printed, their fingerprints returned by path."""
    runs = {}
    for i, (path, env) in enumerate(PATHS.items()):
        (root / str(i)).mkdir()
        command = [sys.executable, __file__, "--emit", str(root / str(i))]
        done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
        if done.returncode != 0:  # the child's own last line, not a CalledProcessError traceback
            said = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise SystemExit(f"cross_cpu.py: error: the {path} path failed: {said}")
        runs[path] = json.loads(done.stdout)
        print(f"{path}: done", file=sys.stderr)
    cpu = f"{device_name(torch.device('cpu'))}, {os.cpu_count()} cores, torch {torch.__version__}"
    print(f"CPU: {cpu}; the largest deviation from the default path, by kind\n")
    print("| path | " + " | ".join(KINDS) + " | entries that differ |\n|---|" + "---|" * (len(KINDS) + 1))
    for i, (path, prints) in enumerate(runs.items()):
        worst = {
            kind: max(
                (deviation(p[kind][n], runs["default"][c][kind][n]) for c, p in prints.items() for n in p[kind]),
                default=0.0,
            )
            for kind in KINDS
        }
        bits = differing_bits(root / str(i), root / "0")
        print(f"| {path} | " + " | ".join(f"{worst[k]:.1e}" for k in KINDS) + f" | {bits} |")
    return runs


def against_old(
    old: dict[str, dict[str, list]], prints: dict[str, dict[str, dict[str, list]]], source: Path
) -> list[str]:
    """Per kind, the largest deviation of this machine's default path from pins in the old format, which
    held every tensor's three sums (so no products): norms compare the sums of squares. A tensor the pins
    (read from `source`) lack is one line (RunError)."""

    def pinned(case: str, name: str) -> list:
        if name not in old[case]:
            raise RunError(f"{source} has no pin of {case}'s {name}: {PINS_FIX}")
        return old[case][name]

    worst = dict.fromkeys(KINDS, 0.0)
    for case, kinds in prints.items():
        for kind in ("tensors", "factors"):
            for name, now in kinds[kind].items():
                worst[kind] = max(worst[kind], deviation(now, pinned(case, name)))
        for name, now in kinds["norms"].items():
            worst["norms"] = max(worst["norms"], deviation(now, [None, [pinned(case, name)[1][1]]]))
    return [f"{worst[k]:.1e}" if k != "products" else "-" for k in KINDS]


@one_line_refusals("cross_cpu.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emit", type=Path, metavar="DIR", help="print this process's fingerprints, keep weights")
    parser.add_argument("--against", type=Path, help="pins another CPU wrote, in the old format")
    args = parser.parse_args(argv)
    emit(args.emit) if args.emit else table(args.against)
    return 0


if __name__ == "__main__":
    sys.exit(main())
