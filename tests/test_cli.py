import functools
import json
import subprocess
import sys

import pytest

from structinit.cli.commands import main, parse_assignments
from structinit.training.settings import TrainConfig

SMALL = ["--model-kwargs", "img_size=32,patch_size=4,num_heads=12,depth=2"]


def test_init_prints_the_report_and_writes_json(tmp_path, capsys):
    out = tmp_path / "report.json"
    code = main(
        [
            "init",
            "vit_tiny_patch16_224",
            *SMALL,
            "--init",
            "impulse[kernel_size=5,target_fidelity=0.98]",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "impulse init of VisionTransformer (seed 0)" in text and "worst head 0.98" in text
    data = json.loads(out.read_text())
    assert data["options"]["kernel_size"] == 5 and len(data["layers"]) == 2


def test_init_passes_method_options(capsys):
    assert (
        main(["init", "vit_tiny_patch16_224", *SMALL, "--init", "impulse[target_fidelity=0.9,assignment=ordered]"]) == 0
    )
    text = capsys.readouterr().out
    assert "mean 0.900" in text and "(+0,+0) 0.9" in text
    assert main(["init", "vit_tiny_patch16_224", *SMALL, "--method", "mimetic"]) == 0  # the old name of --init
    assert "mimetic init of VisionTransformer" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "hint"),
    [
        (
            ["init", "vit_tiny_patch16_224", "--options", "a=1"],
            "--options is gone: write the options in the init label",
        ),
        (["train", "--init-kwargs", "a=1"], "--init-kwargs is gone: write the options in the init label"),
        (
            ["compare", "--kernel-size", "5"],
            "--kernel-size is gone: write it in the init label: --init 'impulse[kernel",
        ),
    ],
)
def test_flags_of_0_1_say_where_their_setting_went(argv, hint, capsys):
    with pytest.raises(SystemExit) as exit:
        main(argv)
    assert exit.value.code == 2 and hint in capsys.readouterr().err


def test_list_options_shows_every_options_class_with_defaults_and_help(capsys):
    assert main(["init", "--list-options"]) == 0
    text = capsys.readouterr().out
    for name in ("MimeticOptions", "ImpulseOptions", "SwinImpulseOptions", "MixerImpulseOptions", "FilterOptions"):
        assert f"\n{name}: " in text
    assert "target_fidelity: float = 0.98\n      share of each query's attention on its target key" in text
    assert "solver: str (closed_form|refine|authors) = 'closed_form'" in text


def test_list_models_names_every_family_with_its_inits_and_the_presets_initialise(capsys, monkeypatch):
    from structinit.inspection import catalogue

    mixer = catalogue.EXAMPLES[catalogue.MixerAdapter]  # one family built: the others listed without fidelity
    monkeypatch.setattr(catalogue, "EXAMPLES", {catalogue.MixerAdapter: mixer})
    assert main(["init", "--list-models"]) == 0
    text = capsys.readouterr().out
    for family in ("VisionTransformer", "SwinTransformer v1", "MlpMixer", "ConvMixer", "rotary", "CaiT"):
        assert family in text
    assert "timm, kaiming, impulse\n      e.g. mixer_d6_p4 (preset): 1.000 / 1.000\n" in text
    assert "e.g. cait_xxs24_224: no small example (catalogue.EXAMPLES)" in text
    for preset in ("swin_d6_p2_w4", "mixer_d6_p4"):
        assert main(["init", preset, "--model-kwargs", "img_size=32,num_classes=10"]) == 0
        assert "fidelity on" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="give a model name"):
        main(["init"])


