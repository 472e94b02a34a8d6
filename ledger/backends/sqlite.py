"""SQLite: the embedded ledger, one file (``sqlite:///path``) or ``:memory:``.

Connections run in WAL mode with ``synchronous=FULL`` and a long busy timeout; the store
takes transaction control from the driver, so a writer's ``BEGIN IMMEDIATE`` holds the
database's one write lock from its first statement: that lock is the ledger lock.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy import event as sa_event
from sqlalchemy.engine import Connection, Engine

from .. import tables
from ..errors import LedgerBusy, LedgerError, LedgerOpenError, LedgerStorageError, LedgerURLError
from .base import HEAD_SQL, LOCK_WAIT_ENV, Backend, HeadAndVersions, lock_wait_s

__all__ = ["APPEND_ONLY_DDL", "SQLiteBackend"]

# The execution option that makes a SQLAlchemy transaction begin with BEGIN IMMEDIATE.
_WRITE_OPTION = "evidence_write"

APPEND_ONLY_DDL = [
    f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table} "
    f"BEGIN SELECT RAISE(ABORT, '{tables.APPEND_ONLY_MESSAGE}: {op} on {table} is refused'); "
    "END"
    for table in ("events", "blobs")
    for op in ("UPDATE", "DELETE")
] + [
    "CREATE TRIGGER IF NOT EXISTS ledger_head_no_delete BEFORE DELETE ON ledger_head "
    f"BEGIN SELECT RAISE(ABORT, '{tables.APPEND_ONLY_MESSAGE}: DELETE on ledger_head is "
    "refused'); END"
]


def _create_private(path: str) -> None:
    """A new ledger file, readable and writable by its owner only (0600) from its first
    byte: the log is the service's alone, and SQLite gives its ``-wal`` and ``-shm``
    files the database file's mode. An existing file is left as it is."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    except PermissionError:
        raise LedgerOpenError(f"cannot create {path}: permission denied") from None
    os.close(fd)


class SQLiteBackend(Backend):
    name = "sqlite"
    placeholder = "?"
    # BEGIN IMMEDIATE already holds the write lock: a plain read of the head suffices.
    lock_head_sql: ClassVar[str] = HEAD_SQL

    @classmethod
    def create_engine(cls, url: sa.URL, *, must_exist: bool) -> Engine:
        if url.host or url.username or url.port:
            raise LedgerURLError(
                f"malformed SQLite URL {url.render_as_string()!r}: use "
                "sqlite:///relative/path or sqlite:////absolute/path"
            )
        path = url.database or ""
        memory = path in ("", ":memory:")
        if not memory:
            try:
                os.stat(path)
            except PermissionError:  # a directory on the way is closed to this user
                raise LedgerOpenError(f"cannot open {path}: permission denied") from None
            except OSError:
                if must_exist:
                    raise LedgerOpenError(
                        f"no ledger at {path}: run `evidence init` first"
                    ) from None
            if os.path.isdir(path):
                raise LedgerOpenError(f"cannot open {path}: it is a directory")
            parent = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(parent):
                raise LedgerOpenError(f"cannot create {path}: directory {parent} does not exist")
            if not must_exist:
                _create_private(path)
        wait_ms = lock_wait_s() * 1000
        engine = sa.create_engine(
            url.set(drivername="sqlite+pysqlite"),
            poolclass=sa.pool.StaticPool if memory else sa.pool.QueuePool,
            connect_args={"check_same_thread": False},
        )

        @sa_event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control from the driver so BEGIN is ours (see _on_begin).
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
            if not memory:
                cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = FULL")
            cur.close()

        @sa_event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            # Writers take the write lock at BEGIN, so two appends never both read one head.
            write = conn.get_execution_options().get(_WRITE_OPTION, False)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

        return engine

    def translate(self, exc: BaseException) -> LedgerError | None:
        found = getattr(exc, "orig", exc)
        if not isinstance(found, sqlite3.OperationalError):
            return None
        text = str(found)
        if "locked" in text or "busy" in text:
            return LedgerBusy(
                f"the ledger is locked by another writer past the wait ({lock_wait_s():g} s, "
                f"{LOCK_WAIT_ENV}): retry"
            )
        if "readonly" in text:
            return LedgerStorageError(f"the ledger's database cannot be written here ({text})")
        if "full" in text or "disk I/O" in text:
            return LedgerStorageError(f"the ledger's storage refused the write ({text})")
        return None

    def display_url(self, url: sa.URL) -> str:
        path = url.database or ":memory:"
        return "sqlite:///" + (path if path == ":memory:" else os.path.abspath(path))

    def transaction_options(self, *, write: bool, snapshot: bool) -> dict[str, Any]:
        # A deferred read transaction already sees one moment (WAL: from its first read).
        return {_WRITE_OPTION: True} if write else {}

    @contextmanager
    def write_cursors(
        self, driver: Any, lasting: Callable[[], bool], may_defer: bool
    ) -> Iterator[tuple[Any, Any]]:
        cursor = driver.cursor()
        if not may_defer:
            cursor.execute("BEGIN IMMEDIATE")
            yield cursor, cursor
            driver.commit()
            return
        # The level may not change inside a transaction: one that may leave its flush
        # begins at NORMAL (its commit written to the WAL, not synced; the next commit
        # at FULL syncs the WAL, these frames with its own), and syncs after its commit
        # if it turned out it must last.
        cursor.execute("PRAGMA synchronous = NORMAL")
        try:
            cursor.execute("BEGIN IMMEDIATE")
            yield cursor, cursor
            driver.commit()
            if lasting():
                self.flush(driver)
        finally:
            if driver.in_transaction:
                driver.rollback()  # the caller's rollback comes after this finally
            cursor.execute("PRAGMA synchronous = FULL")

    def flush(self, driver: Any) -> None:
        # The WAL's frames of commits made at NORMAL are in the file, not yet on disk:
        # synced through any descriptor of it (a checkpoint had already synced what it
        # copied into the database file).
        [(_seq, _name, path, *_rest)] = [
            row for row in driver.execute("PRAGMA database_list").fetchall() if row[1] == "main"
        ]
        if not path:
            return  # in memory: nothing is ever on disk
        try:
            fd = os.open(path + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def in_transaction(self, driver: Any) -> bool:
        return bool(driver.in_transaction)

    def read_statement(self, driver: Any, sql: str, params: Sequence[Any]) -> list[Any]:
        # The connection is in autocommit (isolation_level None): a SELECT outside BEGIN
        # is its own read transaction, one snapshot.
        cursor = driver.cursor()
        try:
            cursor.execute(sql, params)
            return cursor.fetchall()
        finally:
            cursor.close()

    def read_head_locked(self, cursor: Any, aux: Any, streams: Sequence[str]) -> HeadAndVersions:
        # BEGIN IMMEDIATE already holds the write lock: one statement reads it all.
        cursor.execute(
            "SELECT size, chain_hash, frontier, "
            + self.stream_versions_sql(len(streams))
            + " FROM ledger_head WHERE id = 1",
            streams,
        )
        size, chain, packed, *found = cursor.fetchone()
        return size, chain, packed, found

    def scan_cursor(self, driver: Any, batch_size: int) -> Any:
        return driver.cursor()

    def lock_schema(self, conn: Connection) -> None:
        pass  # a write transaction (BEGIN IMMEDIATE) already excludes every other writer

    def append_only_ddl(self) -> Sequence[str]:
        return APPEND_ONLY_DDL

    def upgrade_schema(self, conn: Connection) -> None:
        pass  # nothing SQLite-only was added after v1 shipped
