"""What `structinit init --list-models` and `--list-options` print: the families and presets, and every
init method's options, read from the registry."""

from __future__ import annotations


def supported_models(markdown: bool = False) -> str:
    """The families structinit initialises, read from its registry: their init methods and the impulse
    init's fidelity on a small example each (inspection/catalogue.py), then the presets; or, with
    `markdown`, the table of docs/families.md."""
    from ..inspection import catalogue
    from ..models import PRESETS, preset_size

    rows = catalogue.rows()
    if markdown:
        return catalogue.markdown(rows)
    lines = [
        catalogue.text(rows),
        "presets for small images (give the size: structinit init NAME --model-kwargs img_size=32):",
    ]
    width = max(map(len, PRESETS))
    lines += [f"  {name:<{width}}  {preset_size(name)}" for name in PRESETS]
    return "\n".join(lines)


def options_help() -> str:
    """Every init method's options, once per options class: `structinit init --list-options`."""
    from ..inits.options import FilterOptions, NoOptions
    from ..inits.registry import FAMILIES, VIT_FAMILY

    classes = [init.options for family in (VIT_FAMILY, *FAMILIES) for init in family.methods.values()]
    lines = [
        "init options go in the label's brackets, e.g. impulse[target_fidelity=0.9,kernel_size=5]; every method "
        "also takes kernel_size, the f of the f x f kernel (default 3; ConvMixer: its own)"
    ]
    for cls in dict.fromkeys([*classes, FilterOptions]):
        if cls is NoOptions:
            continue
        summary = " ".join((cls.__doc__ or "").split())
        lines.append(f"\n{cls.__name__}: {summary}")
        lines += ["  " + line.replace("\n", "\n  ") for line in cls.describe()]
    return "\n".join(lines)
