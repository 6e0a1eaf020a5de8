"""Every snippet of docs/integrations.md runs: its Python blocks as scripts and its `structinit`
command lines, in order, in one folder (the timm block loads the file the command line wrote)."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), flags=re.S)
RUNNABLE = [(language, code) for language, code in BLOCKS if language in ("python", "bash")]
OPTIONAL = {"lightning": "lightning", "transformers": "transformers"}  # installed by the dev extra


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("integrations")


def test_the_doc_has_the_snippets_it_promises():
    languages = [language for language, _ in RUNNABLE]
    assert languages.count("bash") == 1 and languages.count("python") == 4
    assert all(language in ("python", "bash", "text") for language, _ in BLOCKS)


@pytest.mark.parametrize("index", range(len(RUNNABLE)))
def test_snippet_runs(index, folder):
    language, code = RUNNABLE[index]
    for name, module in OPTIONAL.items():
        if f"import {name}" in code or f"from {name}" in code:
            pytest.importorskip(module)
    if language == "bash":
        for line in code.splitlines():
            assert line.startswith("structinit "), f"only structinit commands belong in a bash block: {line}"
            command = [sys.executable, "-m", "structinit", *shlex.split(line)[1:]]
            done = subprocess.run(command, cwd=folder, capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        return
    done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
