"""A study's committed ledger of finished runs (JSON lines, curves included), so that its docs can be
rewritten and its grids resumed on a checkout without run directories; and the generated sections of
its docs."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
from pathlib import Path
from typing import Any

from ..data.datasets import parse_spec
from ..errors import RunError, one_line, reason
from ..files import atomic_write_text, refuse_link, refuse_replacing, regular_file
from ..schema import Bounds, Field, Schema, check, integer, json_lines, listing, number, text
from ..seeds import MAX_SEED
from ..training.identity import NOT_RECIPE, config_hash
from ..training.settings import TrainConfig
from .results import collect, time_to_accuracy

LedgerKey = tuple[str, int, str, int]  # a study's run: grid, per class, init, seed


def ledger_key(row: dict[str, Any]) -> LedgerKey:
    return row["grid"], row["per_class"], row["init"], row["seed"]


PAGE_MAX_BYTES = 4 << 20  # a docs page the tables are written into (the largest here: ~80 KB)
LEDGER_BOUNDS = Bounds(line=1 << 20, lines=100_000, total=64 << 20)  # a row is ~1 KB, a study's ledger ~200 rows
LEDGER_FIX = "mend or remove the row (a run whose row is removed trains again), or restore the file from git"


def _or_empty(field: Field, optional: bool = True) -> Field:
    """`field`, or '' where a result row has no value (collect's rows: no per-class subset, no init report)."""
    return Field(f"{field.what} or ''", lambda value: value == "" or field.test(value), optional)


def _curve(value: Field) -> Field:
    """A row's curve: [epoch, value] points, or null where it was not kept."""

    def point(item: Any) -> bool:
        return isinstance(item, list) and len(item) == 2 and integer(1).test(item[0]) and value.test(item[1])

    return listing(Field(f"[epoch, {value.what}]", point), optional=True, null=True)


def _steps_of_epochs(row: dict[str, Any]) -> str | None:
    steps = row.get("steps")
    if isinstance(steps, int) and steps % row["epochs"]:
        return f"its 'steps' {steps} are not its {row['epochs']} epochs of equal steps"
    return None


PERCENT = number(0, 100)
# a ledger's row: a result row (results.collect) and its grid; the cell keys and the score are in every row, what
# the ledger added later (best top-1, steps, wall-clock, where it ran, its recipe's hash) in the newer ones
ROW = Schema(
    {
        **dict.fromkeys(("grid", "init", "dataset", "model", "split", "recipe"), text()),
        **dict.fromkeys(("per_class", "heads"), _or_empty(integer(1), optional=False)),
        "seed": integer(0, MAX_SEED),
        "epochs": integer(1),
        "top1": PERCENT,
        "best_top1": number(0, 100, optional=True),
        "top5": number(0, 100, optional=True, null=True),
        "train_loss": number(0, optional=True),
        **dict.fromkeys(("secs", "wall_secs"), number(0, optional=True)),
        **dict.fromkeys(("steps", "images", "val_per_class"), _or_empty(integer(1))),
        "train_fraction": _or_empty(number(0, 1)),
        "epochs_to_timm": integer(1, optional=True, null=True),
        "curve": _curve(PERCENT),
        "loss_curve": _curve(number(0)),
        **dict.fromkeys(("device", "precision", "recipe_hash"), text(optional=True)),
    },
    rules=(_steps_of_epochs,),
)


def read_ledger(path: Path) -> dict[LedgerKey, dict[str, Any]]:
    """The rows of a study's committed ledger (JSON lines; none if `path` is absent), by run: one per
    finished run, curve included, so that its docs can be rewritten and its grids resumed on a
    checkout that has no run directories. Read within LEDGER_BOUNDS, each row checked against its schema
    (ROW): a damaged one is one line (SystemExit) naming the file, the line and the field."""
    path = Path(path)
    rows = {}
    try:
        for at, line in json_lines(path, LEDGER_BOUNDS, LEDGER_FIX) if path.exists() else ():
            if line.strip():
                row = check(_json(line, f"{path} line {at}"), ROW, f"{path} line {at}", LEDGER_FIX)
                rows[ledger_key(row)] = row
    except RunError as error:
        raise SystemExit(str(error)) from None
    return rows


def _json(line: bytes, where: str) -> Any:
    try:
        return json.loads(line)
    except (ValueError, RecursionError):  # not JSON, not UTF-8 text, nested too deep to read
        raise RunError(f"{where} is damaged (not JSON): {LEDGER_FIX}") from None


def write_ledger(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write_text(Path(path), "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def is_recorded(ledger: dict[LedgerKey, dict[str, Any]], key: LedgerKey, config: TrainConfig, path: Path) -> bool:
    """Whether the ledger (read from `path`) holds the run `key`, trained as `config` would train it.
    A row of another recipe or data is refused (SystemExit), as it would be averaged with runs of
    this one; rows recorded before the ledger kept a recipe hash have none, and count."""
    row = ledger.get(key)
    if row is None:
        return False
    if row.get("recipe_hash") not in (None, config_hash(dataclasses.asdict(config), leave_out=NOT_RECIPE)):
        grid, per_class, init, seed = key
        raise SystemExit(
            f"{path} holds {grid} {per_class}/class {init} seed {seed} from another recipe or --data: remove its "
            "row (and its run directory) to train it again"
        )
    return True


def ledger_and_runs(
    ledger: dict[LedgerKey, dict[str, Any]], out: Path, cells: list[tuple[str, int]], recipes: dict[str, Any]
) -> list[dict[str, Any]]:
    """A study's finished runs of `cells` ((grid, per class), in the study's order): the ledger's rows
    and those of the run directories under OUT/<grid> (newer: they replace the ledger's), each row
    named by its grid and the grid's recipe (`recipes`, by grid; the run's own hash kept as
    `recipe_hash`). Times to accuracy are recomputed over them all: the baseline's mean moves as
    runs come in, from whichever checkout trained them."""
    rows = dict(ledger)
    for name, recipe in recipes.items():
        if (out / name).exists():
            for r in collect(out / name):
                row = {**r, "grid": name, "recipe": recipe, "recipe_hash": r["recipe"]}
                rows[ledger_key(row)] = row
    order = {cell: i for i, cell in enumerate(cells)}
    kept = sorted(
        (r for r in rows.values() if (r["grid"], r["per_class"]) in order),
        key=lambda r: (order[r["grid"], r["per_class"]], r["init"], r["seed"]),
    )
    time_to_accuracy(kept)
    return kept


def write_generated_section(path: Path, body: str, source: str, name: str = "tables") -> None:
    """Put `body` between the `<!-- NAME:begin -->` and `<!-- NAME:end -->` markers of the markdown
    file `path` (appended if the file lacks them): a script regenerates its tables without touching
    the hand-written text around them, and several scripts can write one file."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if os.path.lexists(path) and regular_file(path).st_size > PAGE_MAX_BYTES:
        raise RunError(f"{path} is over {PAGE_MAX_BYTES >> 20} MiB: not a docs page; give its place another file")
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(rf"{re.escape(begin)}.*{re.escape(end)}", re.S)
    if not pattern.search(text):
        text += f"{begin}\n{end}\n"
    generated = f"{begin}\n<!-- generated by {source} -->\n\n{body}\n{end}"
    atomic_write_text(path, pattern.sub(lambda _: generated, text))


def study_docs(out: Path, args: Any, committed: Path, script: str) -> Path:
    """Where a study script writes its ledger and tables, after checking its --data: --docs, else OUT/docs
    for --smoke, else the `committed` docs/, and there with --part docs only from an OUT that holds
    finished runs. From a clean clone (no runs) the tables made from run directories would turn the
    committed results of runs trained elsewhere into "not trained yet". A refusal is one line (SystemExit)."""
    to_committed = not (args.docs or args.smoke)
    if to_committed and args.part == "docs" and not next(out.glob("**/summary.json"), None):
        raise SystemExit(
            f"{script}: --part docs: {out} holds no finished runs, and the committed {committed.name}/ was made "
            "from runs trained elsewhere: it stays as it is; give --out where the runs are, or --docs DIR"
        )  # first: in a clone without ../shared this, not the missing default data, is what stops it
    _, path = parse_spec(args.data)
    if path is not None and not path.is_dir():
        raise SystemExit(
            f"{script}: --data {args.data}: {path} is not a folder (CIFAR-10 in train/<class>/ and test/<class>/, "
            "as ../shared/datasets/cifar10 is); give --data cifar10:DIR or --data imagefolder:DIR"
        )
    if not to_committed:
        return Path(args.docs) if args.docs else out / "docs"
    return committed


def check_outputs(docs: Path, names: list[str | Path]) -> None:
    """Before a study trains or writes: one line (RunError) where a file it writes under `docs` (each named
    relative to it), or a folder on the way there, is a link or not a regular file (a folder). Nothing is
    written through a link, out of `docs`, and a refusal comes before any file has changed."""
    for name in names:
        folder = Path(docs)
        for part in Path(name).parts[:-1]:
            folder = folder / part
            refuse_link(folder)
            if folder.exists() and not folder.is_dir():
                raise RunError(f"{folder} is not a folder, where structinit writes into one: move it away")
        refuse_replacing(Path(docs, name))


def write_csv(path: Path, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """A CSV file of `rows` (their `columns` only, a header first) written whole (files.atomic_write)."""
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(Path(path), table.getvalue())


def one_line_refusals(script: str) -> Any:
    """A decorator for a study script's main: a refusal (RunError) or a failed file operation (OSError, named
    with its file) ends it in one line (SystemExit: `SCRIPT: error: ...`), never a traceback."""

    def decorate(main: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return main(*args, **kwargs)
            except (RunError, OSError) as error:
                raise SystemExit(f"{script}: error: {one_line(reason(error))}") from None

        return guarded

    return decorate
