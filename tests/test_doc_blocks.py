"""Every fenced block of README.md and docs/ runs as written, or says why not.

The blocks are read from the pages when the tests are collected: a new block is tested the day it lands. A page's
blocks run in order in one scratch folder holding `my_images/` (a small ImageFolder tree), as a reader runs them:
a ```python block as a script in a fresh interpreter; in a ```bash block each `structinit` command, those that train
with a tiny model and one epoch appended (the docs show the sizes a user runs, the test shrinks them by appending
flags, so neither the docs nor the library carry a test's switch), each `make` line a target whose recipe the suite
runs elsewhere, and each benchmark script's flags parsed by its own parser, not run (a study takes hours). A block
that cannot run here follows `<!-- not run: REASON -->` (REASON from NOT_RUN, the sentence before it saying so in
the rendered text); its commands are still parsed. Other languages (text, output, a tree) are not commands."""

import ast
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import make_imagefolder
from structinit.cli.parser import build_parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "studies").glob("*.md"))]
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```(?P<language>[\w+-]*)[^\n]*\n(?P<code>.*?)^(?P=indent)```[ \t]*$", re.M | re.S
)
MARKER = re.compile(r"<!--\s*not run:\s*(?P<reasons>[^>]*?)\s*-->\s*$")
# a marker's reasons, each with the word the sentence before the block must hold
NOT_RUN = {
    "a GPU": "GPU",
    "the internet": "internet",
    "placeholders": "placeholder",
    "a cluster": "cluster",
    "an excerpt": "excerpt",
}
COMMAND_LANGUAGES = ("python", "bash", "sh", "shell")  # console and text blocks show output
TRAINING_COMMANDS = ("train", "compare", "choose")
TINY = {"patch_size": "4", "depth": "1", "num_heads": "2"}  # the model a docs command trains (16 wide a head)
TINY_RUN = ["--img-size", "16", "--epochs", "1", "-b", "8", "--quiet"]
# the Hub refused at once: a block that needs it says so, it does not wait on a network this machine may lack
OFFLINE = {**os.environ, "HF_HUB_OFFLINE": "1"}


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    not_run: tuple[str, ...]  # the marker's reasons; () for a block that runs
    before: str  # the paragraph before the block (or its marker)

    def __str__(self):
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def read_blocks(page: Path) -> list[Block]:
    text = page.read_text()
    blocks = []
    for fence in FENCE.finditer(text):
        preceding = text[: fence.start()].rstrip()
        marker = MARKER.search(preceding)
        if marker:
            preceding = preceding[: marker.start()].rstrip()
        reasons = tuple(r.strip() for r in marker["reasons"].split(",")) if marker else ()
        indent = len(fence["indent"])
        code = "".join(line[indent:] for line in fence["code"].splitlines(keepends=True))
        line = text.count("\n", 0, fence.start()) + 1
        paragraph = preceding.rsplit("\n\n", 1)[-1]
        blocks.append(Block(page, line, fence["language"], code, reasons, paragraph))
    return blocks


BLOCKS = [block for page in PAGES for block in read_blocks(page)]
COMMAND_BLOCKS = [block for block in BLOCKS if block.language in COMMAND_LANGUAGES]


def commands(code: str) -> list[list[str]]:
    """A shell block's simple commands as words: lines continued by backslashes joined, comments dropped, split
    at `&&`, `||`, `;`, `|` and `&` (written apart, as the docs write them), redirections dropped."""
    tokens = []
    for line in code.replace("\\\n", " ").splitlines():  # a newline ends a command
        tokens += [*shlex.split(line, comments=True), "\n"]
    simple, words, redirected = [], [], False
    for token in tokens:
        if redirected:  # the file a redirection names is no word of the command
            redirected = False
        elif re.fullmatch(r"\d*(>>?|<)(&\d+|\S*)", token):  # > file, 2>&1, 2>/dev/null
            redirected = token[-1] in "<>"
        elif token in ("\n", "&&", "||", ";", "|", "&"):
            simple += [words] if words else []
            words = []
        else:
            words.append(token)
    return simple


def kind(words: list[str]) -> tuple[str, list[str]]:
    """What a command is to this test: ('structinit', its arguments), launched ('launched', its arguments: under
    torchrun or python -m), ('make', target), ('script', path and arguments: a benchmark) or ('other', words)."""
    if words[0] == "structinit":
        return "structinit", words[1:]
    if "structinit" in words and words[words.index("structinit") - 1] == "-m":
        return "launched", words[words.index("structinit") + 1 :]
    if words[0] == "make":
        return "make", words[1:]
    scripts = [i for i, word in enumerate(words) if re.fullmatch(r"benchmarks/\w+\.py", word)]
    if scripts:
        return "script", words[scripts[0] :]
    return "other", words


