"""The list of mutants stays current (docs/testing.md "Mutation testing").

Running the mutants takes minutes (``python -m tests.mutation.run``); checking that the
list still fits the code takes none, so it is part of the quick suite: every mutant's
original snippet occurs exactly once in its file (a check edited without its mutant
fails here, naming the mutant to update), its tests exist, and every transition rule of
``projections/plan_rules.py`` has a mutant that removes it.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
from pathlib import Path

import pytest

import projections.plan_rules as plan_rules
from tests.mutation.run import ROOT, changed_files, first_failure, load, main, problems


def test_every_mutant_fits_the_code() -> None:
    mutants = load()
    assert len(mutants) >= 40
    assert problems(mutants, ROOT) == []


def test_every_mutant_says_why_and_equivalents_say_why_not() -> None:
    for m in load():
        assert m.why.strip() and m.tests, m.id
        assert "/" in m.id, f"{m.id}: ids are group/name"
        if m.equivalent is not None:
            assert len(m.equivalent) > 40, f"{m.id}: say why no test can kill it"


def test_every_transition_rule_has_its_mutant() -> None:
    """A new rule in plan_rules lands with its mutant (and its case in
    tests/projections/test_plan_rules.py, which checks the other half)."""
    snippets = "\n".join(m.original for m in load() if m.file == "projections/plan_rules.py")
    tree = ast.parse(inspect.getsource(plan_rules))
    unlisted = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Return):
            continue
        for value in (
            (node.value.body, node.value.orelse)
            if isinstance(node.value, ast.IfExp)
            else (node.value,)
        ):
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                text = value.value
            elif isinstance(value, ast.JoinedStr):
                text = max(
                    (str(v.value) for v in value.values if isinstance(v, ast.Constant)), key=len
                )
            else:
                continue
            line = ast.get_source_segment(inspect.getsource(plan_rules), node) or text
            if text.strip() not in snippets and line.strip() not in snippets:
                unlisted.append(text)
    assert not unlisted, (
        f"transition rules without a mutant in tests/mutation/mutants.toml: {unlisted}"
    )


# pytest's own output for a test that prints and logs before it fails (-q -x -rfE, as the
# runner asks): only the summary names the test.
FAILED_OUTPUT = """\
F
=================================== FAILURES ===================================
_____________________________ test_logs_then_fails _____________________________

>       assert 1 == 2
E       assert 1 == 2

tests/test_s.py:5: AssertionError
----------------------------- Captured stdout call -----------------------------
FAILED to frobnicate - printed by the test
------------------------------ Captured log call -------------------------------
ERROR    evidence.service:follower.py:80 read models not caught up: gone
=========================== short test summary info ============================
FAILED tests/test_s.py::test_logs_then_fails[sqlite-a b] - assert 1 == 2
!!!!!!!!!!!!!!!!!!!!!!!!!! stopping after 1 failures !!!!!!!!!!!!!!!!!!!!!!!!!!!
1 failed in 0.56s
"""


def test_the_runner_names_the_failing_test_not_a_captured_line() -> None:
    assert first_failure(FAILED_OUTPUT) == "tests/test_s.py::test_logs_then_fails[sqlite-a b]"
    collection = FAILED_OUTPUT.replace(
        "FAILED tests/test_s.py::test_logs_then_fails[sqlite-a b] - assert 1 == 2",
        "ERROR tests/test_s.py",
    )
    assert first_failure(collection) == "tests/test_s.py"
    # no summary (a timeout cut it short): the last line says what there is
    assert first_failure("collecting ...\nsome output\n") == "some output"


def test_changed_selects_the_mutants_of_changed_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def git(*args: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    assert changed_files(tmp_path, "HEAD") == set()
    (tmp_path / "commands" / "a.py").write_text("x = 2\n")
    (tmp_path / "commands" / "new.py").write_text("z = 1\n")  # not yet added: changed too
    assert changed_files(tmp_path, "HEAD") == {"commands/a.py", "commands/new.py"}
    # no listed mutant's file among them: nothing to run, and that is no failure
    assert main(["--changed", "HEAD", "--root", str(tmp_path)]) == 0
    assert "no mutant's file changed since HEAD" in capsys.readouterr().out
    with pytest.raises(ValueError, match="no-such-rev"):
        changed_files(tmp_path, "no-such-rev")
