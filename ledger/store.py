"""The event store: append and read the log on SQLite or PostgreSQL.

Every append is one transaction serialised through the one-row ledger head (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: ``SELECT ... FOR UPDATE`` on the head row). Holding it,
the store reads the head, assigns the next dense positions, checks the expected stream
version, hashes each event into the chain and the Merkle frontier, inserts, and writes
the head back. A rolled-back append leaves the head as it was, so positions stay dense
and equal to commit order.

Schema, engine and transactions are SQLAlchemy Core; the two hot statements (insert and
scan) go to the driver as plain SQL, which is the same text on both backends. What the two
databases do differently (engines, the ledger lock, snapshots, scans, triggers) is each
one's ``Backend`` in ``ledger.backends``; this module is the same code on both.

Its rooms: the stored row (``ledger.rows``), what an append asks and its events encoded
outside the lock (``ledger.appends``), the write transaction that holds the lock
(``ledger.write_tx``) and the raw snapshot ``verify`` reads (``ledger.snapshot``). Every
public name is importable from here as before.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple, Protocol

import msgspec
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import tables
from .appends import ANY, EMPTY_DELTA, NO_STREAM, Expect, ExpectedVersion, RowEncoder, StreamAppend
from .backends import backend_for, driver_connection, make_engine, url_identity
from .envelope import GENESIS_CHAIN
from .errors import (
    DuplicateEventError,
    InvalidEventError,
    LedgerBusy,
    LedgerError,
    LedgerOpenError,
    LedgerSchemaError,
    LedgerUnavailable,
)
from .events import DEFAULT_CATALOG, Catalog, EventPayload, NewEvent, RecordedEvent
from .ids import new_ulid
from .merkle import Frontier
from .rows import BARE_COLUMNS, COLUMNS, Row, column_list
from .snapshot import Snapshot
from .tails import StreamTails
from .timestamps import utc_now
from .write_tx import SMALL_BLOB, WritePath, WriteTx, has_blob, insert_blobs

__all__ = [
    "ANY",
    "DEFAULT_URL",
    "NO_STREAM",
    "SMALL_BLOB",
    "BareEvent",
    "Expect",
    "ExpectedVersion",
    "LogReader",
    "Snapshot",
    "Store",
    "StreamAppend",
    "TreeHead",
    "WriteTx",
    "default_url",
    "open_store",
    "url_identity",
]

DEFAULT_URL = "sqlite:///evidence.db"
_SELECT_ROWS = f"SELECT {column_list()} FROM events"
_decode_json = msgspec.json.decode


# Forks of this process so far (in the child): a thread's writer connection belongs to
# the process that opened it.
_forks = [0]


def _count_fork() -> None:
    _forks[0] += 1


os.register_at_fork(after_in_child=_count_fork)


class BareEvent(msgspec.Struct, frozen=True, gc=False):
    """An event as a fold reads it (``Store.read_bare``): a ``RecordedEvent`` without
    the ids, actor, time, delta and hashes. Not tracked by the garbage collector (it
    holds no cycles): a rebuild makes one per event."""

    position: int
    stream: str
    stream_version: int
    type: str
    payload: EventPayload


class LogReader(Protocol):
    """The reads an auditor's handler needs (audit, replay, report): a ``Store``, or an
    offline ``ledger.bundle.Bundle``."""

    def head(self) -> TreeHead: ...

    def read_all(
        self,
        from_position: int = 1,
        *,
        to_position: int | None = None,
        batch_size: int = 1000,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        stream_prefix: str | None = None,
    ) -> Iterator[RecordedEvent]: ...

    def read_stream(
        self, stream: str, from_version: int = 1, *, as_of: int | None = None
    ) -> list[RecordedEvent]: ...

    def get_blob(self, digest: str) -> bytes | None: ...

    def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]: ...


class TreeHead(NamedTuple):
    """The log's size, its RFC 9162 root and the last chain hash."""

    size: int
    root: bytes
    chain_hash: bytes


