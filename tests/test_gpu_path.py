"""The GPU path's checks that a CPU can make: benchmarks/bench_gpu.py's smoke mode (the FLOP count against
the formula, the compiled step against the eager one) and the trainer's compile default by device."""

import json

import pytest
import torch

from conftest import load_benchmark
from structinit.cli.parser import build_parser
from structinit.cli.train_flags import train_config
from structinit.training import TrainConfig
from structinit.training.recipe import compiles


@pytest.fixture(scope="module")
def bench():
    load_benchmark("gpu_table5")  # bench_gpu imports the cell's model and recipe from it
    return load_benchmark("bench_gpu")


def test_bench_gpu_smoke_counts_the_formulas_flops_and_its_compiled_step_matches_the_eager_one(bench, tmp_path, capsys):
    result = bench.main(["--smoke", "--json", str(tmp_path / "bench.json")])
    assert abs(result["gflop_per_image"]["ratio"] - 1) < 0.05  # FlopCounterMode against 6PT + 12LT^2d
    eager, compiled = result["eager_losses"], result["compiled_losses"]
    assert len(eager) == 3 and eager != [eager[0]] * 3  # the model trains: the losses move
    assert compiled == pytest.approx(eager, rel=2**-8)
    assert list(result["rows"]) == bench.SMOKE_VARIANTS
    assert all(row["img_per_s"] > 0 for row in result["rows"].values())
    trainer = result["rows"].pop("train")  # the trainer itself, on the digits: not the cell's FLOPs
    assert trainer["of_ceiling"] is None and trainer["first_steps_s"] > 0
    assert all(row["of_ceiling"] > 0 for row in result["rows"].values())
    assert result["augment_ms"]["host"] > 0 and result["augment_ms"]["device"] > 0
    assert list(json.loads((tmp_path / "bench.json").read_text())["rows"]) == bench.SMOKE_VARIANTS
    table = capsys.readouterr().out
    assert "| variant | img/s | TFLOP/s | of ceiling |" in table and "by the formula (+" in table
    assert "RandAugment (m9, n2) + crop + flip alone, a batch of 16: host " in table and "% of the eager step" in table


def test_bench_gpu_fails_when_the_count_leaves_the_formula_or_compiled_and_eager_part(bench):
    good = {"gflop_per_image": {"ratio": 1.03}, "eager_losses": [2.3, 2.1], "compiled_losses": [2.3, 2.1001]}
    assert bench.checks_failed(good) == []
    off = {**good, "gflop_per_image": {"ratio": 1.06}, "compiled_losses": [2.3, 2.2]}
    assert bench.checks_failed(off) == [
        "the counted FLOPs are 1.060 times the formula's",
        "step 1: compiled loss 2.20000, eager 2.10000",
    ]


def test_the_formula_gives_the_issues_11_3_gflop_for_the_table5_vit(bench):
    config = TrainConfig(model=bench.MODEL, data="cifar10")
    data = bench.synthetic(10)
    assert bench.formula_flops(config, data) == 6 * 12 * 8 * 256**2 * 256 + 12 * 8 * 256**2 * 256  # 11.27e9


def test_bench_gpu_refuses_an_unknown_variant_in_one_line(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--variants", "eager", "warp-speed"])
    assert "--variants: unknown ['warp-speed']; --list names them" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "device", "compiled"),
    [
        ([], "cuda", True),
        ([], "cpu", False),
        (["--no-compile"], "cuda", False),
        (["--compile"], "cpu", True),
        (["--torchcompile"], "cpu", True),
        (["--compile-mode", "reduce-overhead"], "cpu", True),
        (["--torchcompile-mode", "max-autotune"], "cuda", True),
    ],
)
def test_the_trainer_compiles_on_cuda_unless_told_and_on_a_cpu_only_when_told(argv, device, compiled):
    config = train_config(build_parser().parse_args(["train", *argv]))
    assert compiles(config, torch.device(device)) is compiled


def test_a_run_recorded_before_the_default_changed_keeps_its_eager_path_on_cuda():
    assert not compiles(TrainConfig(compile=False), torch.device("cuda"))


def test_the_trainer_compiles_its_training_forward_in_the_mode_asked(monkeypatch):
    from structinit.data.datasets import load_data
    from structinit.training import recipe as recipe_module
    from structinit.training.device import Dist

    modes = []
    monkeypatch.setattr(recipe_module.torch, "compile", lambda model, mode=None: modes.append(mode) or model)
    config = train_config(build_parser().parse_args(["train", "--compile-mode", "reduce-overhead"]))
    recipe_module.Recipe(config, load_data("digits", per_class=2), torch.device("cpu"), Dist())
    assert modes == ["reduce-overhead", None]  # training in the mode asked, evaluation in torch's default


def test_a_compile_mode_beside_no_compile_is_refused_in_one_line(tmp_path, capsys):
    from structinit.cli import main

    assert main(["train", "--compile-mode", "reduce-overhead", "--no-compile", "--out", str(tmp_path / "r")]) == 2
    assert "--compile-mode reduce-overhead compiles the model: leave out --no-compile" in capsys.readouterr().err


def test_an_eager_row_runs_the_model_itself_and_a_compile_row_its_compiled_form(bench, monkeypatch):
    """Issue 61: the "eager" rows were compiled (the trainer compiles on CUDA when compile is unset)."""
    import argparse

    from structinit.training import recipe as recipe_module

    on_cuda = recipe_module.compiles  # the trainer's decision as a CUDA machine makes it, here
    monkeypatch.setattr(recipe_module, "compiles", lambda config, device: on_cuda(config, torch.device("cuda")))
    cell = bench.cell_for(argparse.Namespace(device="cpu", data=None, smoke=True))
    eager = cell.recipe(bench.VARIANTS["eager"])
    assert eager.forward is eager.model
    compiled = cell.recipe(bench.VARIANTS["compile-cudagraphs"])
    assert isinstance(compiled.forward, torch._dynamo.eval_frame.OptimizedModule)
