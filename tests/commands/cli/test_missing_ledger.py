"""One rule for a missing ledger: every command that only reads (and every command that
works on something the ledger must already hold) refuses with the same one line and
creates nothing — no database file, no state directory, no key."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import assert_refused, run_cli

READ_ONLY = [
    ["events"],
    ["verify"],
    ["stats"],
    ["audit"],
    ["replay", "P-1"],
    ["report", "P-1", "--html", "out.html"],
    ["prove", "1"],
    ["export", "--format", "jsonl", "--out", "out.jsonl"],
    ["plan", "list"],
    ["plan", "show", "P-1"],
    ["plan", "history", "P-1"],
    ["tool", "list"],
    ["tool", "show", "read"],
    ["validation", "list"],
    ["validation", "show", "tests"],
    ["skill", "list"],
    ["skill", "show", "qa"],
    ["keys", "list"],
    ["authorize"],
    ["projections", "status"],
    ["review", "list"],
    ["review", "show", "01J0000000000000000000000A"],
    ["resolve", "--resource", "repo:api"],
    # ... and the verbs that work on what the ledger must already hold
    ["plan", "strategize", "P-1", "--strategy", "x"],
    ["plan", "execute", "P-1"],
    ["validate", "P-1"],
    ["fix", "P-1", "--note", "x"],
    ["gate", "input", "--plan", "P-1", "--tool", "read", "--params", "{}"],
    ["attach", "tests", "--resource", "repo:api"],
]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: " ".join(a))
def test_a_missing_ledger_is_refused_the_same_way(tmp_path: Path, args: list[str]) -> None:
    result = run_cli(*args, cwd=tmp_path)
    assert_refused(result, "no ledger at", "evidence init")
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_init_creates_it(tmp_path: Path) -> None:
    result = run_cli("init", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "evidence.db").exists()
    assert run_cli("plan", "list", cwd=tmp_path).returncode == 0


def test_a_new_ledger_file_and_its_wal_are_the_owners_alone(tmp_path: Path) -> None:
    """docs/service.md's table: the log is mode 0600 from its first byte, whatever the
    umask, and SQLite's -wal and -shm files take the database file's mode."""
    import os

    import ledger

    url = f"sqlite:///{tmp_path / 'evidence.db'}"
    before = os.umask(0o022)
    try:
        store = ledger.open(url)
        try:
            store.append("plan:P-1", [])  # a write: the WAL is there while the store is open
            modes = {
                p.name: p.stat().st_mode & 0o777 for p in tmp_path.iterdir() if "evidence" in p.name
            }
        finally:
            store.close()
    finally:
        os.umask(before)
    assert modes["evidence.db"] == 0o600 and "evidence.db-wal" in modes, modes
    assert all(mode == 0o600 for mode in modes.values()), modes
    (tmp_path / "old.db").touch(mode=0o640)  # an existing file keeps its mode
    ledger.open(f"sqlite:///{tmp_path / 'old.db'}").close()
    assert (tmp_path / "old.db").stat().st_mode & 0o777 == 0o640
