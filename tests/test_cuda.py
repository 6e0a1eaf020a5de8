"""Runs move between GPUs and CPUs: a checkpoint written on a GPU opens on a laptop (attention, rank,
--resume), and on a machine with CUDA the trainer, DDP with nccl and the inits run there (skipped
without a GPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch

import structinit
from structinit.cli import main
from structinit.training.record import MetricsLog

FLAGS = ["--per-class", "20", "--model-kwargs", "depth=2", "--batch-size", "50", "--quiet"]
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def tag_as_cuda(path, monkeypatch):
    """Rewrite a checkpoint as a CUDA machine writes it: every storage tagged cuda:0, AdamW fused."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    for group in state["optimizer"]["param_groups"]:
        group.update(fused=True, foreach=False)
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, path)


def test_a_checkpoint_written_on_a_gpu_opens_on_a_cpu(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    # trained on the CPU and tagged as CUDA's, on any machine: on a GPU machine "auto" would train there,
    # and the comparison below would set a CUDA-trained run against a CPU-resumed one (issue 61)
    assert main(["train", *FLAGS, "--epochs", "1", "--device", "cpu", "--out", str(run)]) == 0
    tag_as_cuda(run / "last.pt", monkeypatch)
    if not torch.cuda.is_available():  # the file really is a GPU checkpoint: a plain load fails here
        with pytest.raises(RuntimeError, match="CUDA"):
            torch.load(run / "last.pt", weights_only=True)
    assert main(["attention", str(run), "--images", "8", "--out", str(tmp_path / "a.png")]) == 0
    assert main(["rank", str(run), "--images", "8", "--out", str(tmp_path / "r.png")]) == 0
    assert main(["train", "--resume", "--out", str(run), "--epochs", "2", "--device", "cpu", "--quiet"]) == 0
    assert [r["epoch"] for r in MetricsLog(run).epochs()] == [1, 2]
    # the resumed epoch ran the CPU's AdamW, not the fused kernel the GPU's checkpoint names
    assert main(["train", *FLAGS, "--epochs", "2", "--device", "cpu", "--out", str(tmp_path / "whole")]) == 0
    resumed, whole = (torch.load(r / "last.pt", weights_only=True)["model"] for r in (run, tmp_path / "whole"))
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


@cuda
def test_a_run_trains_on_cuda_and_resumes_on_the_cpu(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "2", "--stop-after", "1", "--device", "cuda", "--out", str(run)]) == 0
    assert torch.load(run / "last.pt", map_location="cpu", weights_only=True)["epoch"] == 1
    assert main(["train", "--resume", "--out", str(run), "--device", "cpu", "--quiet"]) == 0
    assert json.loads((run / "summary.json").read_text())["finished"]


@cuda
def test_adamw_runs_its_fused_kernel_on_cuda(tmp_path):
    run = tmp_path / "run"
    assert main(["train", *FLAGS, "--epochs", "1", "--device", "cuda", "--out", str(run)]) == 0
    groups = torch.load(run / "last.pt", map_location="cpu", weights_only=True)["optimizer"]["param_groups"]
    assert all(group["fused"] for group in groups)


@cuda
def test_the_inits_give_the_same_weights_on_cuda_as_on_the_cpu():
    from conftest import small_vit

    # impulse at a set sharpness: the paper's solve (minutes on the device's CPU, past the H200 call's limit
    # twice) has its own GPU test below
    for method in ("timm", "mimetic", "impulse[target_fidelity=0.98]"):
        torch.manual_seed(0)
        on_cpu = small_vit()
        torch.manual_seed(0)
        on_gpu = small_vit().cuda()
        structinit.initialize(on_cpu, method, seed=3)
        structinit.initialize(on_gpu, method, seed=3)
        gpu_state = on_gpu.state_dict()
        assert all(torch.equal(v, gpu_state[k].cpu()) for k, v in on_cpu.state_dict().items()), method


@cuda
def test_ddp_with_nccl_on_one_gpu(tmp_path):
    run = tmp_path / "ddp"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, ["src", os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "-m", "structinit", "train"]
    done = subprocess.run([*command, *FLAGS, "--epochs", "1", "--device", "cuda", "--out", str(run)], env=env)
    assert done.returncode == 0 and (run / "summary.json").exists()


@cuda
def test_the_papers_solve_on_the_gpu_reaches_the_cpus_value(tmp_path, monkeypatch):
    """A model on the GPU has its sharpness solved there (inits/sharpness.py): the value the CPU's solve
    reaches, to the solve's precision."""
    from structinit.inits import sharpness
    from structinit.inits.paper_solve import paper_solve
    from structinit.models import create_model

    pseudo = sharpness.standard_pseudo("sincos", (8, 8), 192, 1e-6)
    on_cpu = paper_solve(pseudo, (8, 8), 12, 3)
    on_gpu = paper_solve(pseudo, (8, 8), 12, 3, device="cuda")
    assert abs(on_gpu.mass - on_cpu.mass) < 0.005
    monkeypatch.setenv("STRUCTINIT_CACHE", str(tmp_path))
    monkeypatch.setattr(sharpness, "table_value", lambda *shape: None)  # solved, not found in the table
    model = create_model("vit_digits", num_classes=10, in_chans=3, data_size=None).cuda()
    report = structinit.initialize(model, "impulse", seed=0)
    assert report.source["target_fidelity"] == "0.64 (what the paper's solve reaches here; solved here)"
    assert next(model.parameters()).is_cuda


@cuda
def test_randaugment_gives_the_same_images_on_cuda_as_on_the_cpu_without_waiting_for_the_gpu():
    """The batched RandAugment computes Pillow's images in the same arithmetic on both devices, and a step's
    augmentation makes no host synchronisation (its draws go over in pinned, asynchronous copies)."""
    from structinit.data.augment import BatchAugment

    augment = BatchAugment((0.5,) * 3, (0.5,) * 3, 4, True, randaugment="rand-m9-n2-mstd0.5-inc1")
    images = torch.randint(0, 256, (256, 3, 32, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    labels = torch.zeros(256, dtype=torch.long)
    on_cpu, _ = augment(images, labels, torch.Generator().manual_seed(1))
    gpu_images, gpu_labels = images.cuda(), labels.cuda()
    augment(gpu_images, gpu_labels, torch.Generator().manual_seed(1))  # the constants copied once
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu, _ = augment(gpu_images, gpu_labels, torch.Generator().manual_seed(1))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.equal(on_gpu.cpu(), on_cpu)
