"""The driver's errors become the ledger's own where the store touches the driver
(``ledger/errors.py`` draws the tree; issue 49, item 1): a lock another connection holds
past the wait (``EVIDENCE_LOCK_WAIT``) is ``LedgerBusy`` — one ``error:`` line in the
CLI, 503 with ``Retry-After`` in the service — never a bare ``sqlite3.OperationalError``
with a traceback, or a 500. SQLite here; PostgreSQL's lock and connection errors are
not mapped yet (see the issue's note)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import pytest

import ledger
from commands.plane import Plane
from commands.plane.credentials import issue_credential
from commands.plane.plans import create_plan
from ledger.backends.base import LOCK_WAIT_ENV
from tests.helpers import invoke


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Another connection holding the ledger's write lock."""
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.2")


def test_a_lock_held_past_the_wait_is_ledger_busy(
    sqlite_url: str, tmp_path: Path, short_wait: None
) -> None:
    with Plane.open(sqlite_url) as plane, _locked(tmp_path / "evidence.db"):
        with pytest.raises(ledger.LedgerBusy, match=r"locked by another writer .*0\.2 s"):
            create_plan(plane, "P-1", project="api", resources=["repo:api"])
        before = plane.store.head().size
    with Plane.open(sqlite_url) as plane:
        assert plane.store.head().size == before  # nothing of it was kept
        create_plan(plane, "P-1", project="api", resources=["repo:api"])  # free again


def test_the_cli_says_it_in_one_line(sqlite_url: str, tmp_path: Path, short_wait: None) -> None:
    with Plane.open(sqlite_url):
        pass
    with _locked(tmp_path / "evidence.db"):
        result = invoke(
            "plan", "create", "P-1", "--project", "api", "--resource", "repo:api",
            "--db", sqlite_url,
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "error: the ledger is locked"
    )
    assert "Traceback" not in result.output


def test_the_service_answers_503_with_retry_after(
    sqlite_url: str, tmp_path: Path, short_wait: None
) -> None:
    from starlette.testclient import TestClient

    from commands.plane.phases import enter_execute, record_strategy
    from commands.service import create_app

    with Plane.open(sqlite_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "search")
        enter_execute(plane, "P-1")
        token = issue_credential(plane, "P-1", ttl=timedelta(hours=1)).token
    with TestClient(create_app(sqlite_url)) as client, _locked(tmp_path / "evidence.db"):
        answer = client.post(
            "/v1/gate/input",
            headers={"Authorization": f"Bearer {token}"},
            json={"tool": "search", "params": {}},
        )
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"] == "1"
    assert answer.json()["error"].startswith("the ledger is locked by another writer")


def test_a_lock_wait_that_is_no_number_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_WAIT_ENV, "soon")
    result = invoke("events", "--db", "sqlite:///:memory:")
    assert result.exit_code == 2 and f"{LOCK_WAIT_ENV} must be a number" in result.stderr