def default_url() -> str:
    return os.environ.get("EVIDENCE_DB") or DEFAULT_URL


def open_store(
    url: str | None = None, *, create: bool = True, catalog: Catalog = DEFAULT_CATALOG
) -> Store:
    """Open (and with ``create``, initialise) the ledger at ``url``.

    ``sqlite:///path`` (WAL, ``synchronous=FULL``, busy timeout) is the embedded default;
    ``postgresql+psycopg://user@host/db`` is the multi-writer deployment. Without a URL,
    ``EVIDENCE_DB`` or ``sqlite:///evidence.db``.
    """
    store = Store(make_engine(url or default_url(), must_exist=not create), catalog)
    try:
        store._prepare(create=create)
    except BaseException:
        store.close()
        raise
    return store


class Store:
    """An open ledger. Thread-safe for concurrent use; one per process is typical."""

    def __init__(self, engine: Engine, catalog: Catalog = DEFAULT_CATALOG) -> None:
        self.engine = engine
        self.catalog = catalog
        # What this database does its own way; ``backend`` is its name.
        self._backend = backend_for(engine)
        self.backend: str = self._backend.name  # "sqlite" | "postgresql"
        self._decoders = catalog.current_decoders()
        self._encoder = RowEncoder(catalog, self._decoders)
        # What each write transaction is given: the backend, the rows' encoder and
        # decoder, the append's statements.
        self._write_path = WritePath(self._backend, self._encoder, self._decode)
        self._integrity_error = engine.dialect.loaded_dbapi.IntegrityError
        # Each thread keeps one writer connection for the store's life: checking one out
        # of the pool per append costs more than the append's own statements.
        self._local = threading.local()
        # Each thread's driver connection: (the thread, the fork it was made in, it).
        self._writers: list[tuple[threading.Thread, int, Any]] = []
        self._writers_lock = threading.Lock()

    @property
    def url(self) -> str:
        """Where the ledger lives: an absolute SQLite path, or the URL without password."""
        return self._backend.display_url(self.engine.url)

    @property
    def placeholder(self) -> str:
        """The driver's parameter marker for plain SQL: ``?`` on SQLite, ``%s`` on
        PostgreSQL. For statements run with ``exec_driver_sql`` in ``read_transaction``,
        or through ``WriteTx`` and ``Snapshot.query``."""
        return self._backend.placeholder

    @property
    def one_connection(self) -> bool:
        """Whether reads and writes share the store's one connection (an in-memory
        SQLite database): then nothing may read in another thread while this one writes."""
        return isinstance(self.engine.pool, sa.pool.StaticPool)

    def close(self) -> None:
        with self._writers_lock:
            writers, self._writers = self._writers, []
        for _thread, _fork, raw in writers:
            raw.invalidate()  # closes the driver connection; it never returns to a pool
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- schema -----------------------------------------------------------------------

    def _prepare(self, *, create: bool) -> None:
        try:
            with self._transaction(write=create) as conn:
                if create:
                    # Two processes initialising one database must not race on DDL.
                    self._backend.lock_schema(conn)
                inspector = sa.inspect(conn)
                if not inspector.has_table("ledger_meta"):
                    if not create:
                        raise LedgerOpenError(
                            f"{self.url} holds no ledger: run `evidence init` first"
                        )
                    self._create_schema(conn)
                    return
                row = conn.execute(
                    sa.select(tables.ledger_meta.c.value).where(
                        tables.ledger_meta.c.key == "schema_version"
                    )
                ).first()
                found = int(row[0]) if row else 0
                if found > tables.SCHEMA_VERSION:
                    raise LedgerSchemaError(
                        f"{self.url} was written by a newer evidence-ledger (schema version "
                        f"{found}; this one reads up to {tables.SCHEMA_VERSION}): upgrade "
                        "evidence-ledger"
                    )
                if found < 1:
                    raise LedgerOpenError(f"{self.url} has a damaged ledger_meta table")
                if not inspector.has_table("consumer_checkpoints"):  # added after v1 shipped
                    self._backend.lock_schema(conn)
                    tables.consumer_checkpoints.create(conn, checkfirst=True)
                self._backend.upgrade_schema(conn)
        except LedgerBusy:  # another writer holds the lock: the ledger is there
            raise
        except LedgerUnavailable as exc:  # no server there, or it ended the session
            said = " ".join(str(getattr(exc.__cause__, "orig", exc)).split())  # one line
            raise LedgerOpenError(f"cannot open {self.url}: {said}") from None
        except LedgerError:
            raise
        except DBAPIError as exc:
            raise LedgerOpenError(f"cannot open {self.url}: {exc.orig}") from None

    def _create_schema(self, conn: Connection) -> None:
        tables.metadata.create_all(conn)
        for ddl in self._backend.append_only_ddl():
            conn.execute(sa.DDL(ddl))
        conn.execute(
            tables.ledger_meta.insert(),
            [
                {"key": "schema_version", "value": str(tables.SCHEMA_VERSION)},
                {"key": "ledger_id", "value": new_ulid()},
                {"key": "created_at", "value": utc_now()},
            ],
        )
        conn.execute(
            tables.ledger_head.insert().values(id=1, size=0, chain_hash=GENESIS_CHAIN, frontier=b"")
        )

    def meta(self) -> dict[str, str]:
        with self._transaction() as conn:
            rows = conn.execute(sa.select(tables.ledger_meta)).all()
        return {k: v for k, v in rows}

    @contextmanager
    def read_transaction(self, *, snapshot: bool = False) -> Iterator[Connection]:
        """A read transaction on a pooled SQLAlchemy connection, for reads beside the
        log's own (read models, their checkpoints, the stored leaf hashes). With
        ``snapshot``, every statement in it sees the database as of one moment (a
        checkpoint and the tables it covers, say). It takes no ledger lock: a decision
        belongs in ``write``. Plain SQL uses ``placeholder``."""
        with self._transaction(snapshot=snapshot) as conn:
            yield conn

    @contextmanager
    def side_write(self) -> Iterator[Connection]:
        """A write transaction beside the log, for bookkeeping no decision rests on (a
        named consumer's acknowledged position): SQLite's write lock taken at BEGIN, so
        it never upgrades a read lock and deadlocks; never the ledger lock, never an
        event (an append is ``write``'s)."""
        with self._transaction(write=True) as conn:
            yield conn

    @contextmanager
    def _transaction(self, *, write: bool = False, snapshot: bool = False) -> Iterator[Connection]:
        """A transaction; ``snapshot`` when several statements must see one moment;
        ``write`` takes the write lock at BEGIN where the database needs it (SQLite)."""
        with self._driver_errors(), self.engine.connect() as conn:
            options = self._backend.transaction_options(write=write, snapshot=snapshot)
            if options:
                conn = conn.execution_options(**options)
            with conn.begin():
                yield conn

    # -- append -----------------------------------------------------------------------

    def append(
        self,
        stream: str,
        events: Sequence[NewEvent],
        expected_version: ExpectedVersion = ANY,
        *,
        blobs: Iterable[bytes] = (),
    ) -> list[int]:
        """Append ``events`` to ``stream`` atomically; returns their positions."""
        return self.append_batch([StreamAppend(stream, events, expected_version)], blobs=blobs)

    def append_batch(
        self, appends: Sequence[StreamAppend], *, blobs: Iterable[bytes] = ()
    ) -> list[int]:
        """Append to several streams in one transaction: all of it, or none of it."""
        prepared = self._encoder.prepare(appends)
        blob_list = list(blobs)
        # ``write()`` without its own context-manager layer: each layer costs a few
        # microseconds, several times that right after the previous commit's fsync.
        tx: WriteTx | None = None
        try:
            with self._driver_errors(), self._write_cursor() as (cursor, aux):
                tx = WriteTx(self._write_path, cursor, aux)
                rows = tx.append_prepared(appends, prepared, blob_list)
        except self._integrity_error as exc:
            self._raise_duplicate(exc, tx)
            raise
        return [row[0] for row in rows]

    @contextmanager
    def write(
        self, *, tails: StreamTails | None = None, may_defer: bool = False
    ) -> Iterator[WriteTx]:
        """A write transaction holding the ledger lock.

        Appends made through it and the caller's own statements (read models, written
        inline by command handlers) commit together or not at all. With ``tails`` (the
        writer's own, kept across its transactions: ``ledger.tails``) stream reads the
        tails hold cost no statement.

        ``may_defer``: a writer of the transaction may leave its flush to disk to the
        next durable commit (``WriteTx.defer_flush``); known before it begins.
        """
        tx: WriteTx | None = None
        view = tails.claim() if tails is not None else None
        try:

            def lasting() -> bool:  # asked at the commit: what the writers said by then
                return tx is None or tx.lasting

            with (
                self._driver_errors(),
                self._write_cursor(lasting, may_defer) as (cursor, aux),
            ):
                tx = WriteTx(self._write_path, cursor, aux, view)
                yield tx
        except BaseException as exc:
            if tails is not None and view is not None:
                view.forget()  # it may hold this transaction's rolled-back appends
                tails.release(None)
            if isinstance(exc, self._integrity_error):
                self._raise_duplicate(exc, tx)
            raise
        if tails is not None and view is not None:
            assert tx is not None
            tails.release(tx.locked_size)

    def _raise_duplicate(self, exc: Exception, tx: WriteTx | None) -> None:
        """A unique violation on ``event_id``: which of the ids are already stored."""
        if "event_id" in str(exc) and tx is not None and tx.appended:
            raise DuplicateEventError(self._existing_ids(tx.event_ids)) from None

    @contextmanager
    def _driver_errors(self) -> Iterator[None]:
        """The one place a driver's error becomes the ledger's own (``Backend.translate``:
        a lock held past the wait, a lost connection, a read-only file, a full disk); one
        the backend does not know goes up as it is (a defect)."""
        try:
            yield
        except LedgerError:
            raise
        except Exception as exc:
            mapped = self._backend.translate(exc)
            if mapped is None:
                raise
            raise mapped from exc

    def durable_head(self) -> TreeHead:
        """The head, with every event under it on disk (``flush``): the one to sign."""
        head = self.head()
        self.flush()
        return head

    def flush(self) -> None:
        """Make every committed append durable, those whose flush was left to a later
        commit too (``WriteTx.defer_flush``): before a tree head that covers them is
        signed, so that no power cut can take back an event a signature names."""
        with self._driver_errors():
            self._backend.flush(driver_connection(self._writer()))

    @contextmanager
    def _write_cursor(
        self, lasting: Callable[[], bool] = lambda: True, may_defer: bool = False
    ) -> Iterator[tuple[Any, Any]]:
        """A write transaction on this thread's driver connection.

        The append path talks to the driver directly: it is the hot path, and on
        PostgreSQL it pipelines (head lock + stream versions in one round trip; inserts,
        head update and commit in a second).
        """
        raw = self._writer()
        driver = driver_connection(raw)
        try:
            with self._backend.write_cursors(driver, lasting, may_defer) as cursors:
                yield cursors
        except BaseException:
            try:
                driver.rollback()
            except Exception:
                self._drop_writer(raw)  # the connection itself is gone
                raise
            if getattr(driver, "broken", False) or getattr(driver, "closed", False):
                self._drop_writer(raw)
            raise

    def _writer(self) -> Any:
        raw = getattr(self._local, "writer", None)
        # Never share across a fork (a counter the fork hook moves: no getpid call).
        if raw is None or self._local.forks != _forks[0]:
            raw = self.engine.raw_connection()
            self._local.writer, self._local.forks = raw, _forks[0]
            with self._writers_lock:
                # The connections of threads that have ended (a service's worker threads
                # come and go) are closed here, or each would be held until the store
                # closes. Only this process's own: a connection made before a fork is
                # the parent's, and closing it would end the parent's session.
                ended = [w for w in self._writers if w[1] == _forks[0] and not w[0].is_alive()]
                self._writers = [w for w in self._writers if w not in ended]
                self._writers.append((threading.current_thread(), _forks[0], raw))
            for _thread, _fork, old in ended:
                old.invalidate()
        return raw

    def _drop_writer(self, raw: Any) -> None:
        """Forget this thread's driver connection, which the server ended (or which
        broke): and the pool's idle ones with it — a session the server ended (a
        restart, a failover, a terminated backend) leaves the pooled ones as likely
        gone, and the next request must get a live one, not fail again."""
        self._local.writer = None
        with self._writers_lock:
            self._writers = [w for w in self._writers if w[2] is not raw]
        raw.invalidate()
        self.engine.dispose(close=False)  # a new pool; connections in use go on

    def _existing_ids(self, ids: list[str]) -> list[str]:
        with self._transaction() as conn:
            found = conn.execute(
                sa.select(tables.events.c.event_id).where(tables.events.c.event_id.in_(ids))
            ).scalars()
            return sorted(found)

    # -- blobs ------------------------------------------------------------------------

    def put_blob(self, data: bytes) -> str:
        """Store ``data`` content-addressed; returns its SHA-256 hex digest."""
        with self._write_cursor() as (cursor, _):
            cursor.execute(self._backend.lock_head_sql)  # serialise with appends
            cursor.fetchone()
            return insert_blobs(cursor, self.placeholder, [data])[0]

    def present_blobs(self, digests: Sequence[str]) -> set[str]:
        """Which of ``digests`` the blob store holds."""
        with self._transaction() as conn:
            cursor = driver_connection(conn.connection).cursor()
            try:
                return {d for d in digests if has_blob(cursor, self.placeholder, d)}
            finally:
                cursor.close()

    def get_blob(self, digest: str) -> bytes | None:
        """The blob stored under ``digest`` (None: not stored). One statement on this
        thread's driver connection (``_read_rows``): an audit asks for two per gate
        check."""
        rows = self._read_rows(
            f"SELECT data FROM blobs WHERE digest = {self.placeholder}", (digest,)
        )
        return bytes(rows[0][0]) if rows else None

    def get_blobs(self, digests: Collection[str]) -> dict[str, bytes]:
        """The blobs stored under ``digests`` (those it holds), in one statement per
        500: what a reader walking the log needs for a batch of its events."""
        found: dict[str, bytes] = {}
        wanted = list(dict.fromkeys(digests))
        for start in range(0, len(wanted), 500):
            part = wanted[start : start + 500]
            marks = ", ".join([self.placeholder] * len(part))
            sql = f"SELECT digest, data FROM blobs WHERE digest IN ({marks})"
            found.update((d, bytes(data)) for d, data in self._read_rows(sql, part))
        return found

    # -- reads ------------------------------------------------------------------------

    def head(self) -> TreeHead:
        """Size, RFC 9162 root (derived from the stored frontier) and last chain hash."""
        h = tables.ledger_head.c
        with self._transaction() as conn:
            size, chain, packed = conn.execute(sa.select(h.size, h.chain_hash, h.frontier)).one()
        return TreeHead(size, Frontier.from_bytes(size, bytes(packed)).root(), bytes(chain))

    def stream_version(self, stream: str, *, as_of: int | None = None) -> int:
        ev = tables.events
        query = sa.select(sa.func.coalesce(sa.func.max(ev.c.stream_version), 0)).where(
            ev.c.stream == stream
        )
        if as_of is not None:
            query = query.where(ev.c.position <= as_of)
        with self._transaction() as conn:
            return conn.execute(query).scalar_one()

    def read_stream(
        self, stream: str, from_version: int = 1, *, as_of: int | None = None
    ) -> list[RecordedEvent]:
        """One stream's events from ``from_version``, optionally as of a log position."""
        ph = self.placeholder
        sql = f"{_SELECT_ROWS} WHERE stream = {ph} AND stream_version >= {ph}"
        params: tuple[Any, ...] = (stream, from_version)
        if as_of is not None:
            sql += f" AND position <= {ph}"
            params += (as_of,)
        sql += " ORDER BY stream_version"
        return [self._decode(row) for row in self._read_rows(sql, params)]

    def read_stream_types(self, stream: str, types: Sequence[str]) -> list[RecordedEvent]:
        """One stream's events of the given types, in stream order: a reader that needs
        a few kinds of a long stream's events decodes only those."""
        ph = self.placeholder
        sql = (
            f"{_SELECT_ROWS} WHERE stream = {ph} AND type IN ({', '.join([ph] * len(types))}) "
            "ORDER BY stream_version"
        )
        return [self._decode(row) for row in self._read_rows(sql, (stream, *types))]

    def read_types(self, types: Sequence[str], after: int = 0) -> list[RecordedEvent]:
        """Every event of the given types after position ``after``, in position order
        (the type index), in one statement: for the few, small types of policy."""
        ph = self.placeholder
        sql = (
            f"{_SELECT_ROWS} WHERE type IN ({', '.join([ph] * len(types))}) "
            f"AND position > {ph} ORDER BY position"
        )
        return [self._decode(row) for row in self._read_rows(sql, (*types, after))]

    def read_types_to_head(
        self, types: Sequence[str], after: int = 0
    ) -> tuple[int, list[RecordedEvent]]:
        """``read_types``, with the log's size in the same snapshot: a reader that asks
        again from that size reads only what came since (asking from the position of the
        last event found would scan every event after it, whatever its type)."""
        ph = self.placeholder
        columns = column_list(prefix="e.")
        sql = (
            f"SELECT h.size, {columns} FROM ledger_head h LEFT JOIN events e "
            f"ON e.position > {ph} AND e.type IN ({', '.join([ph] * len(types))}) "
            "WHERE h.id = 1 ORDER BY e.position"
        )
        rows = self._read_rows(sql, (after, *types))
        size = rows[0][0] if rows else 0
        return size, [self._decode(row[1:]) for row in rows if row[1] is not None]

    def _read_rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of one read statement, on this thread's driver connection when it is
        idle (the hot reads of a decision: one round trip, no pool), else on a pooled
        connection in a transaction of its own."""
        raw = self._writer()
        driver = driver_connection(raw)
        if not self._backend.in_transaction(driver):
            try:
                with self._driver_errors():
                    return self._backend.read_statement(driver, sql, params)
            except BaseException:
                if getattr(driver, "broken", False) or getattr(driver, "closed", False):
                    self._drop_writer(raw)
                raise
        with self._transaction() as conn:
            return list(conn.exec_driver_sql(sql, params).all())

    def read_all(
        self,
        from_position: int = 1,
        *,
        to_position: int | None = None,
        batch_size: int = 1000,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        stream_prefix: str | None = None,
    ) -> Iterator[RecordedEvent]:
        """Every event from ``from_position`` (to ``to_position``), in position order.

        Read in batches by position, each batch its own short transaction; positions are
        dense and commit-ordered, so paging by position never skips an event.
        """
        for batch in self.read_batches(
            from_position,
            to_position=to_position,
            batch_size=batch_size,
            types=types,
            stream=stream,
            stream_prefix=stream_prefix,
        ):
            yield from batch

    def read_batches(
        self,
        from_position: int = 1,
        *,
        to_position: int | None = None,
        batch_size: int = 1000,
        types: Sequence[str] | None = None,
        stream: str | None = None,
        stream_prefix: str | None = None,
    ) -> Iterator[list[RecordedEvent]]:
        """``read_all`` in lists (empty lists are skipped).

        Without ``types``/``stream`` the log is read in windows of positions
        ``[p, p + batch_size)``: positions are dense, so each window is an exact primary
        key range, cheap under any query plan; reading stops at ``to_position`` or at the
        head as it was when reading started. With a filter, keyset pages by position let
        the database use the filter's index. ``stream_prefix`` (e.g. ``"tool:"``) is
        applied to the raw rows before decoding."""
        decode = self._decode
        for rows in self._row_batches(
            COLUMNS, from_position, to_position, batch_size, types, stream, stream_prefix
        ):
            yield [decode(row) for row in rows]

    def read_bare(
        self,
        from_position: int = 1,
        *,
        to_position: int | None = None,
        batch_size: int = 1000,
        stream_prefix: str | None = None,
    ) -> Iterator[list[BareEvent]]:
        """``read_batches`` with only what a fold needs (``BareEvent``: position, stream,
        stream version, type, payload), for rebuilding and catching up read models.

        The same windows over the same rows, and each payload decoded (and upcast) by the
        same typed decoders as ``read_all``'s; what is left out is what a fold never
        reads: ids, actor, time, the delta (its JSON decode) and the hashes."""
        decoders = self._decoders
        for rows in self._row_batches(
            BARE_COLUMNS, from_position, to_position, batch_size, None, None, stream_prefix
        ):
            try:
                # The common case in one comprehension: every (type, version) current.
                # (The rows unpack in ``BARE_COLUMNS``' order.)
                events = [
                    BareEvent(p, s, v, t, decoders[t, sv].decode(payload))
                    for p, s, v, t, sv, payload in rows
                ]
            except (KeyError, msgspec.DecodeError, msgspec.ValidationError):
                # An old version to upcast, an unknown type, or bytes that do not decode:
                # row by row, with the one refusal ``_decode`` gives.
                events = [self._decode_bare(row) for row in rows]
            yield events

    def _row_batches(
        self,
        columns: tuple[str, ...],
        from_position: int,
        to_position: int | None,
        batch_size: int,
        types: Sequence[str] | None,
        stream: str | None,
        stream_prefix: str | None,
    ) -> Iterator[list[Row]]:
        """The raw rows of ``read_batches`` (``columns``: ``COLUMNS``, or ``BARE_COLUMNS``):
        the one paging logic of ``read_batches`` and ``read_bare``."""
        ph = self.placeholder
        stream_at = columns.index("stream")
        selected = column_list(columns)
        position = max(from_position, 1)
        windowed = not types and stream is None
        if windowed:
            end = to_position if to_position is not None else self.head().size
            sql = (
                f"SELECT {selected} FROM events WHERE position >= {ph} "
                f"AND position <= {ph} ORDER BY position"
            )
        else:
            where = [f"position >= {ph}"]
            extra: list[Any] = []
            if to_position is not None:
                where.append(f"position <= {ph}")
                extra.append(to_position)
            if types:
                where.append(f"type IN ({', '.join([ph] * len(types))})")
                extra.extend(types)
            if stream is not None:
                where.append(f"stream = {ph}")
                extra.append(stream)
            sql = (
                f"SELECT {selected} FROM events WHERE {' AND '.join(where)} "
                f"ORDER BY position LIMIT {int(batch_size)}"
            )
        while True:
            if windowed:
                if position > end:
                    return
                params: tuple[Any, ...] = (position, min(end, position + batch_size - 1))
            else:
                params = (position, *extra)
            with self._transaction() as conn:
                # Plain driver tuples: SQLAlchemy Row objects cost more than decoding.
                cursor = driver_connection(conn.connection).cursor()
                try:
                    cursor.execute(sql, params)
                    rows = cursor.fetchall()
                finally:
                    cursor.close()
            if windowed:
                position = params[1] + 1
            elif not rows:
                return
            else:
                position = rows[-1][0] + 1
            # A short page is the last one; judged before the prefix filter drops rows.
            last_page = not windowed and len(rows) < batch_size
            if stream_prefix is not None:
                rows = [row for row in rows if row[stream_at].startswith(stream_prefix)]
            if rows:
                yield rows
            if last_page:
                return

    def read_backwards(
        self,
        to_position: int | None = None,
        *,
        from_position: int = 1,
        batch_size: int = 1000,
        types: Sequence[str] | None = None,
        stream: str | None = None,
    ) -> Iterator[RecordedEvent]:
        """The events of ``from_position..to_position`` (default: the head when reading
        starts), newest first: what ``evidence events --last N`` and ``--reverse`` read.

        Keyset pages by descending position, each its own short transaction; a filter
        pages the same way, so the last N of a stream or a type cost N rows, not a scan
        from the start."""
        ph = self.placeholder
        position = self.head().size if to_position is None else to_position
        where = [f"position <= {ph}", f"position >= {ph}"]
        extra: list[Any] = [max(from_position, 1)]
        if types:
            where.append(f"type IN ({', '.join([ph] * len(types))})")
            extra.extend(types)
        if stream is not None:
            where.append(f"stream = {ph}")
            extra.append(stream)
        sql = (
            f"{_SELECT_ROWS} WHERE {' AND '.join(where)} "
            f"ORDER BY position DESC LIMIT {int(batch_size)}"
        )
        while position >= max(from_position, 1):
            with self._transaction() as conn:
                rows = conn.exec_driver_sql(sql, (position, *extra)).all()
            for row in rows:
                yield self._decode(row)
            if len(rows) < batch_size:
                return
            position = rows[-1][0] - 1

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        """One consistent read of the raw log: head, rows and blobs as of one moment.

        Used by ``verify``: nothing is decoded, the rows are exactly the stored bytes.
        """
        with self._transaction(snapshot=True) as conn:
            yield Snapshot(conn, self._backend)

    def _decode(self, row: Row) -> RecordedEvent:
        """One stored row as the event it records. Unpacked as a tuple in ``StoredRow``'s
        order (the SELECTs' ``COLUMNS``), not made a ``StoredRow``: this is every read's
        hot spot, and ``RecordedEvent`` is built positionally in the same order."""
        (
            position,
            event_id,
            stream,
            stream_version,
            type_name,
            sv,
            recorded_at,
            actor,
            corr,
            caus,
            payload,
            delta,
            leaf,
            chain,
        ) = row
        decoder = self._decoders.get((type_name, sv))
        try:
            return RecordedEvent(
                position,
                event_id,
                stream,
                stream_version,
                type_name,
                sv,
                recorded_at,
                actor,
                corr,
                caus,
                decoder.decode(payload)
                if decoder is not None
                else self.catalog.decode(type_name, sv, payload),  # upcast, or an unknown type
                [] if delta == EMPTY_DELTA else _decode_json(delta),
                bytes(leaf),
                bytes(chain),
            )
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _undecodable(position, type_name, sv, exc) from None

    def _decode_bare(self, row: Row) -> BareEvent:
        """One row of ``read_bare`` (``BARE_COLUMNS``, in that order), decoded as
        ``_decode`` decodes the payload."""
        position, stream, stream_version, type_name, sv, payload = row
        decoder = self._decoders.get((type_name, sv))
        try:
            return BareEvent(
                position,
                stream,
                stream_version,
                type_name,
                decoder.decode(payload)
                if decoder is not None
                else self.catalog.decode(type_name, sv, payload),
            )
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _undecodable(position, type_name, sv, exc) from None


def _undecodable(position: int, type_name: str, sv: int, exc: Exception) -> InvalidEventError:
    # Only an edit of the database makes stored bytes that do not decode: say so in one
    # line (a refusal), never a traceback.
    return InvalidEventError(
        f"the stored event at position {position} does not decode as {type_name} "
        f"version {sv} ({exc}): `evidence event {position}` shows it as stored, "
        "`evidence verify` whether it was changed"
    )