def block_commands(block: Block) -> list[tuple[str, list[str]]]:
    return [kind(words) for words in commands(block.code)] if block.language != "python" else []


def run(command: list[str], cwd: Path, where: Block) -> None:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=OFFLINE, timeout=600)
    assert done.returncode == 0, f"{where} ({' '.join(command[:6])} ...):\n{done.stderr[-3000:]}"


def check_make_target(target: str, block: Block) -> None:
    """`make demo` and `make test` are run by test_cli's demo test and by CI: the target's recipe is checked."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(rf"^{re.escape(target)}: .*\n\t(.*)", makefile, flags=re.M)
    assert recipe, f"{block}: make {target} is no target of the Makefile"
    assert recipe[1].split()[0] in ("$(VENV)/bin/structinit", "$(VENV)/bin/python"), recipe[1]


def tiny_flags(words: list[str]) -> list[str]:
    """The flags that shrink a command that trains to a tiny model for one epoch. The model's kwargs the command
    gives stay (its --model-kwargs flags add up and a key given twice is refused): the tiny ones fill the rest,
    the width 16 a head of the heads it names."""
    if words[0] not in TRAINING_COMMANDS:
        return []
    pairs = [pair for i, word in enumerate(words[1:]) if word == "--model-kwargs" for pair in words[i + 2].split(",")]
    given = dict(pair.split("=", 1) for pair in pairs)
    tiny = {**TINY, "embed_dim": str(16 * int(given.get("num_heads", 2)))}
    kwargs = ",".join(f"{key}={value}" for key, value in tiny.items() if key not in given)
    return [*(["--model-kwargs", kwargs] if kwargs else []), *TINY_RUN]


def missing_modules(code: str) -> list[str]:
    """The modules a Python block imports that are not installed (Lightning and Hugging Face come with an extra)."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return sorted(name for name in names if importlib.util.find_spec(name) is None)


def run_block(block: Block, scratch: Path) -> str | None:
    """Runs a block in the scratch folder; a Python block whose imports are not installed is left: what it needs."""
    if block.language == "python":
        if missing := missing_modules(block.code):
            return f"{block} needs {', '.join(missing)}"
        run([sys.executable, "-c", block.code], scratch, block)
        return None
    for what, words in block_commands(block):
        if what == "structinit":
            run([sys.executable, "-m", "structinit", *words, *tiny_flags(words)], scratch, block)
        elif what == "make":
            check_make_target(words[0], block)
        else:  # benchmark scripts are parsed by test_every_benchmark_command_parses
            assert what == "script", (
                f"{block}: `{shlex.join(words)}` cannot run here: give the block a `<!-- not run: REASON -->` "
                f"marker ({', '.join(NOT_RUN)}) and say why in the sentence before it"
            )


@pytest.fixture(scope="module")
def my_images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs") / "my_images"
    return make_imagefolder(folder, 16, per_class=10, classes=("a", "b", "c"))


RUN_PAGES = sorted({block.page for block in COMMAND_BLOCKS if not block.not_run}, key=PAGES.index)


