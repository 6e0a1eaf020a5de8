"""The `structinit` command."""

from __future__ import annotations

import argparse
import ast
import json
import sys
from typing import Any

from .methods import METHODS


def parse_assignments(text: str | None, what: str) -> dict[str, Any]:
    """'a=1,b=x,c=(32,48)' -> {'a': 1, 'b': 'x', 'c': (32, 48)}; values are Python literals or strings."""
    result: dict[str, Any] = {}
    if not text:
        return result
    for item in _split_top_level(text):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{what}: expected key=value, got {item!r}")
        try:
            result[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            result[key.strip()] = value.strip()
    return result


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets, so that img_size=(32,48) stays whole."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p for p in parts if p.strip()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="structinit", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="build a timm model, initialise it and print the report")
    init.add_argument("model", help="timm model name, e.g. vit_tiny_patch16_224")
    init.add_argument("--method", default="impulse", choices=sorted(METHODS))
    init.add_argument("--kernel-size", type=int, default=3)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--model-kwargs", help="timm.create_model keywords, e.g. img_size=32,patch_size=4,num_heads=12")
    init.add_argument("--options", help="method options, e.g. target_fidelity=0.9,assignment=ordered")
    init.add_argument("--json", metavar="PATH", help="also write the report as JSON")
    return parser


def run_init(args: argparse.Namespace) -> int:
    import timm

    from .methods import initialize

    model_kwargs = parse_assignments(args.model_kwargs, "--model-kwargs")
    options = parse_assignments(args.options, "--options")
    try:
        model = timm.create_model(args.model, **model_kwargs)
    except RuntimeError as error:  # timm's "Unknown model"
        raise ValueError(str(error)) from None
    report = initialize(model, args.method, kernel_size=args.kernel_size, seed=args.seed, **options)
    print(report)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report.to_dict(), f, indent=2)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"init": run_init}[args.command](args)
    except (ValueError, TypeError) as error:
        print(f"structinit {args.command}: error: {error}", file=sys.stderr)
        return 2
