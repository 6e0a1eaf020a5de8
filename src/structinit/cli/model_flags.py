"""The model's flags as timm writes them: `--model-kwargs` in timm's spaced form (`a=1 b=2`) as well as
structinit's comma form, and `init`'s `--num-classes`/`--img-size` beside them."""

from __future__ import annotations

import argparse
from typing import Any

from ..inits.labels import parse_assignments


class Assignments(argparse.Action):
    """`--model-kwargs a=1 b=2` (timm's train.py) or `--model-kwargs a=1,b=2`: one K=V,... text; given again,
    its items join the earlier ones (a key given twice is refused when the text is read)."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[override]
        loose = [value for value in values if "=" not in value]
        if loose:
            parser.error(
                f"{option_string} takes K=V items (a=1 b=2, or a=1,b=2); {loose[0]!r} is not one "
                "(a folder goes before the flag: structinit train DIR --model-kwargs ...)"
            )
        earlier = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, ",".join([earlier, *values] if earlier else values))


ASSIGNMENTS = {"nargs": "+", "action": Assignments}


# a preset named for its data: `init` builds it for that data's classes and channels, as `train` does, so
# that `init vit_digits --save` feeds `train --data digits --initial-checkpoint`
PRESET_DATA = {"vit_digits": (10, 1)}


def init_model_kwargs(args: argparse.Namespace) -> tuple[dict[str, Any], int, int]:
    """`init`'s timm keywords, classes and channels: --model-kwargs, with --num-classes and --img-size
    (which must agree with the keywords where both name one); a preset named for its data takes its data's."""
    kwargs = parse_assignments(args.model_kwargs, "--model-kwargs")
    for name, value in (("num_classes", args.num_classes), ("img_size", args.img_size)):
        if value is None:
            continue
        if name in kwargs and kwargs[name] != value:
            raise ValueError(f"--{name.replace('_', '-')} {value} and --model-kwargs {name}={kwargs[name]}: give one")
        kwargs[name] = value
    classes, channels = PRESET_DATA.get(getattr(args, "model", None) or "", (1000, 3))  # else timm's defaults
    return kwargs, kwargs.pop("num_classes", classes), kwargs.pop("in_chans", channels)
