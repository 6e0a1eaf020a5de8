"""Init labels: methods, named variants, options in brackets, and their errors."""

import dataclasses
import math

import pytest
import torch

import structinit
from conftest import small_vit
from structinit.inits.labels import DEFAULT, VARIANTS, InitSpec, split_top_level, with_options
from structinit.inits.options import FilterOptions, ImpulseOptions, MimeticOptions
from test_families import small_swin


def parse_init(label):
    """(method, options with the kernel size among them) of a label."""
    spec = InitSpec.parse(label)
    size = {} if spec.kernel_size is None else {"kernel_size": spec.kernel_size}
    return spec.method, {**spec.options, **size}


def test_a_method_a_variant_and_options_in_brackets():
    assert parse_init("timm") == ("timm", {})
    assert parse_init("impulse-neurips") == ("impulse", VARIANTS["impulse-neurips"][1])
    assert parse_init("impulse[target_fidelity=0.9,pos_scale=None,assignment=ordered]") == (
        "impulse",
        {"target_fidelity": 0.9, "pos_scale": None, "assignment": "ordered"},
    )
    method, options = parse_init("impulse-neurips[qk_scale=2,blind_to_content=True]")
    assert method == "impulse" and options["solver"] == "authors"
    assert options["qk_scale"] == 2 and options["blind_to_content"] is True  # brackets override the variant
    assert parse_init("default") == (DEFAULT, {})
    spec = InitSpec.parse("impulse-soft[kernel_size=5]")
    assert (spec.method, spec.kernel_size, spec.label) == ("impulse", 5, "impulse-soft[kernel_size=5]")
    assert "kernel_size" not in spec.options and not spec.is_default and InitSpec.parse("default").is_default


@pytest.mark.parametrize(
    "label, message",
    [
        (
            "xavier",
            "unknown init 'xavier'; choose from auto, box, conditioned, default, impulse, impulse-neurips, "
            "impulse-soft, kaiming, mimetic, mimetic-vo, qk-norm, random, select, sinusoidal, timm",
        ),
        ("impulse[target_fidelity=0.9", "options go in brackets at the end"),
        ("impulse[0.9]", "expected key=value, got '0.9'"),
        ("default[seed=1]", "'default' takes no options"),
    ],
)
def test_bad_labels(label, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        parse_init(label)


def test_labels_with_options_survive_the_comma_split():
    assert split_top_level("timm, impulse[a=1,b=(2,3)],mimetic") == ["timm", "impulse[a=1,b=(2,3)]", "mimetic"]


# --- the options classes: each option defined once, for the call, the labels and the CLI -------------


def same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_an_options_object_and_keywords_give_the_same_weights_and_report():
    torch.manual_seed(0)
    by_keywords = small_vit()
    torch.manual_seed(0)
    by_object = small_vit()  # what the init leaves (MLPs, head) is timm's draw: seeded alike
    a = structinit.initialize(by_keywords, "impulse", seed=4, target_fidelity=0.9, assignment="ordered")
    b = structinit.initialize(by_object, ImpulseOptions(target_fidelity=0.9, assignment="ordered"), seed=4)
    assert same_weights(by_keywords, by_object)
    assert a.options == b.options
    assert b.method == "impulse" and b.options["target_fidelity"] == 0.9 and b.options["solver"] == "closed_form"


def test_the_report_records_every_default_of_the_class():
    report = structinit.initialize(small_vit(), "mimetic", seed=0)
    assert report.options == {"kernel_size": 3, **dataclasses.asdict(MimeticOptions())}
    report = structinit.initialize(small_vit(), "impulse", seed=0)
    assert report.options == {"kernel_size": 3, **dataclasses.asdict(ImpulseOptions())}


def test_options_objects_that_do_not_fit_the_call():
    with pytest.raises(TypeError, match="this model's 'impulse' init takes SwinImpulseOptions, got ImpulseOptions"):
        structinit.initialize(small_swin(), ImpulseOptions())
    with pytest.raises(TypeError, match="FilterOptions serves several methods"):
        structinit.initialize(small_vit(), FilterOptions(freeze=True))
    with pytest.raises(TypeError, match="as an options object or as keywords, not both"):
        structinit.initialize(small_vit(), ImpulseOptions(), target_fidelity=0.9)


@pytest.mark.parametrize(
    ("values", "error", "message"),
    [
        (dict(target_fidelity=math.nan), ValueError, r"target_fidelity must be in \(0, 1\) or None, got nan"),
        (dict(refine_steps=2.5), TypeError, "option refine_steps of the impulse init takes an integer, got 2.5"),
        (dict(propagate=1), TypeError, "option propagate of the impulse init takes True or False, got 1"),
        (dict(assignment=3), TypeError, "option assignment of the impulse init takes text, got 3"),
        (
            dict(noise_std=-1),
            ValueError,
            r"noise_std must be in \[0, 1e\+06\] \(larger ones overflow float32 weights\), got -1",
        ),
    ],
)
def test_every_value_is_checked_when_the_options_are_made(values, error, message):
    with pytest.raises(error, match=message):
        ImpulseOptions(**values)


def test_labels_are_checked_against_the_options_of_any_family():
    with pytest.raises(
        TypeError, match=r"unknown option\(s\) target_fidlity for method 'impulse'; its options are: "
    ) as error:
        parse_init("impulse[target_fidlity=0.3]")
    listed = str(error.value).split("its options are: ")[1].split(", ")
    assert "target_fidelity" in listed and "unit_bias" in listed and "freeze" in listed  # every family's
    assert "method" not in listed and "what" not in listed  # class attributes, not options
    with pytest.raises(ValueError, match=r"target_fidelity must be in \(0, 1\) or None, got 2"):
        parse_init("impulse[target_fidelity=2]")
    assert parse_init("impulse[unit_bias=2.0]") == ("impulse", {"unit_bias": 2.0})  # MLP-Mixer's impulse
    assert parse_init("random[freeze=True]") == ("random", {"freeze": True})  # ConvMixer's filters
    assert parse_init("timm[kernel_size=5]") == ("timm", {"kernel_size": 5})  # every method measures at f


def test_with_options_adds_to_a_label_and_reads_back():
    label = with_options("impulse[target_fidelity=0.3]", {"assignment": "ordered", "pos_scale": None})
    assert label == "impulse[target_fidelity=0.3,assignment=ordered,pos_scale=None]"
    assert parse_init(label) == ("impulse", {"target_fidelity": 0.3, "assignment": "ordered", "pos_scale": None})
    assert with_options("timm", {}) == "timm"
