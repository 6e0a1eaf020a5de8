"""The invariant harness's cases (invariants.py): every flag of every `structinit` command, read from its parser, with
values drawn by kind (switch, choice, int, float, text, path), init labels drawn from the init registry, and every
path a command reads or writes in a hostile state (a FIFO, a device, a socket, a link, a sparse huge file, a damaged
or edited record, NaN or odd-dtype tensors, another run's files). A flag that names a path must be given a role in
ROLES: tests/test_invariants.py fails on one that is not."""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from hypothesis import strategies as st

from structinit.cli.parser import build_parser
from structinit.inits.labels import VARIANTS
from structinit.inits.names import METHOD_NAMES

TINY = ["--model-kwargs", "depth=1,embed_dim=32,num_heads=2"]
RUN = [*TINY, "--per-class", "5", "-b", "25", "--quiet", "--epochs", "1"]
GRID = ["--inits", "timm,impulse", "--seeds", "0"]
# each command at its least on the embedded digits: a second or a few; {dest} a positional the cases may replace
BASE = {
    "init": ["init", "{model}", *TINY],
    "train": ["train", *RUN, "--out", "out"],
    "compare": ["compare", *RUN, *GRID, "--out", "out"],
    "choose": ["choose", *RUN, "--out", "out"],
    "attention": ["attention", "{target}", "--images", "8", "--out", "out.png"],
    "rank": ["rank", "{target}", "--images", "8", "--out", "out.png"],
    "upgrade-checkpoint": ["upgrade-checkpoint", "{checkpoints}"],
    "demo": ["demo", "--epochs", "1", "--quiet", "--out", "out"],
    # lines of a command in a state of its own: the fixture run (one epoch) resumed to two; a grid trained again at
    # another learning rate; a comparison made again
    "train --resume": ["train", "--resume", "--epochs", "2", "--quiet", "--out", "{out}"],
    "compare --rerun": ["compare", *RUN, *GRID, "--lr", "0.002", "--rerun", "--out", "grid"],
    "choose --rerun": ["choose", *RUN, "--rerun", "--out", "chosen"],
}
LAZY_FIXTURES = {  # what those lines find, made the first time a line names it
    "grid": ["compare", *RUN, *GRID, "--out", "grid"],
    "chosen": ["choose", *RUN, "--out", "chosen"],
}
POSITIONAL_DEFAULTS = {"model": "vit_digits", "target": "run", "checkpoints": "run/last.pt", "out": "run"}
COMMANDS = tuple(BASE)

# what each flag that names a path reads or writes (fixtures and hostile states: invariant_checks.Scratch)
ROLES = {
    "out": "output",
    "save": "output-file",
    "json": "output-file",
    "cache_dir": "output",
    "config": "config",
    "initial_checkpoint": "weights",
    "teacher": "weights",
    "folder": "images",
    "data_root": "images",
    "data": "data-spec",
    "target": "run",
    "checkpoints": "checkpoint",
}
PATHLIKE = re.compile(r"(dir|path|file|folder|root|out|save|json|config|checkpoint|teacher|target|data)", re.I)
# flags whose large valid values are long work by request (a run of 10^9 epochs), not a hang: kept small; a flag of
# LONG_FLAGS (torch.compile: a minute a run on a CPU) is drawn only with --deep's longer timeout
LONG_BY_REQUEST = {"epochs", "minutes", "cooldown_epochs", "timeout_min", "images", "stop_after", "warmup_epochs"}
LONG_FLAGS = {"compile", "compile_mode"}  # each compiles the model: drawn only with --deep

GENERIC_STATES = (
    "absent", "empty-file", "garbage-file", "fifo", "socket", "device", "link-outside", "dangling-link",
    "empty-dir", "sparse-huge",
)  # fmt: skip
RUN_STATES = ("edit-json", "edit-yaml", "edit-jsonl", "padded-metrics", "truncated-checkpoint", "no-checkpoint")
ROLE_STATES = {
    "output": ("valid", "another-run", "link-outside-dir", *RUN_STATES),
    "output-file": ("existing-file",),
    "config": ("valid", "edit-yaml", "yaml-alias-bomb", "yaml-list"),
    "weights": (
        "valid",
        "nan-tensor",
        "inf-tensor",
        "int-tensor",
        "wrong-shape",
        "truncated",
        "bad-header",
        "huge-shape-header",
        "run-checkpoint",
    ),
    "images": (
        "valid",
        "non-image-file",
        "corrupt-image",
        "empty-class",
        "val-and-validation",
        "unicode-twins",
        "link-in-tree",
    ),
    "run": (
        "valid",
        "edit-json",
        "edit-yaml",
        "edit-jsonl",
        "padded-metrics",
        "truncated-checkpoint",
        "no-checkpoint",
        "another-run",
    ),
    "checkpoint": ("valid", "truncated-checkpoint"),
}
ROLE_STATES["data-spec"] = ROLE_STATES["images"]

