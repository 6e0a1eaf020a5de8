"""Why an init trains well or badly with 12 small heads: what each init does at step 0.

For the study's ViT (width 192, depth 6, 32 px / patch 4) with 12 heads (dimension 16) and 3 heads
(dimension 64), built exactly as `structinit train` builds it (seed 0), on 256 CIFAR-10 test images
(../shared/datasets/cifar10):
- fidelity on the pseudo input (what the solver aimed at) and on the images (every layer; the mass
  on each head's best 3x3 offset);
- attention entropy on the images, as a fraction of log(T): 1 is uniform, 0 is one-hot. A head near
  0 is a frozen router: the softmax Jacobian vanishes and its Q/K get almost no gradient;
- the gradient that reaches Q/K, relative to their size (|grad| / |W|, summed over layers), for the
  training loss on those images, next to the same ratio for the MLPs;
- the stable rank of the last block's grid tokens (rank collapse: a token mixing that makes every
  token alike leaves the classifier little to separate).

`--part width128`: the same for theory.py's ViT (width 128, depth 8, 4 / 8 / 16 heads), where the
impulse init trained worse with more heads. `--part layers`: per layer, the mass each head's map puts
on its assigned offset on the images, for the impulse init with and without `propagate`.
`--part training`: along training, from the weight snapshots of the convergence study's runs
(benchmarks/study_convergence.py keeps seed 0's weights at epochs 0, 1, 2, 5, 10, 20, 40, 70, 100), on
256 held-out CIFAR-10 training images (its validation split; the test set is not used): the mass on
the offsets the init assigned, the best-offset mass and the entropy of the attention, the position
embedding against the patch embeddings, the V/proj product's identity term and stable rank, and the
Q/K and whole-model weight norms. Written to docs/studies/convergence.md (between its mechanism markers).
`--part conditioning`: how far the Q/K solve may invert the pseudo input's spectrum (`rcond`), for a
learned table (the study ViT), a fixed sin-cos table (the paper's v1 ViT, average pooling) and ViT-T
at 224 px (64 test images upsampled): the weights' size and the gradient the first step sees.

    .venv/bin/python benchmarks/bench_mechanism.py                   # the study ViT; minutes on 2 cores
    .venv/bin/python benchmarks/bench_mechanism.py --part width128
    .venv/bin/python benchmarks/bench_mechanism.py --part layers
    .venv/bin/python benchmarks/bench_mechanism.py --part conditioning
    .venv/bin/python benchmarks/bench_mechanism.py --part training [--runs runs/convergence]
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
from pathlib import Path

import torch
from torch import nn

import structinit
from structinit.adapters import get_adapter
from structinit.data.batches import normalise_for, normalised_test_images
from structinit.data.datasets import load_data
from structinit.errors import RunError
from structinit.files import read_json_object
from structinit.inits.labels import BUNDLE
from structinit.inspection.rank import feature_ranks
from structinit.measure import attention_entropy, layer_inputs
from structinit.offsets import offset_mass
from structinit.schema import Field, Schema, check, integer, listing, mapping
from structinit.studies.ledger import check_outputs, one_line_refusals, write_generated_section
from structinit.training import TrainConfig, read_config
from structinit.training.recipe import model_of
from structinit.weights_in import check_weights, read_weights

DATA = "cifar10:../shared/datasets/cifar10"
INITS = [
    "timm",
    "kaiming",
    "mimetic",
    "impulse-neurips[base=keep]",
    "impulse[target_fidelity=0.7,pos_scale=18.0,vproj=mimetic,base=keep]",
    "impulse[target_fidelity=0.9,pos_scale=18.0,vproj=mimetic,base=keep]",
    BUNDLE,
    "impulse-soft",
    "impulse[target_fidelity=0.995,pos_scale=18.0,vproj=mimetic,base=keep]",
]
# part -> (model kwargs per row, inits)
PARTS = {
    "study": ([{"num_heads": 12}, {"num_heads": 3}], INITS),
    "width128": (
        [{"embed_dim": 128, "depth": 8, "num_heads": h} for h in (4, 8, 16)],
        [
            "timm",
            "mimetic",
            BUNDLE,
            "impulse[blind_to_content=False,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
            "impulse[target_fidelity=0.9,pos_scale=18.0,vproj=mimetic,base=keep]",
        ],
    ),
}
LAYER_ROWS = [{"num_heads": 12}, {"num_heads": 3}, {"embed_dim": 128, "depth": 8, "num_heads": 16}]
LAYER_INITS = [
    BUNDLE,
    "impulse[propagate=True,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
    "impulse[propagate=True,blind_to_content=False,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
]
# (label, model, model kwargs, image size); ViT-T is built at 224 px and fed upsampled images
CONDITIONING_ROWS = [
    ("study ViT, 12 heads, learned table", "vit_d6_p4", {"num_heads": 12}, 32),
    ("v1 ViT (GAP, sin-cos), 12 heads", "vit_d6_p4_gap_sincos", {"num_heads": 12}, 32),
    # dynamic_img_size: the trainer refuses a fixed img_size that does not fit the 32 px data
    ("ViT-T/16, 224 px, 3 heads", "vit_tiny_patch16_224", {"img_size": 224, "dynamic_img_size": True}, 224),
]
CONDITIONING_INITS = [
    "timm",
    "mimetic",
    "impulse[rcond=1e-05,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
    "impulse[rcond=0.03,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
    BUNDLE,
    "impulse[rcond=0.3,target_fidelity=0.98,pos_scale=18.0,vproj=mimetic,base=keep]",
]


def assigned_fidelity(model: nn.Module, report: structinit.Report, images: torch.Tensor) -> list[float]:
    """Per layer, the mean mass the heads put on the offsets the init assigned them, on `images`."""
    adapter = get_adapter(model)
    with torch.no_grad():
        return [
            float(offset_mass(layer.attention(x).float(), offsets, adapter.grid, adapter.num_prefix_tokens).mean())
            for layer, x, offsets in zip(
                adapter.layers(),
                layer_inputs(adapter, images),
                [[h.offset for h in layer.heads] for layer in report.layers],
            )
        ]


def layers_part(spec: str, data) -> None:
    print("| model | init | fidelity on the images, per layer (assigned offsets) |")
    print("|---|---|---|")
    for kwargs in LAYER_ROWS:
        name = ", ".join(f"{k.replace('num_', '')} {v}" for k, v in kwargs.items())
        for label in LAYER_INITS:
            config = TrainConfig(data=spec, model="vit_d6_p4", model_kwargs=kwargs, init=label, seed=0)
            model, report = model_of(config, data)
            values = assigned_fidelity(model, report, normalised_test_images(model, data, 256))
            print(f"| {name} | {label} | {' '.join(f'{v:.2f}' for v in values)} |", flush=True)


def conditioning_part(spec: str, data) -> None:
    print(
        "| model | init | layer-0 pseudo input: directions above 1e-5 / 0.1 of the largest | fidelity, pseudo input "
        "| fidelity on the images, layer 0 / all layers | layer-0 Q/K weight norm | patch-embedding grad norm "
        "| Q/K grad / weight |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, arch, kwargs, size in CONDITIONING_ROWS:
        count = 256 if size == 32 else 64
        for label in CONDITIONING_INITS:
            config = TrainConfig(data=spec, model=arch, model_kwargs=kwargs, init=label, seed=0)
            model, report = model_of(config, data)
            images = normalised_test_images(model, data, count)
            if size != images.shape[-1]:
                images = nn.functional.interpolate(images, size=size, mode="bilinear", align_corners=False)
            adapter = get_adapter(model)
            with torch.no_grad():
                values = torch.linalg.svdvals(layer_inputs(adapter, None)[0][0].double())
            spread = f"{int((values > values[0] * 1e-5).sum())} / {int((values > values[0] * 0.1).sum())}"
            on_target = assigned_fidelity(model, report, images)
            qkv = model.blocks[0].attn.qkv.weight.detach()
            qk_norm = float(qkv[: 2 * qkv.shape[1]].norm())
            qk, _ = gradient_ratios(model, images, data.test_labels[:count])
            patch = float(model.patch_embed.proj.weight.grad.norm())
            print(
                f"| {name} | {label} | {spread} | {report.mean_fidelity:.3f} "
                f"| {on_target[0]:.2f} / {sum(on_target) / len(on_target):.2f} | {qk_norm:.1f} | {patch:.2f} "
                f"| {qk:.4f} |",
                flush=True,
            )


def gradient_ratios(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """|grad| / |W| of the query/key rows of qkv and of the MLPs, summed over blocks."""
    model.zero_grad()
    nn.functional.cross_entropy(model(images), labels).backward()
    qk = mlp = 0.0
    for block in model.blocks:
        dim = block.attn.qkv.weight.shape[1]
        w, g = block.attn.qkv.weight.detach()[: 2 * dim], block.attn.qkv.weight.grad[: 2 * dim]
        qk += float(g.norm() / w.norm())
        w1, g1 = block.mlp.fc1.weight.detach(), block.mlp.fc1.weight.grad
        mlp += float(g1.norm() / w1.norm())
    return qk, mlp


def snapshot_measures(model: nn.Module, images: torch.Tensor, offsets: list[list] | None) -> dict[str, float]:
    """What the init put in, measured on `images` for a model at some point of training (see --part training)."""
    adapter = get_adapter(model)
    prefix = adapter.num_prefix_tokens
    with torch.no_grad():
        on_target = (
            [
                float(offset_mass(layer.attention(x).float(), o, adapter.grid, prefix).mean())
                for layer, x, o in zip(adapter.layers(), layer_inputs(adapter, images), offsets)
            ]
            if offsets
            else None
        )
        pos = model.pos_embed[0, prefix:]
        patches = adapter.patch_tokens(images)
        pos_over_patch = float(pos.pow(2).mean().sqrt() / patches.pow(2).mean().sqrt())
        identity, ranks = [], []
        for layer in adapter.layers():
            wv, wproj = layer.value_weights()
            product = (wv.T @ wproj.T).double()  # x -> x W_v^T W_proj^T, the value path
            identity.append(float(torch.trace(product)) / product.shape[0])
            ranks.append(float(product.norm() ** 2 / torch.linalg.matrix_norm(product, 2) ** 2))
        qk = [float(torch.cat(layer.qk_weights()).norm()) for layer in adapter.layers()]
        weights = float(torch.sqrt(sum((p.detach() ** 2).sum() for p in model.parameters())))
    return {
        "on_target_l0": on_target[0] if on_target else float("nan"),
        "on_target": sum(on_target) / len(on_target) if on_target else float("nan"),
        "best_offset": structinit.fidelity(model, images).mean_fidelity,
        "entropy": attention_entropy(model, images),
        "pos_over_patch": pos_over_patch,
        "vproj_identity": sum(identity) / len(identity),
        "vproj_stable_rank": sum(ranks) / len(ranks),
        "qk_norm": sum(qk) / len(qk),
        "weight_norm": weights,
    }


OFFSET = Field("[row, column]", lambda v: isinstance(v, list) and len(v) == 2 and all(map(integer(-math.inf).test, v)))
HEAD = mapping(Schema({"offset": OFFSET}))
REPORT_LAYERS = Schema({"layers": listing(mapping(Schema({"heads": listing(HEAD, at_least=1)})), at_least=1)})
REPORT_FIX = "restore it, or train the run again (its start writes it)"


def assigned_offsets(run: Path) -> list[list[tuple[int, int]]]:
    """Per layer, the offsets of the heads of `run`, from its own init record (a rebuild by other
    code, e.g. one that draws the position embedding differently, may assign others), read within bounds
    and checked: one line (RunError) where it is damaged."""
    path = run / "init_report.json"
    layers = check(read_json_object(path, REPORT_FIX), REPORT_LAYERS, str(path), REPORT_FIX)["layers"]
    return [[tuple(head["offset"]) for head in layer["heads"]] for layer in layers]


def snapshot_weights(snapshot: Path, model: nn.Module) -> dict[str, torch.Tensor]:
    """A weight snapshot, read and checked against `model` as every weights entering structinit are (weights_in:
    no code unpickled): one line (RunError) where it is damaged or not the model's."""
    try:
        state, _ = read_weights(snapshot, "snapshot")
        check_weights(f"snapshot {snapshot}", state, model)
    except ValueError as error:
        raise RunError(f"{error}: train the run again to keep its snapshots") from None
    return state


