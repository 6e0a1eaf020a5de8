"""The Python face beyond the init: a saved init rebuilt from its file alone (structinit.load_init, or
timm.create_model from the record), and training from Python (structinit.train and structinit.compare)
through the code the CLI runs, with docs/training.md's example run as it is written."""

import csv
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from timm.models.convmixer import ConvMixer
from torch import nn

import structinit
from structinit.cli import main
from structinit.errors import Notice

DOCS = Path(__file__).resolve().parent.parent / "docs"
TINY = dict(img_size=16, patch_size=4, depth=2, embed_dim=32, num_heads=2, num_classes=10)
TINY_FLAGS = ["--model-kwargs", "img_size=16,patch_size=4,depth=2,embed_dim=32,num_heads=2,num_classes=10"]


def record(path: Path) -> dict[str, str]:
    with safe_open(str(path), "pt") as f:
        return f.metadata()


def outputs(model: torch.nn.Module, size: int = 16, channels: int = 3) -> torch.Tensor:
    images = torch.randn(4, channels, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model.eval()(images)


def test_a_saved_init_records_the_timm_name_and_keywords_that_build_it_again(tmp_path):
    path = tmp_path / "init.safetensors"
    assert main(["init", "vit_tiny_patch16_224", *TINY_FLAGS, "--seed", "3", "--save", str(path)]) == 0
    saved = record(path)
    assert saved["model"] == "vit_tiny_patch16_224" and "missing" not in saved and "preset" not in saved
    assert json.loads(saved["model_kwargs"]) == {**TINY, "in_chans": 3}
    assert saved["model_class"] == "timm.models.vision_transformer.VisionTransformer"

    # what timm's train.py does with --model, --model-kwargs, --num-classes and --initial-checkpoint
    rebuilt = timm.create_model(saved["model"], **json.loads(saved["model_kwargs"]))
    rebuilt.load_state_dict(load_file(str(path)), strict=True)
    loaded, read = structinit.load_init(path)
    assert read["model_kwargs"] == {**TINY, "in_chans": 3} and read["seed"] == 3 and read["method"] == "impulse"
    torch.manual_seed(3)  # `structinit init --seed` seeds the construction too
    in_process = timm.create_model("vit_tiny_patch16_224", **TINY)
    structinit.initialize(in_process, "impulse", seed=3)
    assert torch.equal(outputs(rebuilt), outputs(in_process)) and torch.equal(outputs(loaded), outputs(in_process))


def test_a_preset_is_recorded_with_what_it_expands_to(tmp_path):
    vit, mixer = tmp_path / "vit.safetensors", tmp_path / "convmixer.safetensors"
    assert main(["init", "vit_d6_p4", "--model-kwargs", "num_classes=10,depth=2", "--save", str(vit)]) == 0
    saved = record(vit)
    assert saved["preset"] == "vit_d6_p4" and saved["model"] == "vit_tiny_patch16_224"
    expanded = dict(img_size=32, patch_size=4, depth=2, num_classes=10, in_chans=3)
    assert json.loads(saved["model_kwargs"]) == expanded
    rebuilt = timm.create_model("vit_tiny_patch16_224", **expanded)
    rebuilt.load_state_dict(load_file(str(vit)), strict=True)
    assert torch.equal(outputs(rebuilt, 32), outputs(structinit.load_init(vit)[0], 32))

    # a preset of a class that timm builds by no name: the class and its keywords, rebuilt through the preset
    kwargs = ["--model-kwargs", "num_classes=10,depth=1,dim=32", "--init", "impulse"]
    assert main(["init", "convmixer_d6_p4", *kwargs, "--save", str(mixer)]) == 0
    saved = record(mixer)
    assert "model" not in saved and "missing" not in saved and saved["preset"] == "convmixer_d6_p4"
    assert saved["model_class"] == "timm.models.convmixer.ConvMixer"
    expanded = dict(dim=32, depth=1, patch_size=4, kernel_size=3, num_classes=10, in_chans=3)
    assert json.loads(saved["model_kwargs"]) == expanded
    rebuilt = ConvMixer(**expanded)
    rebuilt.load_state_dict(load_file(str(mixer)), strict=True)
    assert torch.equal(outputs(rebuilt, 32), outputs(structinit.load_init(mixer)[0], 32))


def test_save_init_refuses_a_record_load_init_could_not_rebuild_before_writing(tmp_path):
    model = timm.create_model("vit_tiny_patch16_224", **TINY)
    report = structinit.initialize(model, "impulse", seed=0)
    lacks = (
        "the record would lack the keywords it was built with, and load_init could not rebuild it: build it by "
        "name with timm.create_model and give save_init(..., model_kwargs=...) its keywords (or save it as .pt"
    )
    with pytest.raises(ValueError, match=re.escape(lacks)):
        structinit.save_init(model, tmp_path / "bare.safetensors", report)
    with pytest.raises(ValueError, match=r"the record builds another model than these weights \(\d+ of another shape"):
        structinit.save_init(model, tmp_path / "wide.safetensors", report, model_kwargs={**TINY, "embed_dim": 64})
    with pytest.raises(ValueError, match=r"model_kwargs act_layer: act_layer=<class .*SiLU'> cannot be recorded"):
        structinit.save_init(model, tmp_path / "act.safetensors", report, model_kwargs={**TINY, "act_layer": nn.SiLU})
    assert not list(tmp_path.iterdir())

    structinit.save_init(model, tmp_path / "whole.safetensors", report, model_kwargs=TINY)
    assert "missing" not in record(tmp_path / "whole.safetensors")
    assert torch.equal(outputs(structinit.load_init(tmp_path / "whole.safetensors")[0]), outputs(model))
    with pytest.raises(ValueError, match=r"whole.safetensors exists: give another file, or overwrite=True"):
        structinit.save_init(model, tmp_path / "whole.safetensors", report, model_kwargs=TINY)
    structinit.save_init(model, tmp_path / "whole.safetensors", report, model_kwargs=TINY, overwrite=True)

    convmixer = ConvMixer(dim=32, depth=1, kernel_size=3, patch_size=4, num_classes=10)  # no timm name
    with pytest.raises(ValueError, match="the record would lack the timm name and the keywords it was built with"):
        structinit.save_init(convmixer, tmp_path / "class.safetensors")

    structinit.save_init(model, tmp_path / "init.pt", report)
    with pytest.raises(ValueError, match=r"init.pt holds bare weights with no record of the model: load it into"):
        structinit.load_init(tmp_path / "init.pt")


def test_a_damaged_record_is_named_with_its_file(tmp_path):
    path = tmp_path / "init.safetensors"
    save_file({"w": torch.zeros(2)}, str(path), metadata={"model": "vit_tiny_patch16_224", "model_kwargs": "{img"})
    with pytest.raises(ValueError, match="^" + re.escape(f"{path} has a damaged record (not JSON where JSON belongs")):
        structinit.load_init(path)
    save_file({"w": torch.zeros(2)}, str(path), metadata={"model": "vit_tiny_patch16_224", "model_kwargs": "{}"})
    with pytest.raises(ValueError, match="its weights do not fit the model its record builds"):
        structinit.load_init(path)


def test_the_trainer_is_imported_on_first_use():
    code = (
        "import sys, structinit\n"
        "print(sorted(m for m in sys.modules if m.startswith(('structinit.training', 'structinit.studies', "
        "'structinit.experiment', 'structinit.data', 'matplotlib'))))\n"
        "print(structinit.train.__module__, structinit.compare.__module__, structinit.TrainConfig.__module__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    modules = "structinit.experiment structinit.experiment structinit.training.settings"
    assert done.stdout.splitlines() == ["[]", modules]


def python_example() -> str:
    """The Python block of docs/training.md's "From Python" section."""
    section = (DOCS / "training.md").read_text().split("\n## From Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the section holds one example"
    return blocks[0]


def test_the_documented_python_example_trains_and_compares_as_the_cli_does(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        exec(python_example(), names)
    assert not [str(w.message) for w in shown if issubclass(w.category, Notice)]  # it trips no notice of its own
    printed = capsys.readouterr().out
    run, grid = names["run"], names["grid"]

    assert isinstance(run, structinit.RunResult) and run.finished and run.out == Path("runs/py-impulse")
    summary = json.loads((run.out / "summary.json").read_text())
    assert run.summary == summary and run.split == "test" and run.top1 == summary["test_top1"]
    assert run.init_report == json.loads((run.out / "init_report.json").read_text())
    fidelity = summary["init"]["mean_fidelity"]
    assert printed.startswith(f"test top-1 {run.top1:.2f}% in runs/py-impulse, init fidelity {fidelity:.3f}\n")

    assert isinstance(grid, structinit.GridResult) and grid.out == Path("runs/py-grid")
    assert grid.table == (grid.out / "results.md").read_text() and grid.table in printed
    with open(grid.out / "results.csv") as f:
        rows = {row["init"]: float(row["top1"]) for row in csv.DictReader(f)}
    assert set(rows) == {"timm", "impulse"} and grid.top1("impulse") == [rows["impulse"]]
    assert printed.endswith(f"impulse, by seed: [{rows['impulse']}]\n")
    assert rows["impulse"] == round(run.top1, 3)  # the grid's run of the same settings

    # the command with the same settings trains the same run
    flags = ["--data", "digits", "--per-class", "20", "--model", "vit_digits", "--model-kwargs", "depth=2"]
    flags += ["--init", "impulse", "--epochs", "1", "--warmup-epochs", "0", "--batch-size", "50", "--quiet"]
    flags += ["--out", "cli"]
    assert main(["train", *flags]) == 0
    by_cli = json.loads(Path("cli/summary.json").read_text())
    for key in ("test_top1", "test_top5", "test_loss", "train_loss"):
        assert by_cli[key] == run.summary[key], key


def test_a_grids_top1_names_the_subset_sizes_to_choose_from(tmp_path):
    trained = [(10, 1, 40.0), (200, 0, 50.0), (10, 0, 30.0)]  # (per_class, seed, top-1) of a grid's impulse runs
    grid = structinit.GridResult(tmp_path, [dict(init="impulse", per_class=k, seed=s, top1=t) for k, s, t in trained])
    assert grid.top1("impulse", per_class=10) == [30.0, 40.0] and grid.top1("impulse", per_class=200) == [50.0]
    with pytest.raises(ValueError, match=f"^{re.escape(str(tmp_path))} trained impulse at per_class 10, 200: give"):
        grid.top1("impulse")
    assert grid.top1("timm") == []
