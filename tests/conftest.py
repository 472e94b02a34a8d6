"""Fixtures: every store test runs on a real SQLite file and on the real PostgreSQL.

PostgreSQL is reached through ``EVIDENCE_TEST_POSTGRES_URL``. Each test gets its own
fresh schema (dropped afterwards), so runs never see each other's data. Without the URL
the PostgreSQL variants skip with the reason; under ``CI=true`` a missing URL or a server
that cannot be reached fails the test instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

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
        pytest.skip(f"PostgreSQL tests need {PG_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1:5432/test)")
    return url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A URL whose search_path is a fresh, empty schema on the test server."""
    base = _pg_base_url()
    name = f"evt_{uuid.uuid4().hex[:12]}"
    try:
        engine = sa.create_engine(base.replace("postgresql://", "postgresql+psycopg://", 1))
        with engine.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{name}"')
    except Exception as exc:  # the server is down or the URL is wrong
        if IN_CI:
            pytest.fail(f"cannot reach PostgreSQL at {base}: {exc}")
        pytest.skip(f"cannot reach PostgreSQL at {base}: {exc}")
    url = sa.engine.make_url(base).update_query_dict({"options": f"-csearch_path={name}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{name}" CASCADE')
        engine.dispose()


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


# `pytest --hypothesis-profile=deep` runs the property and fuzz suites much longer than
# the bounded default (for local hunting; CI keeps the default).
settings.register_profile("deep", max_examples=3_000, deadline=None)