TRAINING_EPOCHS = (0, 10, 40)  # the snapshots the table shows, with each run's last


def training_part(runs: Path, docs: Path, held_out: int = 26) -> None:
    """Per run with snapshots, at epochs 0, 10, 40 and its last snapshot, `snapshot_measures` on
    held-out training images."""

    header = (
        "| run | epoch | on assigned offset, layer 0 / all | best-offset mass | entropy / log T | pos / patch RMS "
        "| V/proj identity term | V/proj stable rank | Q/K norm (per layer) | weight norm |\n"
        "|---|---|---|---|---|---|---|---|---|---|"
    )
    folders = sorted(runs.glob("*/per_class_*/*-seed0/snapshots"))
    if not folders:  # a fresh checkout has no run directories: the measured table stays
        raise SystemExit(
            f"no weight snapshots under {runs}/*/per_class_*/*-seed0: docs/studies/convergence.md is left as it is"
        )
    check_outputs(docs, [Path("studies", "convergence.md")])
    lines, datasets = [header], {}
    for folder in folders:
        run = folder.parent
        config = read_config(run / "config.yaml")
        key = (config.data, config.per_class)
        if key not in datasets:  # CIFAR-10: 26 held-out images per class, of which the first 256 are used
            datasets[key] = load_data(config.data, per_class=config.per_class, val_per_class=held_out)
        data = datasets[key]
        model, _ = model_of(config, data)  # the architecture; the weights come from the snapshots
        offsets = assigned_offsets(run) if BUNDLE in config.init else None
        images = normalise_for(model, data.val_images[:256])
        name = f"{run.parent.parent.name} {config.init}"  # the label from the record: folders are not labels
        snapshots = sorted(folder.glob("epoch_*.pt"))
        for snapshot in snapshots:
            if int(snapshot.stem.split("_")[1]) not in TRAINING_EPOCHS and snapshot != snapshots[-1]:
                continue
            model.load_state_dict(snapshot_weights(snapshot, model))
            model.eval()
            m = snapshot_measures(model, images, offsets)
            on_target = f"{m['on_target_l0']:.2f} / {m['on_target']:.2f}" if offsets else "-"
            lines.append(
                f"| {name} | {int(snapshot.stem.split('_')[1])} | {on_target} "
                f"| {m['best_offset']:.2f} | {m['entropy']:.2f} | {m['pos_over_patch']:.2f} "
                f"| {m['vproj_identity']:+.3f} | {m['vproj_stable_rank']:.1f} | {m['qk_norm']:.1f} "
                f"| {m['weight_norm']:.1f} |"
            )
            print(lines[-1], flush=True)
    machine = f"torch {torch.__version__}, {platform.machine()}"
    body = f"Measured by `bench_mechanism.py --part training` ({machine}).\n\n" + "\n".join(lines) + "\n"
    page = docs / "studies" / "convergence.md"  # the convergence study's page (study_convergence.PAGE)
    page.parent.mkdir(parents=True, exist_ok=True)
    write_generated_section(page, body, "benchmarks/bench_mechanism.py --part training", "mechanism")


