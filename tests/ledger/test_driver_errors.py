"""The driver's errors become the ledger's own where the store touches the driver
(``ledger/errors.py`` draws the tree; issue 49, item 1): a lock another connection holds
past the wait (``EVIDENCE_LOCK_WAIT``) is ``LedgerBusy`` — one ``error:`` line in the
CLI, 503 with ``Retry-After`` in the service — never a bare ``sqlite3.OperationalError``
with a traceback, or a 500. PostgreSQL's lock and connection errors are
mapped as well: a lock past the wait (``lock_timeout``) is ``LedgerBusy``, a session
the server ended ``LedgerUnavailable``, and the next request gets a live connection."""

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
def _locked(url: str) -> Iterator[None]:
    """Another connection holding the ledger's write lock: SQLite's database lock, or
    PostgreSQL's row lock on the one-row head."""
    if url.startswith("sqlite:///"):
        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        try:
            holder.execute("BEGIN IMMEDIATE")
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn, conn.begin():
            conn.execute(sa.text("SELECT size FROM ledger_head FOR UPDATE"))
            yield
    finally:
        engine.dispose()


@pytest.fixture
def short_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_WAIT_ENV, "0.2")


def test_a_lock_held_past_the_wait_is_ledger_busy(
    sqlite_url: str, tmp_path: Path, short_wait: None
) -> None:
    with Plane.open(sqlite_url) as plane, _locked(sqlite_url):
        with pytest.raises(ledger.LedgerBusy, match=r"locked by another writer .*0\.2 s"):
            create_plan(plane, "P-1", project="api", resources=["repo:api"])
        before = plane.store.head().size
    with Plane.open(sqlite_url) as plane:
        assert plane.store.head().size == before  # nothing of it was kept
        create_plan(plane, "P-1", project="api", resources=["repo:api"])  # free again


def test_the_cli_says_it_in_one_line(db_url: str, short_wait: None) -> None:
    with Plane.open(db_url):
        pass
    with _locked(db_url):
        result = invoke(
            "plan", "create", "P-1", "--project", "api", "--resource", "repo:api",
            "--db", db_url,
        )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith(
        "error: the ledger is locked"
    )
    assert "Traceback" not in result.output


def test_the_service_answers_503_with_retry_after(db_url: str, short_wait: None) -> None:
    from starlette.testclient import TestClient

    from commands.plane.phases import enter_execute, record_strategy
    from commands.service import create_app

    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "search")
        enter_execute(plane, "P-1")
        token = issue_credential(plane, "P-1", ttl=timedelta(hours=1)).token
    with TestClient(create_app(db_url)) as client, _locked(db_url):
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


# -- PostgreSQL: a lock past the wait, a connection the server ended -----------------------


def test_postgres_lock_held_past_the_wait_is_ledger_busy(pg_url: str, short_wait: None) -> None:
    """Another session holds the head's row lock (the ledger lock): lock_timeout ends
    the wait, LedgerBusy, and nothing of the refused append is kept."""
    import sqlalchemy as sa

    holder = sa.create_engine(pg_url)
    with Plane.open(pg_url) as plane:
        before = plane.store.head().size
        with holder.connect() as conn, conn.begin():
            conn.execute(sa.text("SELECT size FROM ledger_head FOR UPDATE"))
            with pytest.raises(ledger.LedgerBusy, match=r"locked by another writer .*0\.2 s"):
                create_plan(plane, "P-1", project="api", resources=["repo:api"])
        assert plane.store.head().size == before
        create_plan(plane, "P-1", project="api", resources=["repo:api"])  # free again
    holder.dispose()


def test_postgres_connection_lost_is_unavailable_and_the_next_request_works(
    pg_url: str,
) -> None:
    """The server ends the store's session (pg_terminate_backend: a restart, a failover):
    the request that meets it is LedgerUnavailable (503 in the service, one line in the
    CLI), never a raw psycopg error, and the next one opens a new connection."""
    import uuid

    import sqlalchemy as sa

    name = f"evidence-victim-{uuid.uuid4().hex[:12]}"
    victim = sa.engine.make_url(pg_url).update_query_dict({"application_name": name})
    url = victim.render_as_string(hide_password=False)
    killer = sa.create_engine(pg_url)
    with Plane.open(url) as plane:
        plane.store.head()
        with killer.connect() as conn:
            ended = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE application_name = :name"
                ),
                {"name": name},
            ).scalar()
        assert ended and ended >= 1
        with pytest.raises(ledger.LedgerUnavailable, match="the database does not answer"):
            create_plan(plane, "P-1", project="api", resources=["repo:api"])
        create_plan(plane, "P-1", project="api", resources=["repo:api"])  # a new session
    killer.dispose()


def test_postgres_sessions_wait_bounded_and_plan_each_run(pg_url: str, short_wait: None) -> None:
    """Every session the store opens says how long a lock may be waited for, and plans
    each statement for its parameters: a generic plan chosen while the table was tiny
    is never kept (docs/performance.md, "A plan for every parameter")."""
    store = ledger.open(pg_url)
    try:
        with store.read_transaction() as conn:
            settings = {
                name: conn.exec_driver_sql(f"SHOW {name}").scalar()
                for name in ("lock_timeout", "plan_cache_mode")
            }
    finally:
        store.close()
    assert settings == {"lock_timeout": "200ms", "plan_cache_mode": "force_custom_plan"}
