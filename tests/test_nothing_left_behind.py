"""A refused command leaves nothing behind: no database it created (nor the WAL, state
directory and keys that came with it), no copy of an example, no temporary directory;
and ``demo`` on a ledger it was given says plainly that the ledger keeps its events."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.helpers import assert_refused, run_cli

EXAMPLE = Path(__file__).parents[1] / "examples" / "green-after-fix" / "plan.yaml"


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    """An empty working directory, with the default ledger (``evidence.db`` in it)."""
    work = tmp_path / "work"
    work.mkdir()
    return work


def _nothing_in(work: Path) -> None:
    assert sorted(p.name for p in work.iterdir()) == []
    assert not os.path.lexists(os.environ["EVIDENCE_PLANE_KEY"])


def test_run_of_a_missing_plan_file_creates_no_ledger(empty: Path) -> None:
    assert_refused(run_cli("run", "missing.yaml", cwd=empty), "missing.yaml")
    _nothing_in(empty)


def test_run_of_a_wrong_plan_file_creates_no_ledger(empty: Path, tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("timeout: 60", 'timeout: "60"')
    (tmp_path / "plans").mkdir()
    plan = tmp_path / "plans" / "plan.yaml"
    plan.write_text(text)
    (tmp_path / "plans" / "project").mkdir()
    assert_refused(run_cli("run", str(plan), cwd=empty), "tools.0.timeout")
    _nothing_in(empty)


def test_a_refused_plan_create_creates_no_ledger(empty: Path) -> None:
    done = run_cli("plan", "create", "P-1", "--project", "a", "--resource", "./src", cwd=empty)
    assert_refused(done, "'./src'", "does not exist")
    _nothing_in(empty)


def test_a_refusal_keeps_a_ledger_that_was_there(empty: Path) -> None:
    assert run_cli("init", cwd=empty).returncode == 0
    before = {p.name: p.stat().st_size for p in empty.iterdir() if p.is_file()}
    assert "evidence.db" in before
    done = run_cli("plan", "create", "P-1", "--project", "a", "--resource", "./src", cwd=empty)
    assert_refused(done, "does not exist")
    assert "evidence.db" in {p.name for p in empty.iterdir()}
    assert run_cli("events", "--json", cwd=empty).returncode == 0


def test_a_refused_run_of_an_example_leaves_no_copy(
    empty: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    done = run_cli("run", str(EXAMPLE), "--plan-id", "not a plan id", cwd=empty)
    assert_refused(done, "invalid plan id")
    assert list(scratch.iterdir()) == []
    _nothing_in(empty)


def test_demo_on_a_given_ledger_says_it_keeps_the_events(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVIDENCE_OPERATOR_KEY", str(tmp_path / "operator.key"))
    first = run_cli("demo", "--db", pg_url)
    assert first.returncode == 0, first.stdout + first.stderr
    last = first.stdout.strip().splitlines()[-1]
    assert "stay in the ledger" in last and "temporary: removed (keep" not in first.stdout
    # again in the same ledger: a fresh plan id, not a refusal
    second = run_cli("demo", "--db", pg_url)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "(plan green-after-fix-" in second.stdout.strip().splitlines()[-1]