INTS = ("-1", "0", "1", "2", "3", "7", "2147483648", str(2**63), str(10**30), "1.5", "nan", "", " 1", "0x10", "١")
SMALL_INTS = ("-1", "0", "1", "2", "1.5", "nan", "", "1e3")  # no huge value: a run of 2**63 epochs is long by request
FLOATS = ("-1", "0", "1e-9", "0.5", "1", "2", "1e6", "nan", "inf", "-inf", "1e308", "1e400", "", "0,5")
TEXT = ("", " ", "x", "a,b", "[", "]", "=", "a=1", "none", "☃", "x" * 5000, "-", "..", "/", "0", "nan")
MODEL_KWARGS = ("depth=0", "depth=100000", "embed_dim=0", "num_heads=3", "embed_dim=33", "img_size=1",
                "patch_size=64", "num_heads=0", "mlp_ratio=nan", "depth=1,embed_dim=32,num_heads=2,qkv_bias=maybe",
                "class_token=False", "global_pool=avg", "embed_dim=2,num_heads=1", "depth=1e9")  # fmt: skip
MODELS = ("vit_digits", "vit_tiny_fit", "vit_tiny_patch16_224", "mixer_s16_224", "convmixer_768_32",
          "swin_tiny_patch4_window7_224", "nope", "", "resnet18", "deit_tiny_patch16_224")  # fmt: skip
OPTION_VALUES = ("-1", "0", "nan", "inf", "1e308", "", "x", "true", "maybe", "[", "1,2", "ordered", "none")


@dataclasses.dataclass(frozen=True)
class Flag:
    """One action of a command's parser, as the harness draws it."""

    command: str
    dest: str
    options: tuple[str, ...]  # empty: a positional
    kind: str  # switch, choice, int, float, text, labels, kwargs, model, or a path role
    nargs: Any
    choices: tuple[str, ...] = ()
    default: Any = None


@dataclasses.dataclass(frozen=True)
class Case:
    """A command line and the states of the paths it names (each made in the scratch tree first)."""

    command: str
    argv: list[str]
    states: dict[str, str]  # a path's place in the tree -> its state (and role)
    roles: dict[str, str]


def catalogue() -> dict[str, list[Flag]]:
    """Every command's flags, read from the parser (help and version left out)."""
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, list[Flag]] = {}
    for name, sub in commands.choices.items():
        found[name] = [_flag(name, a) for a in sub._actions if not isinstance(a, argparse._HelpAction)]
    return found


def _flag(command: str, action: argparse.Action) -> Flag:
    choices = tuple(map(str, action.choices)) if action.choices else ()
    kind = kind_of(action)
    return Flag(command, action.dest, tuple(action.option_strings), kind, action.nargs, choices, action.default)


def kind_of(action: argparse.Action) -> str:
    if action.dest in ROLES:
        return ROLES[action.dest]
    if action.dest in LONG_FLAGS:
        return "long"
    if action.nargs == 0:
        return "switch"
    if action.choices:
        return "choice"
    if action.type is int:
        return "small-int" if action.dest in LONG_BY_REQUEST else "int"
    if action.type is float:
        return "small-float" if action.dest in LONG_BY_REQUEST else "float"
    return {"init": "labels", "inits": "labels", "structured": "labels", "model_kwargs": "kwargs"}.get(
        action.dest, "model" if action.dest == "model" else "text"
    )


def unclassified_paths() -> list[str]:
    """Flags that look like paths (by name or metavar) but have no role: each must be given one in ROLES."""
    missing = []
    for command, flags in catalogue().items():
        for flag in flags:
            if flag.kind in ("text", "model") and PATHLIKE.search(flag.dest) and not not_a_path(flag.dest):
                missing.append(f"{command} {flag.options[0] if flag.options else flag.dest}")
    return missing


# names that look like paths and are not: a model's name (a preset or timm's)
NOT_PATHS = {"model"}


def not_a_path(dest: str) -> bool:
    """A model's name, or one of timm's train.py flags that train notes or refuses (cli/timm_flags.py): none is read."""
    return dest in NOT_PATHS or dest.startswith("timm_")


