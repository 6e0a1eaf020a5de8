"""timm's train.py flags with timm's meaning (issue 76): the cool-down after --epochs, --lr-base, --layer-decay,
--drop, a bare --amp and --amp-dtype, --model-ema-decay alone, the authors' fork's init keywords, --resume PATH,
and the table of every other flag: taken, accepted with a note, or refused in one line."""

import json

import pytest

from structinit.cli import main
from structinit.cli.parser import build_parser
from structinit.cli.timm_flags import NOTED, REFUSED, SWITCH, TAKEN, TIMM_FLAGS
from structinit.cli.train_flags import train_config
from structinit.errors import Notice
from structinit.inits.fork_kwargs import fork_init
from structinit.training.config_file import config_values
from structinit.training.settings import TrainConfig
from test_trust import FLAGS, files, one_line

TINY = FLAGS


def config_of(*argv: str) -> TrainConfig:
    return train_config(build_parser().parse_args(["train", *argv]))


def epochs_of(run) -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "event" not in r]


def test_the_cooldown_follows_the_epochs_at_the_min_lr(tmp_path):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--epochs", "2", "--cooldown-epochs", "2", "--warmup-epochs", "0", "--min-lr", "1e-5"]
    assert main([*argv, "--out", str(out)]) == 0  # refused before: the cool-down counted inside --epochs
    lrs = [e["lr"] for e in epochs_of(out)]
    assert len(lrs) == 4 and lrs[0] > 1e-5 and lrs[1:] == pytest.approx([1e-5] * 3)  # logged after each epoch
    assert json.loads((out / "summary.json").read_text())["finished"]


def test_a_run_recorded_before_0_6_keeps_its_schedule():
    old = {**{k: v for k, v in TrainConfig().__dict__.items() if k not in ("lr_base_size", "layer_decay")}}
    old.update(epochs=300, cooldown_epochs=10, resume=False)
    for key in ("lr_base", "lr_base_scale", "drop_rate", "aug_repeats"):
        old.pop(key)
    config = TrainConfig(**config_values(old, "last.pt"))
    assert (config.epochs, config.cooldown_epochs, config.total_epochs) == (290, 10, 300)  # its 300 epochs
    today = {**TrainConfig(epochs=300, cooldown_epochs=10).__dict__}
    assert TrainConfig(**config_values(today, "config.yaml")).total_epochs == 310
    assert config_values({"epochs": 300, "cooldown_epochs": 10}, "--config f")["epochs"] == 300  # a settings file


def test_model_ema_decay_alone_keeps_no_ema_as_timm():
    with pytest.warns(Notice, match="without --model-ema: no EMA, as in timm"):
        assert config_of("--model-ema-decay", "0.99").ema_decay is None
    assert config_of("--model-ema", "--model-ema-decay", "0.99").ema_decay == 0.99
    assert config_of("--ema-decay", "0.9").ema_decay == 0.9


def test_a_bare_amp_and_timms_dtypes():
    assert config_of("--amp").amp == "auto"
    assert config_of("--amp", "--amp-dtype", "bfloat16").amp == "bf16"
    assert config_of("--amp-dtype", "float16").amp == "fp16"
    assert config_of("--amp", "none").amp == "none"
    with pytest.raises(ValueError, match="--amp none and --amp-dtype float16: give one"):
        config_of("--amp", "none", "--amp-dtype", "float16")


def test_layer_decay_and_drop_reach_timms_optimiser_and_model():
    import torch

    from structinit.training.device import Dist
    from structinit.training.recipe import Recipe, data_of

    config = config_of(*TINY, "--layer-decay", "0.5", "--drop", "0.3")
    recipe = Recipe(config, data_of(config), torch.device("cpu"), Dist(0, 1, 0))
    scales = sorted({g["lr_scale"] for g in recipe.optimizer.param_groups})
    assert scales[0] < scales[-1] == 1.0  # the head at the lr, each block below it decayed
    assert recipe.model.head_drop.p == 0.3  # timm's drop_rate


@pytest.mark.parametrize(
    "kwargs, label, rest",
    [
        ({"weight_init": "skip", "post_weight_init": "impulse"}, "impulse-neurips", {}),
        ({"weight_init": "skip", "post_weight_init": "mimetic"}, "mimetic[base=kaiming]", {}),
        ({"weight_init": "skip", "post_weight_init": "default"}, "kaiming", {}),
        ({"post_weight_init": "impulse"}, "impulse-neurips[base=keep]", {}),
        ({"weight_init": "jax", "post_weight_init": "mimetic"}, "mimetic", {"weight_init": "jax"}),
        ({"weight_init": "moco"}, "default", {"weight_init": "moco"}),
    ],
)
def test_the_authors_fork_init_keywords_as_labels(kwargs, label, rest):
    assert fork_init({"img_size": 224, **kwargs}) == (label, {"img_size": 224, **rest})


def test_the_fork_keywords_and_init_together_are_refused(capsys, tmp_path):
    argv = ["train", *FLAGS, "--model-kwargs", "weight_init=skip", "post_weight_init=impulse", "--init", "timm"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 2
    one_line(capsys, "sets the init, as --init does: give one")
    with pytest.raises(ValueError, match=r"post_weight_init is the authors' fork's .*give --init impulse-neurips"):
        TrainConfig(model_kwargs={"weight_init": "skip", "post_weight_init": "impulse"})
    with pytest.raises(ValueError, match="timm's ViTs take"):
        config_of("--model-kwargs", "weight_init=xavier")


def test_lr_base_and_lr_together_take_lr_as_timm():
    with pytest.warns(Notice, match="--lr-base 0.1 is unused"):
        config = config_of("--lr", "0.002", "--lr-base", "0.1")
    assert (config.lr_base, config.peak_lr) == (None, 0.002)


def test_resume_takes_a_runs_directory_or_its_last_pt(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *TINY, "--epochs", "3", "--stop-after", "1", "--out", str(out)]) == 0
    assert main(["train", "--resume", str(out / "last.pt"), "--stop-after", "2", "--quiet"]) == 0
    assert main(["train", "--resume", str(out), "--quiet"]) == 0
    assert [e["epoch"] for e in epochs_of(out)] == [1, 2, 3]
    before = files(out)
    capsys.readouterr()
    assert main(["train", "--resume", str(out), "--out", str(tmp_path / "other")]) == 2
    one_line(capsys, "name different runs: give one")
    assert files(out) == before


def test_experiment_names_the_run_under_output():
    assert config_of("--output", "runs", "--experiment", "vit").out == "runs/vit"


def test_every_timm_flag_is_taken_noted_or_refused(tmp_path, capsys):
    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    options = {o: a for a in train._actions for o in a.option_strings}
    assert len(TIMM_FLAGS) >= 150  # timm 1.0.22's train.py, as the fork ships it
    for name, (kind, nargs, text, _) in TIMM_FLAGS.items():
        assert name in options, name
        value = [] if nargs == SWITCH else ["1"] if nargs is None else ["1", "2"]
        if kind == REFUSED:
            out = tmp_path / "refused"
            with pytest.raises(SystemExit) as refusal:  # refused as the flags are read, before anything is made
                main(["train", *FLAGS, name, *value, "--out", str(out)])
            assert refusal.value.code == 2, name
            one_line(capsys, f"{name} (timm's train.py) is not taken: {text}")
            assert not out.exists()
        elif kind == NOTED:
            with pytest.warns(Notice, match="accepted, changing nothing"):
                config_of(name, *value)
        else:
            assert kind == TAKEN
