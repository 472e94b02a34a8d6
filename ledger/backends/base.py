"""The interface between the store and one database: what SQLite and PostgreSQL do
differently, and nothing else.

``Store`` (``ledger.store``) holds everything the backends share: the SQL text of the
log, hashing, expected versions, blobs and reads. A ``Backend`` answers the rest: how an
engine is made from a URL, how a write transaction takes the ledger lock, how a read
sees one moment, how the raw log is scanned, and the schema's backend-only extras
(triggers, and on PostgreSQL the NOTIFY trigger and the advisory lock around DDL).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import PoolProxiedConnection

from ..errors import LedgerError
from ..intake import env_seconds

__all__ = ["HEAD_SQL", "Backend", "HeadAndVersions", "driver_connection", "lock_wait_s"]

LOCK_WAIT_ENV = "EVIDENCE_LOCK_WAIT"  # seconds a writer waits for the ledger's lock


def lock_wait_s() -> float:
    """``EVIDENCE_LOCK_WAIT`` (seconds, 0 to 3600), else 60."""
    return env_seconds(LOCK_WAIT_ENV, 60.0, zero=True)


HEAD_SQL = "SELECT size, chain_hash, frontier FROM ledger_head WHERE id = 1"

# size, chain hash, packed frontier, then each stream's current version (None: no stream)
HeadAndVersions = tuple[int, bytes, bytes, Sequence[int | None]]


def driver_connection(raw: PoolProxiedConnection) -> Any:
    """The driver's own connection under a pooled one (sqlite3 or psycopg). The pool
    only lets it go once the pooled connection is closed or invalidated."""
    driver = raw.driver_connection
    if driver is None:
        raise LedgerError("the database connection was closed while in use")
    return driver


class Backend(ABC):
    """What one database does its own way. Stateless: one instance serves a store."""

    name: ClassVar[str]
    """The SQLAlchemy dialect name, ``Store.backend``: "sqlite" or "postgresql"."""
    placeholder: ClassVar[str]
    """The driver's parameter marker in plain SQL: "?" or "%s"."""
    lock_head_sql: ClassVar[str]
    """Reads the ledger head inside a write transaction so that no other writer can
    move it before this transaction ends."""

    @classmethod
    @abstractmethod
    def create_engine(cls, url: sa.URL, *, must_exist: bool) -> Engine:
        """An engine for ``url`` (of this backend's scheme), set up as the store needs
        it; ``must_exist``: refuse to create a database that is not there."""

    @abstractmethod
    def display_url(self, url: sa.URL) -> str:
        """Where the ledger lives, as shown to people: never with a password."""

    def translate(self, exc: BaseException) -> LedgerError | None:
        """The ledger's own error for a driver error of this backend (``exc``, or the
        driver's error SQLAlchemy wraps as its ``orig``); None for one it does not know
        (a defect: it goes up as it is)."""
        return None

    @abstractmethod
    def transaction_options(self, *, write: bool, snapshot: bool) -> dict[str, Any]:
        """Execution options for a SQLAlchemy transaction: ``write`` takes the write
        lock at BEGIN where the database needs it; ``snapshot`` makes every statement of
        a read see one moment."""

    @abstractmethod
    def write_cursors(
        self, driver: Any, lasting: Callable[[], bool], may_defer: bool
    ) -> AbstractContextManager[tuple[Any, Any]]:
        """Begin a write transaction on the driver connection ``driver`` and yield two
        cursors (the append path's and the caller's; they may be one cursor); commit
        when the block ends normally. Rolling back is the caller's part.

        ``may_defer`` (known at the start) and ``lasting()`` (asked at the end) False:
        the commit skips its own flush to disk (it is committed, visible and safe from
        any process's end, and the next lasting commit, or ``flush``, makes it durable
        with its own)."""

    @abstractmethod
    def flush(self, driver: Any) -> None:
        """Make every committed transaction durable, one whose flush was left to a later
        commit too (see ``write_cursors``)."""

    @abstractmethod
    def in_transaction(self, driver: Any) -> bool:
        """Whether the driver connection ``driver`` is inside a transaction."""

    @abstractmethod
    def read_statement(self, driver: Any, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of one read statement on the driver connection ``driver``, outside
        any transaction of the caller's: the statement is its own snapshot, sent without
        a BEGIN and a COMMIT around it."""

    @abstractmethod
    def read_head_locked(self, cursor: Any, aux: Any, streams: Sequence[str]) -> HeadAndVersions:
        """Lock the ledger head and read it with each stream's current version, such
        that no append committed before the lock is missed."""

    @abstractmethod
    def scan_cursor(self, driver: Any, batch_size: int) -> Any:
        """A driver cursor for reading the whole log in batches with constant memory."""

    @abstractmethod
    def lock_schema(self, conn: Connection) -> None:
        """Before DDL: keep other processes from changing the schema at the same time."""

    @abstractmethod
    def append_only_ddl(self) -> Sequence[str]:
        """The triggers (and functions) with which the database itself refuses changes
        to stored rows, plus any other extras a new schema gets."""

    @abstractmethod
    def upgrade_schema(self, conn: Connection) -> None:
        """Add this backend's extras that ledgers created by older versions lack."""

    def stream_versions_sql(self, count: int) -> str:
        """``count`` comma-separated scalar subqueries, one per stream parameter, each
        giving that stream's current version (NULL for no stream).

        One scalar subquery per stream: each is a single backward step on the
        (stream, stream_version) index, however long the stream (IN ... GROUP BY would
        read every entry of the stream)."""
        one = f"(SELECT MAX(stream_version) FROM events WHERE stream = {self.placeholder})"
        return ", ".join([one] * count)