@pytest.mark.parametrize("page", RUN_PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_the_blocks_of_a_page_run_as_written(page, my_images, tmp_path):
    shutil.copytree(my_images, tmp_path / "my_images")
    left = [run_block(block, tmp_path) for block in COMMAND_BLOCKS if block.page == page and not block.not_run]
    if any(left):
        pytest.skip(f"the other blocks ran; not installed: {'; '.join(filter(None, left))}")


MARKED = [block for block in BLOCKS if block.not_run]


@pytest.mark.parametrize("block", MARKED, ids=str)
def test_a_block_not_run_says_why_in_its_text(block):
    assert block.language in COMMAND_LANGUAGES, f"{block}: a {block.language or 'plain'} block is not run anyway"
    for reason in block.not_run:
        assert reason in NOT_RUN, (
            f"{block}: '{reason}' is no reason this test knows ({', '.join(NOT_RUN)}; a benchmark's lines need "
            "none: their flags are parsed, not run)"
        )
        assert NOT_RUN[reason].lower() in block.before.lower(), f"{block}: the text before it does not say {reason}"


def test_every_not_run_marker_stands_right_before_a_block():
    for page in PAGES:
        text = page.read_text()
        marked = {block.line for block in read_blocks(page) if block.not_run}
        fences = [fence.span() for fence in FENCE.finditer(text)]
        for marker in re.finditer(r"<!--\s*not run", text):
            if any(start < marker.start() < end for start, end in fences):  # a marker shown, as in layout.md
                continue
            fence = re.compile(r"-->\s*\n[ \t]*```").match(text, text.index("-->", marker.start()))
            line = text.count("\n", 0, fence.end()) + 1 if fence else 0
            assert line in marked, f"{page.relative_to(ROOT)}: a marker with no block right after it"


@pytest.mark.parametrize("block", MARKED, ids=str)
def test_the_commands_of_a_block_not_run_parse(block, capsys):
    """A block not run is still checked: its Python compiles, its structinit commands parse."""
    if block.language == "python":
        compile(block.code, str(block), "exec")
        return
    for what, words in block_commands(block):
        if what in ("structinit", "launched"):
            try:
                build_parser().parse_args(words)
            except SystemExit as exit:
                assert exit.code == 0, f"{block}: structinit {shlex.join(words)}: {capsys.readouterr().err}"


PARSE_ONLY = """
import argparse, contextlib, io, json, runpy, sys

class Parsed(Exception):
    pass

def parse_then_stop(self, *args, **kwargs):
    parse(self, *args, **kwargs)
    raise Parsed

parse, argparse.ArgumentParser.parse_args = argparse.ArgumentParser.parse_args, parse_then_stop
failures = []
for script, *args in json.loads(sys.argv[1]):
    sys.argv, sys.path[0], errors = [script, *args], script.rsplit("/", 1)[0], io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(script, run_name="__main__")
        failures.append(f"{script}: ran to its end without parsing its flags")
    except Parsed:
        pass
    except SystemExit:
        failures.append(f"{script} {' '.join(args)}: {errors.getvalue().strip()}")
print(json.dumps(failures))
"""


def test_every_benchmark_command_parses():
    """The benchmark lines of every block: the script exists and its own parser takes the flags (its main run up to
    its parse_args in one interpreter, stopped there). Scripts that read their arguments without argparse are
    only checked to exist."""
    lines = [words for block in COMMAND_BLOCKS for what, words in block_commands(block) if what == "script"]
    assert lines, "no benchmark command found in the docs: the block reader is broken"
    assert [words[0] for words in lines if not (ROOT / words[0]).is_file()] == []
    parsed = [words for words in lines if "parse_args(" in (ROOT / words[0]).read_text()]
    done = subprocess.run(
        [sys.executable, "-c", PARSE_ONLY, json.dumps(parsed)], cwd=ROOT, capture_output=True, text=True, env=OFFLINE
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_reader_finds_commands_as_a_shell_splits_them():
    code = "a b \\\n  c  # a comment\nd 'e f' && g > out.log 2>&1 < /dev/null & echo $! > pid\n"
    assert commands(code)[:3] == [["a", "b", "c"], ["d", "e f"], ["g"]]
    assert kind(["torchrun", "--nproc_per_node", "8", "-m", "structinit", "train", "x"]) == ("launched", ["train", "x"])
    assert kind(["bash", "benchmarks/gpu_study.sh", "start", "benchmarks/theory.py", "--seeds", "0"]) == (
        "script",
        ["benchmarks/theory.py", "--seeds", "0"],
    )
    assert tiny_flags(["train", "d", "--model-kwargs", "num_heads=12,depth=2"])[:2] == [
        "--model-kwargs",
        "patch_size=4,embed_dim=192",
    ]
    assert tiny_flags(["init", "vit_tiny_patch16_224"]) == []
    assert missing_modules("import timm\nfrom no_such_module.sub import x\nimport torch.nn") == ["no_such_module"]


def test_the_three_ways_of_naming_options_in_methods_md_agree(make_vit):
    """docs/methods.md's keywords, options class and label, each on a fresh 2-block ViT: the same report."""
    import structinit

    block = next(b for b in BLOCKS if b.page.name == "methods.md" and b.language == "python")
    calls = [line.split("  #")[0] for line in block.code.splitlines() if line.startswith("structinit.initialize(")]
    assert len(calls) == 3
    reports = [eval(call, {"structinit": structinit, "model": make_vit()}) for call in calls]
    assert (
        len({(round(r.min_fidelity, 6), r.options["assignment"], r.options["target_fidelity"]) for r in reports}) == 1
    )