@one_line_refusals("bench_mechanism.py")
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=[*PARTS, "layers", "conditioning", "training"], default="study")
    parser.add_argument("--runs", default="runs/convergence", help="--part training: the convergence study's runs")
    parser.add_argument("--docs", default=str(Path(__file__).resolve().parent.parent / "docs"))
    parser.add_argument("--held-out", type=int, default=26, help="--part training: held-out images per class")
    parser.add_argument("--data", default=DATA, help="structinit --data spec of the images (CIFAR-10 by default)")
    args = parser.parse_args(argv)
    part = args.part
    if part == "training":
        training_part(Path(args.runs), Path(args.docs), args.held_out)
        return 0
    spec = args.data
    data = load_data(spec, per_class=200)
    print(f"# Init mechanism (torch {torch.__version__}, {platform.machine()}, 256 CIFAR-10 test images, seed 0)\n")
    if part == "layers":
        layers_part(spec, data)
        return 0
    if part == "conditioning":
        conditioning_part(spec, data)
        return 0
    rows, inits = PARTS[part]
    print(
        "| model | init | fidelity, pseudo input | fidelity, images (all layers) | attention entropy / log T "
        "| Q/K grad / weight | MLP grad / weight | last block stable rank |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kwargs in rows:
        name = ", ".join(f"{k.replace('num_', '')} {v}" for k, v in kwargs.items())
        for label in inits:
            config = TrainConfig(data=spec, model="vit_d6_p4", model_kwargs=kwargs, init=label, seed=0)
            model, report = model_of(config, data)
            images = normalised_test_images(model, data, 256)
            labels = data.test_labels[:256]
            real = structinit.fidelity(model, images)
            entropy = attention_entropy(model, images)
            with torch.no_grad():
                last = feature_ranks(model, images)[-1].stable_rank
            qk, mlp = gradient_ratios(model, images, labels)
            print(
                f"| {name} | {label} | {report.mean_fidelity:.3f} | {real.mean_fidelity:.3f} | {entropy:.3f} "
                f"| {qk:.4f} | {mlp:.4f} | {last:.2f} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