def init_labels() -> st.SearchStrategy[str]:
    """Init labels from the registry: a method or variant, with options from its options classes and values
    both sound and hostile."""
    from structinit.inits.registry import option_classes

    names = sorted(METHOD_NAMES) + list(VARIANTS) + ["default", "auto"]
    option_names = sorted(
        {f.name for m in METHOD_NAMES for c in option_classes(m) for f in dataclasses.fields(c)} | {"kernel_size"}
    )
    option = st.tuples(st.sampled_from(option_names), st.sampled_from(OPTION_VALUES)).map("=".join)
    with_options = st.tuples(st.sampled_from(names), st.lists(option, max_size=2)).map(
        lambda p: f"{p[0]}[{','.join(p[1])}]" if p[1] else p[0]
    )
    return st.one_of(st.sampled_from(names), with_options, st.sampled_from(TEXT))


SOUND = {"int": ("1", "2", "3"), "small-int": ("1", "2"), "float": ("0.1", "0.5", "1"), "small-float": ("0.01",)}


def values(flag: Flag) -> st.SearchStrategy[list[str]]:
    """The tokens after a flag (or of a positional): drawn by its kind, sound or hostile alike (sound values
    reach what lies past the checks of the flags); a path's are made by Scratch."""
    hostile = {
        "choice": st.sampled_from((*flag.choices, "", "x")),
        "int": st.sampled_from(INTS),
        "small-int": st.sampled_from(SMALL_INTS),
        "float": st.sampled_from(FLOATS),
        "small-float": st.sampled_from(("-1", "0", "0.01", "nan", "inf", "")),
        "text": st.sampled_from(TEXT),
        "labels": st.one_of(init_labels(), st.lists(init_labels(), min_size=2, max_size=3).map(",".join)),
        "kwargs": st.sampled_from(MODEL_KWARGS),
        "model": st.sampled_from(MODELS),
    }.get(flag.kind)
    if flag.kind == "switch" or (flag.kind == "long" and not flag.choices):
        return st.just([])
    if flag.kind == "long":
        return st.sampled_from(flag.choices).map(lambda choice: [choice])
    sound = SOUND.get(flag.kind) or flag.choices or ((str(flag.default),) if isinstance(flag.default, str) else ())
    # sound twice as often as hostile: a case of one to three flags then often passes their checks
    one = (
        st.one_of(hostile, st.sampled_from(sound), st.sampled_from(sound)) if hostile is not None and sound else hostile
    )
    if one is None:  # a path: the scratch tree makes it in its drawn state (its valid fixture as often as not)
        states = st.sampled_from(GENERIC_STATES + ROLE_STATES[flag.kind])
        valid = "valid" in ROLE_STATES[flag.kind]
        return (st.one_of(states, st.just("valid")) if valid else states).map(lambda state: [f"@{state}"])
    count = flag.nargs if isinstance(flag.nargs, int) else 1
    return st.lists(one, min_size=count, max_size=count)


@st.composite
def cases(draw, commands: tuple[str, ...] = COMMANDS, long: bool = False) -> Case:
    """A command's base line with one to three of its flags drawn (each flag once; `long`: long switches too)."""
    line = draw(st.sampled_from([name for name in BASE if name.split()[0] in commands]))
    command = line.split()[0]
    flags = [f for f in catalogue()[command] if long or f.kind != "long"]
    chosen = draw(st.lists(st.sampled_from(flags), min_size=1, max_size=3, unique_by=lambda f: f.dest))
    positionals = dict(POSITIONAL_DEFAULTS)
    extra: list[str] = []
    states: dict[str, str] = {}
    roles: dict[str, str] = {}
    for flag in chosen:
        tokens = draw(values(flag))
        if tokens and tokens[0].startswith("@"):  # a path in a drawn state, at a name of its own
            place = f"p_{flag.dest}"
            states[place], roles[place] = tokens[0][1:], flag.kind
            tokens = [f"imagefolder:{place}" if flag.kind == "data-spec" else place]
        if not flag.options:
            positionals[flag.dest] = tokens[0]
            continue
        extra += [draw(st.sampled_from(flag.options)), *tokens]
    template = BASE[line]
    leading = [positionals[f.dest] for f in chosen if not f.options and f"{{{f.dest}}}" not in template]
    argv = [token.format(**positionals) if token.startswith("{") else token for token in template]
    return Case(command, [argv[0], *leading, *argv[1:], *extra], states, roles)
