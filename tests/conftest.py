"""Fixtures: every store test runs on a real SQLite file and on the real PostgreSQL.

PostgreSQL is reached through ``EVIDENCE_TEST_POSTGRES_URL``. Each test gets its own
fresh schema (dropped afterwards), so runs never see each other's data. Without the URL
the PostgreSQL variants skip with the reason; under ``CI=true`` a missing URL or a server
that cannot be reached fails the test instead.

Cost: a fresh schema is what a test pays for (opening a plane on it creates every table
and read model, ~0.1-0.2 s). The fixture adds little to it: one server connection for
the session creates the schemas, a background thread drops them while the next tests
run, and the tests' sessions commit with ``synchronous_commit=off`` (a commit is
visible at once but not waited for on disk: only a crash of the server itself, which no
test does, could lose one).
"""

from __future__ import annotations

import os
import queue
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import settings

import ledger

PG_ENV = "EVIDENCE_TEST_POSTGRES_URL"
IN_CI = os.environ.get("CI", "").lower() == "true"


def _pg_base_url() -> str:
    url = os.environ.get(PG_ENV)
    if not url:
        if IN_CI:
            pytest.fail(f"CI=true but {PG_ENV} is not set: PostgreSQL tests cannot be skipped")
        pytest.skip(
            f"PostgreSQL tests need {PG_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)"
        )
    return url


class _Schemas:
    """The session's connection for creating test schemas, and a thread (on a second
    connection) that drops them off the tests' path."""

    def __init__(self, base: str) -> None:
        self.engine = sa.create_engine(
            base.replace("postgresql://", "postgresql+psycopg://", 1), pool_size=1, max_overflow=1
        )
        self._drops: queue.Queue[str | None] = queue.Queue()
        self._dropper = threading.Thread(
            target=self._drop_all, name="drop-test-schemas", daemon=True
        )
        self._dropper.start()

    def create(self) -> str:
        name = f"evt_{uuid.uuid4().hex[:12]}"
        with self.engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
        return name

    def drop(self, name: str) -> None:
        self._drops.put(name)

    def _drop_all(self) -> None:
        while (name := self._drops.get()) is not None:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')

    def close(self) -> None:
        """Wait for every queued drop (the session ends with no schema left)."""
        self._drops.put(None)
        self._dropper.join()
        self.engine.dispose()


_SCHEMAS: dict[str, _Schemas] = {}


@pytest.fixture(scope="session")
def _pg_schemas() -> Iterator[dict[str, _Schemas]]:
    try:
        yield _SCHEMAS
    finally:
        for schemas in _SCHEMAS.values():
            schemas.close()
        _SCHEMAS.clear()


def _fresh_schema_url(pg_schemas: dict[str, _Schemas]) -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema on the test server, dropped
    afterwards (skipped without a server; failed under CI)."""
    base = _pg_base_url()
    try:
        schemas = pg_schemas.get(base) or pg_schemas.setdefault(base, _Schemas(base))
        name = schemas.create()
    except Exception as exc:  # the server is down or the URL is wrong
        if IN_CI:
            pytest.fail(f"cannot reach PostgreSQL at {base}: {exc}")
        pytest.skip(f"cannot reach PostgreSQL at {base}: {exc}")
    url = sa.engine.make_url(base).update_query_dict(
        {"options": f"-csearch_path={name} -csynchronous_commit=off"}
    )
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        schemas.drop(name)


@pytest.fixture
def pg_url(_pg_schemas: dict[str, _Schemas]) -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema on the test server."""
    yield from _fresh_schema_url(_pg_schemas)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def module_db_url(request, tmp_path_factory, _pg_schemas: dict[str, _Schemas]) -> Iterator[str]:
    """A fresh ledger URL per backend shared by one module's tests (and its own plane key
    and state directory while the fixture built on it opens it): only for tests that leave
    it exactly as they found it, which the fixture that shares it must check."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path_factory.mktemp('shared') / 'evidence.db'}"
        return
    yield from _fresh_schema_url(_pg_schemas)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'evidence.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """The same test on both backends."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(db_url) -> Iterator[ledger.Store]:
    s = ledger.open(db_url)
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(autouse=True)
def _plane_key(tmp_path_factory, monkeypatch) -> None:
    """Each test's plane key and state directory in temp dirs (subprocesses inherit
    them): no test writes a key or a sandbox into the home directory."""
    key_dir = tmp_path_factory.mktemp("plane-key")
    monkeypatch.setenv("EVIDENCE_PLANE_KEY", str(key_dir / "plane.key"))
    # and its state directory (plans' sandboxes) too
    monkeypatch.setenv("EVIDENCE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A fresh directory no other user could put a socket in (what ``evidence serve
    --uds`` and ``evidence-hook`` demand): under the home directory, since a temp
    directory's ``/tmp`` is writable by everyone."""
    from commands.hook_client import resolve, untrusted

    for base in (Path.home(), Path(f"/run/user/{os.geteuid()}")):
        try:
            real, directories = resolve(str(base))
        except OSError:
            continue
        if untrusted([*directories, real], os.geteuid()) is None:
            break
    else:
        pytest.fail("no directory only this user can write: home and /run/user are not")
    directory = Path(tempfile.mkdtemp(prefix="evidence-test-", dir=real))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# Under CI=true every property test is derandomized (the same examples on every run, no
# example database kept) and has no per-example deadline (a loaded machine must not turn
# a slow example into a failure); each test keeps its own bounded ``max_examples``.
# `pytest --hypothesis-profile=deep` runs the property and fuzz suites much longer than
# the bounded default (for local hunting; CI keeps the default).
settings.register_profile("ci", derandomize=True, database=None, deadline=None)
settings.register_profile("deep", max_examples=3_000, deadline=None)
if IN_CI:
    settings.load_profile("ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The markers a newcomer selects by (`pytest -m "not postgres"`, `-m postgres`,
    `-m browser`): `postgres` on every test that needs the server — through the
    `pg_url` fixture, the PostgreSQL half of `db_url` / `module_db_url`, or by name."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        needs_pg = (
            "pg_url" in getattr(item, "fixturenames", ())
            or "postgresql" in params.values()
            or "postgres" in item.name
        )
        if needs_pg:
            item.add_marker(pytest.mark.postgres)
