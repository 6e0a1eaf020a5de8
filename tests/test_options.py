"""Init labels: methods, named variants, options in brackets, and their errors."""

import pytest

from structinit.options import DEFAULT, VARIANTS, parse_init, split_top_level


def test_a_method_a_variant_and_options_in_brackets():
    assert parse_init("timm") == ("timm", {})
    assert parse_init("impulse-authors") == ("impulse", VARIANTS["impulse-authors"][1])
    assert parse_init("impulse[target_fidelity=0.9,pos_scale=None,assignment=ordered]") == (
        "impulse",
        {"target_fidelity": 0.9, "pos_scale": None, "assignment": "ordered"},
    )
    method, options = parse_init("impulse-authors[qk_scale=2,blind_to_content=True]")
    assert method == "impulse" and options["solver"] == "authors"
    assert options["qk_scale"] == 2 and options["blind_to_content"] is True  # brackets override the variant
    assert parse_init("default") == (DEFAULT, {})


@pytest.mark.parametrize(
    "label, message",
    [
        (
            "xavier",
            "unknown init 'xavier'; choose from box, default, impulse, impulse-authors, kaiming, mimetic, random, timm",
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
