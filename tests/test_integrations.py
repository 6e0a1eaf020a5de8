"""docs/integrations.md keeps its snippets: the structinit command line, timm's checkpoint loading, a plain loop,
Lightning and the Hugging Face Trainer. test_doc_blocks.py runs them, in order, in one folder (the timm block
loads the file the command line wrote)."""

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "integrations.md"
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(), flags=re.S)
RUNNABLE = [(language, code) for language, code in BLOCKS if language in ("python", "bash")]


def test_the_doc_has_the_snippets_it_promises():
    languages = [language for language, _ in RUNNABLE]
    assert languages.count("bash") == 1 and languages.count("python") == 4
    assert all(language in ("python", "bash", "text") for language, _ in BLOCKS)
