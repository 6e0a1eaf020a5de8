"""The invariant harness (benchmarks/invariants.py) in CI: its catalogue covers every flag of every command, its
checks catch each broken rule, and a fixed-seed sample of generated cases keeps every rule."""

import sys

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from conftest import BENCHMARKS

sys.path.insert(0, str(BENCHMARKS))
import invariant_cases as cases
import invariant_checks as checks

FAST = ("init", "train", "attention", "rank", "upgrade-checkpoint")
SLOW = ("compare", "choose", "demo")
SAMPLE = settings(
    derandomize=True, deadline=None, database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    root = tmp_path_factory.mktemp("invariants")
    zygote = checks.Zygote(root / "cache")
    yield checks.Scratch(root, zygote), zygote
    zygote.close()


def test_every_command_has_a_base_line_and_every_path_flag_a_role():
    """A new command needs its base line; a new flag that names a path, its role (what it reads or writes)."""
    assert {line.split()[0] for line in cases.BASE} == set(cases.catalogue())
    assert cases.unclassified_paths() == []
    kinds = {flag.kind for flags in cases.catalogue().values() for flag in flags}
    assert kinds <= {"switch", "long", "choice", "int", "small-int", "float", "small-float", "text", "labels",
                     "kwargs", "model", *cases.ROLE_STATES}  # fmt: skip


def test_a_new_flag_is_drawn_without_being_listed(monkeypatch):
    """The catalogue is the parser's: a flag added to a command appears in its draws by its type."""
    from structinit.cli import parser as cli_parser

    build = cli_parser.build_parser

    def with_new_flag():
        parser = build()
        commands = next(a for a in parser._actions if a.dest == "command")
        commands.choices["train"].add_argument("--brand-new-rate", type=float)
        return parser

    monkeypatch.setattr(cases, "build_parser", with_new_flag)
    flags = {f.dest: f for f in cases.catalogue()["train"]}
    assert flags["brand_new_rate"].kind == "float"


def test_the_checks_catch_each_broken_rule(harness, tmp_path):
    """Each rule fails a case that breaks it: a traceback, a second error line, a refusal that wrote, a write
    outside the outputs, a hang, a memory blow-up."""
    scratch, zygote = harness
    case = cases.Case("train", ["train", "--out", "out"], {}, {})

    def broken(answer, touch=None):
        class Fake:
            rss = zygote.rss

            def run(self, argv, cwd, env, out, timeout=0):
                if touch:
                    (cwd / touch).write_text("x")
                return {"rc": 0, "timed_out": False, "maxrss": zygote.rss, "stdout": "", "stderr": "", **answer}

        return checks.check(case, scratch, Fake()).failures

    assert broken({}) == []
    assert broken({"rc": 1, "stderr": "Traceback (most recent call last):\nKeyError: 'x'"})[0].startswith("exit 1")
    assert "error lines" in broken({"rc": 2, "stderr": "structinit train: error: a\nstructinit train: error: b"})[0]
    assert "changed" in broken({"rc": 2, "stderr": "structinit train: error: no"}, touch="out")[0]
    assert "outside its outputs" in broken({}, touch="elsewhere")[0]
    assert broken({}, touch="out") == []
    assert broken({"timed_out": True, "rc": -9})[0].startswith("no end")
    assert broken({"maxrss": zygote.rss + (3 << 30)})[0].startswith("memory grew")


@pytest.mark.parametrize("line", list(cases.BASE))
def test_each_command_s_base_line_works(harness, line):
    scratch, zygote = harness
    argv = [t.format(**cases.POSITIONAL_DEFAULTS) for t in cases.BASE[line]]
    case = cases.Case(line.split()[0], argv, {}, {})
    if line in ("demo", "choose --rerun"):
        pytest.skip("ten runs or more: in the sample below (and make demo, tests/test_replace_aside.py)")
    assert checks.check(case, scratch, zygote).failures == []


def _sample(harness, commands, examples):
    scratch, zygote = harness
    failures = []

    @settings(SAMPLE, max_examples=examples)
    @given(case=cases.cases(commands))
    def one(case):
        broke = checks.check(case, scratch, zygote).failures
        if broke:
            failures.append(f"{' '.join(case.argv)} {case.states}: {broke}")

    one()
    assert failures == []


def test_a_fixed_sample_of_generated_cases_keeps_every_rule(harness):
    _sample(harness, FAST, 200)


def test_a_fixed_sample_of_grids_and_comparisons_keeps_every_rule(harness):
    _sample(harness, SLOW, 24)
