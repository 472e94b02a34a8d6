"""PostgreSQL (psycopg 3): the multi-writer deployment, ``postgresql+psycopg://``.

The ledger lock is a row lock on the one-row head (``SELECT ... FOR UPDATE``), taken in
the append's own transaction; appends pipeline their statements (head lock and stream
versions in one round trip; inserts, head update and commit in a second). Snapshot reads
run at REPEATABLE READ. The head's NOTIFY trigger wakes waiting subscribers, and DDL runs
under a transaction-scoped advisory lock so two processes never race on the schema.
psycopg is imported by SQLAlchemy only when a PostgreSQL URL is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import NoSuchModuleError

from .. import tables
from ..errors import (
    LedgerBusy,
    LedgerError,
    LedgerOpenError,
    LedgerStorageError,
    LedgerUnavailable,
    LedgerURLError,
)
from .base import HEAD_SQL, LOCK_WAIT_ENV, Backend, HeadAndVersions, lock_wait_s

__all__ = ["APPEND_ONLY_DDL", "NOTIFY_DDL", "PostgresBackend"]

DRIVER = "postgresql+psycopg"

# Processes creating or upgrading the schema of one database take this
# transaction-scoped advisory lock first, so their DDL never races (a fixed, arbitrary key).
_SCHEMA_LOCK = "SELECT pg_advisory_xact_lock(7177001)"

# Every append moves the head, and the trigger queues a NOTIFY that the server delivers
# when (and only if) the append commits. It is a hint only; subscribers poll too, so a
# lost notification costs one poll interval (see ledger.subscriptions).
NOTIFY_DDL = [
    "CREATE OR REPLACE FUNCTION evidence_notify_append() RETURNS trigger "
    f"LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('{tables.NOTIFY_CHANNEL}', "
    "NEW.size::text); RETURN NULL; END $$",
    # (no CREATE OR REPLACE TRIGGER before PostgreSQL 14)
    f"DROP TRIGGER IF EXISTS {tables.NOTIFY_TRIGGER} ON ledger_head",
    f"CREATE TRIGGER {tables.NOTIFY_TRIGGER} AFTER UPDATE OF size ON ledger_head "
    "FOR EACH ROW WHEN (NEW.size > OLD.size) EXECUTE FUNCTION evidence_notify_append()",
]

APPEND_ONLY_DDL = [
    "CREATE OR REPLACE FUNCTION evidence_refuse_change() RETURNS trigger "
    "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = "
    f"'{tables.APPEND_ONLY_MESSAGE}: ' || TG_OP || ' on ' || TG_TABLE_NAME || "
    "' is refused'; END $$",
    *[
        f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION evidence_refuse_change()"
        for table in ("events", "blobs")
    ],
    *[
        f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse_change()"
        for table in ("events", "blobs", "ledger_head")
    ],
    "CREATE TRIGGER ledger_head_no_delete BEFORE DELETE ON ledger_head "
    "FOR EACH ROW EXECUTE FUNCTION evidence_refuse_change()",
    *NOTIFY_DDL,
]


class PostgresBackend(Backend):
    name = "postgresql"
    placeholder = "%s"
    lock_head_sql: ClassVar[str] = HEAD_SQL + " FOR UPDATE"

    @classmethod
    def create_engine(cls, url: sa.URL, *, must_exist: bool) -> Engine:
        # must_exist: connecting never creates a PostgreSQL database; opening checks
        # that it holds a ledger.
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername=DRIVER)
        if url.drivername != DRIVER:
            raise LedgerURLError(
                f"unsupported PostgreSQL driver {url.drivername!r}: use {DRIVER}://"
            )
        try:
            engine = sa.create_engine(url)
        except (ImportError, NoSuchModuleError):
            raise LedgerOpenError(
                "PostgreSQL support needs psycopg: pip install 'evidence-ledger[postgres]'"
            ) from None
        wait_ms = int(lock_wait_s() * 1000)

        @sa_event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # A lock held by another session past the wait ends the statement (55P03,
            # LedgerBusy) instead of waiting for ever, as SQLite's busy_timeout does.
            dbapi_conn.execute(f"SET lock_timeout = {wait_ms}")
            # psycopg prepares a statement after its fifth run, and PostgreSQL may then
            # keep a generic plan chosen while the table was tiny (a sequential scan)
            # until autovacuum analyses it: a young ledger's checks slowed from the
            # first minute (docs/performance.md, "A plan for every parameter"). Plan
            # each run for its own parameters instead.
            dbapi_conn.execute("SET plan_cache_mode = force_custom_plan")
            dbapi_conn.commit()

        return engine

    def translate(self, exc: BaseException) -> LedgerError | None:
        import psycopg

        found = getattr(exc, "orig", exc)
        if isinstance(found, psycopg.errors.LockNotAvailable):
            return LedgerBusy(
                f"the ledger is locked by another writer past the wait ({lock_wait_s():g} s, "
                f"{LOCK_WAIT_ENV}): retry"
            )
        if isinstance(found, (psycopg.errors.DiskFull, psycopg.errors.ReadOnlySqlTransaction)):
            return LedgerStorageError(f"the database refused the write ({_said(found)})")
        if isinstance(found, psycopg.OperationalError):  # the connection lost, the server gone
            return LedgerUnavailable(f"the database does not answer ({_said(found)}): retry")
        return None

    def display_url(self, url: sa.URL) -> str:
        # libpq takes a password in the query too (`?password=`): hidden like the other.
        if "password" in url.query:
            url = url.update_query_dict({"password": "***"})
        return url.render_as_string(hide_password=True)

    def transaction_options(self, *, write: bool, snapshot: bool) -> dict[str, Any]:
        # Writers through SQLAlchemy need nothing more (the head's row lock is taken by
        # statement); a snapshot needs one snapshot for the whole transaction.
        if not write and snapshot:
            return {"isolation_level": "REPEATABLE READ"}
        return {}

    @contextmanager
    def write_cursors(
        self, driver: Any, lasting: Callable[[], bool], may_defer: bool
    ) -> Iterator[tuple[Any, Any]]:
        with driver.pipeline():
            cursors = driver.cursor(), driver.cursor()
            yield cursors
            if not lasting():
                # Committed without waiting for its WAL to reach the disk: the next
                # synchronous commit waits for the WAL up to its own, past this one.
                cursors[0].execute("SET LOCAL synchronous_commit = off")
            driver.commit()

    def flush(self, driver: Any) -> None:
        # A transaction given an id writes a commit record, and its synchronous commit
        # waits for the WAL to be flushed up to it: every earlier commit with it.
        driver.execute("SELECT txid_current()")
        driver.commit()

    def in_transaction(self, driver: Any) -> bool:
        from psycopg.pq import TransactionStatus

        return bool(driver.info.transaction_status != TransactionStatus.IDLE)

    def read_statement(self, driver: Any, sql: str, params: Sequence[Any]) -> list[Any]:
        # In autocommit the statement runs in a transaction of its own on the server:
        # one round trip instead of BEGIN, the statement and COMMIT.
        driver.autocommit = True
        try:
            with driver.cursor() as cursor:
                cursor.execute(sql, params)
                return cursor.fetchall()
        finally:
            driver.autocommit = False

    def read_head_locked(self, cursor: Any, aux: Any, streams: Sequence[str]) -> HeadAndVersions:
        # A separate statement after the lock: in READ COMMITTED its snapshot then
        # includes every append committed before ours. Both are sent before either result
        # is fetched (one round trip in the pipeline).
        cursor.execute(self.lock_head_sql)
        aux.execute("SELECT " + self.stream_versions_sql(len(streams)), streams)
        size, chain, packed = cursor.fetchone()
        return size, chain, packed, aux.fetchone()

    def scan_cursor(self, driver: Any, batch_size: int) -> Any:
        cursor = driver.cursor(name="evidence_scan")  # server-side cursor
        cursor.itersize = batch_size
        return cursor

    def lock_schema(self, conn: Connection) -> None:
        conn.exec_driver_sql(_SCHEMA_LOCK)

    def append_only_ddl(self) -> Sequence[str]:
        return APPEND_ONLY_DDL

    def upgrade_schema(self, conn: Connection) -> None:
        if not conn.exec_driver_sql(
            "SELECT 1 FROM pg_trigger WHERE tgname = %s AND tgrelid = 'ledger_head'::regclass",
            (tables.NOTIFY_TRIGGER,),
        ).first():  # the NOTIFY trigger was added after v1 shipped
            self.lock_schema(conn)
            for ddl in NOTIFY_DDL:
                conn.execute(sa.DDL(ddl))


def _said(exc: BaseException) -> str:
    """The driver's message, one line."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__
