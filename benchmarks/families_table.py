"""Write the table of docs/families.md (every family structinit initialises, its inits, and the impulse
init's fidelity on a small example) from the registry, between its `families` markers:

    .venv/bin/python benchmarks/families_table.py

The same table is `structinit init --list-models --markdown`; tests/test_rope_families.py checks that the
committed one is what the code generates.
"""

from __future__ import annotations

import sys
from pathlib import Path

from structinit.inspection.catalogue import markdown, rows
from structinit.studies.ledger import write_generated_section

DOCS = Path(__file__).resolve().parent.parent / "docs" / "families.md"


def main() -> int:
    write_generated_section(DOCS, markdown(rows()), "benchmarks/families_table.py", name="families")
    print(f"done: {DOCS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