def test_errors_are_one_line_and_exit_2(capsys):
    assert main(["init", "vit_tiny_patch16_224", *SMALL, "--init", "impulse[kernel_size=11]"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("structinit init: error: kernel_size 11 does not fit the 8x8 token grid")
    assert "Traceback" not in err
    assert main(["init", "no_such_model"]) == 2
    assert "Unknown model (no_such_model)" in capsys.readouterr().err
    assert main(["init", "vit_tiny_patch16_224", "--init", "impulse[nope]"]) == 2
    assert "init label 'impulse[nope]': expected key=value, got 'nope'" in capsys.readouterr().err
    assert main(["init", "vit_tiny_patch16_224", "--init", "default"]) == 2
    assert "--init default: leaves the model as constructed" in capsys.readouterr().err
    assert main(["compare", "--inits", "timm,impulse[target_fidelity=0.9],xavier", "--out", "unused"]) == 2
    assert "unknown init 'xavier'" in capsys.readouterr().err


def test_parse_assignments_keeps_brackets_together():
    assert parse_assignments("img_size=(32,48),depth=6,global_pool=avg", "x") == {
        "img_size": (32, 48),
        "depth": 6,
        "global_pool": "avg",
    }


def test_python_dash_m_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "structinit", "init", "vit_tiny_patch16_224", *SMALL, "--method", "timm"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "timm init of VisionTransformer" in result.stdout


def test_a_missing_extra_is_named_in_one_line_and_other_import_errors_are_not_hidden(monkeypatch, capsys):
    from structinit.cli import commands as cli

    def needs(module):
        def command(args):
            raise ModuleNotFoundError(f"No module named '{module}'", name=module)

        return command

    monkeypatch.setitem(cli.COMMANDS, "rank", needs("matplotlib.pyplot"))
    assert cli.main(["rank", "vit_digits"]) == 2
    assert capsys.readouterr().err.strip() == (
        "structinit rank: error: this needs matplotlib.pyplot: pip install 'structinit-vit[train]'"
    )
    monkeypatch.setitem(cli.COMMANDS, "rank", needs("a_typo_in_structinit"))
    with pytest.raises(ModuleNotFoundError, match="a_typo_in_structinit"):
        cli.main(["rank", "vit_digits"])


def test_demo_trains_every_init_on_the_digits_and_draws_each_on_the_pseudo_input_and_images(
    tmp_path, capsys, monkeypatch
):
    from structinit.cli import demo

    # the demo's four runs, tables and figures on a tenth of the digits and one block (`make demo`: the full size)
    small = functools.partial(TrainConfig, train_fraction=0.1, model_kwargs={"depth": 1}, batch_size=50)
    monkeypatch.setattr(demo, "TrainConfig", small)
    out = tmp_path / "demo"
    assert main(["demo", "--epochs", "1", "--quiet", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    from structinit.studies.grid import run_dir

    for init in ("timm", "mimetic[base=kaiming]", "impulse", "impulse-soft"):  # the default init among them
        assert f"| {init} | 1 |" in printed and (run_dir(out, None, init, 0) / "summary.json").exists()
    for init in ("timm", run_dir(out, None, "mimetic[base=kaiming]", 0).name.removesuffix("-seed0"), "impulse"):
        for figure in ("init-pseudo", "init", None):  # at init on the pseudo input and on images; trained
            assert (out / ("-".join(filter(None, ("attention", init, figure))) + ".png")).stat().st_size > 0
    assert "4 runs in" in printed


def test_a_run_parses_its_init_label_once(tmp_path, monkeypatch):
    """The config, the trainer, the model and the report all take the label's InitSpec, which is read
    from the text once per process (a label new to this process here, so that no earlier test read it)."""
    from structinit.inits import labels

    parsed, real = [], labels.read_label

    def counted(label):
        parsed.append(label)
        return real(label)

    monkeypatch.setattr(labels, "read_label", counted)
    label = "impulse-soft[kernel_size=5,qk_scale=1.25]"
    argv = ["train", "--per-class", "10", "--epochs", "1", "--batch-size", "50", "--model-kwargs", "depth=1"]
    assert main([*argv, "--init", label, "--quiet", "--out", str(tmp_path / "run")]) == 0
    assert parsed == [label]
    options = json.loads((tmp_path / "run" / "init_report.json").read_text())["options"]
    assert (options["kernel_size"], options["target_fidelity"], options["qk_scale"]) == (5, 0.3, 1.25)
    spec = labels.InitSpec.parse(label)
    with pytest.raises(TypeError):
        spec.options["qk_scale"] = 2  # shared by every caller: read only
