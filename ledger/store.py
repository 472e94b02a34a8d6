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
"""

from __future__ import annotations

import enum
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from hashlib import sha256
from typing import Any, NamedTuple, Protocol

import msgspec
import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from . import tables
from .backends import Backend, backend_for, driver_connection, make_engine, url_identity
from .canonical import CanonicalizationError, canonical_json, struct_encoder
from .envelope import GENESIS_CHAIN, LEAF_HEAD, LEAF_JOIN, json_string, leaf_middle, leaf_tail
from .errors import (
    ConcurrencyError,
    DuplicateEventError,
    InvalidEventError,
    LedgerBusy,
    LedgerError,
    LedgerOpenError,
    LedgerSchemaError,
    LedgerUnavailable,
)
from .events import DEFAULT_CATALOG, Catalog, EventPayload, NewEvent, RecordedEvent
from .ids import is_ulid, new_ulid, new_ulids
from .merkle import Frontier, merge_up
from .tails import CATCH_UP_LIMIT, StreamTails, TailsView
from .timestamps import utc_now

__all__ = [
    "ANY",
    "DEFAULT_URL",
    "NO_STREAM",
    "BareEvent",
    "Expect",
    "LogReader",
    "Store",
    "StreamAppend",
    "TreeHead",
    "default_url",
    "open_store",
    "url_identity",
]

DEFAULT_URL = "sqlite:///evidence.db"

_EVENT_COLUMNS = (
    "position, event_id, stream, stream_version, type, schema_version, recorded_at, "
    "actor, correlation_id, causation_id, payload, delta, leaf_hash, chain_hash"
)
# What a fold reads (``read_bare``): the stream at index 1.
_BARE_COLUMNS = "position, stream, stream_version, type, schema_version, payload"
_EMPTY_DELTA = b"[]"
_LEAF_INPUT = b"\x00" + LEAF_JOIN  # what the leaf hash is over: 0x00 || leaf bytes
# A payload class's type name, schema version, encoder, checking decoder and leaf tail.
_PayloadType = tuple[str, int, Callable[[Any], bytes], Callable[[bytes], Any], bytes]
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


class Expect(enum.Enum):
    """Expected-version sentinels. An ``int`` N expects the stream to be at version N."""

    ANY = "any"
    NO_STREAM = "no_stream"


ANY = Expect.ANY
NO_STREAM = Expect.NO_STREAM
ExpectedVersion = Expect | int


class StreamAppend(NamedTuple):
    stream: str
    events: Sequence[NewEvent]
    expected_version: ExpectedVersion = ANY


class Snapshot:
    """Raw reads inside one read transaction (see ``Store.snapshot``)."""

    def __init__(self, conn: Connection, backend: Backend) -> None:
        self._conn = conn
        self._backend = backend

    def head_row(self) -> tuple[int, bytes, bytes]:
        """The stored head: size, chain hash, frontier bytes."""
        h = tables.ledger_head.c
        size, chain, frontier = self._conn.execute(
            sa.select(h.size, h.chain_hash, h.frontier)
        ).one()
        return size, bytes(chain), bytes(frontier)

    def rows(
        self, batch_size: int = 10_000, *, first: int | None = None, last: int | None = None
    ) -> Iterator[list[tuple[Any, ...]]]:
        """Every stored row in position order (or those from ``first`` to ``last``), in
        batches, with constant memory."""
        where = []
        if first is not None:
            where.append(f"position >= {int(first)}")
        if last is not None:
            where.append(f"position <= {int(last)}")
        condition = f" WHERE {' AND '.join(where)}" if where else ""
        sql = f"SELECT {_EVENT_COLUMNS} FROM events{condition} ORDER BY position"
        cursor = self._backend.scan_cursor(driver_connection(self._conn.connection), batch_size)
        try:
            cursor.execute(sql)
            while rows := cursor.fetchmany(batch_size):
                yield rows
        finally:
            cursor.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Any read inside the snapshot (read models and their checkpoints, say)."""
        return [tuple(row) for row in self._conn.exec_driver_sql(sql, tuple(params)).all()]

    def blob(self, digest: str) -> bytes | None:
        data = self._conn.execute(
            sa.select(tables.blobs.c.data).where(tables.blobs.c.digest == digest)
        ).scalar_one_or_none()
        return None if data is None else bytes(data)

    def chunks(self, rows_per_chunk: int) -> list[tuple[int, int, bytes]]:
        """Where the log splits into parts of ``rows_per_chunk`` stored rows: for each
        part, its first position, and the position and chain hash of the row before it
        (0 and empty for the first part): what a part checked apart needs."""
        ((count, low, high),) = self.query(
            "SELECT count(*), min(position), max(position) FROM events"
        )
        if count and low == 1 and high == count:  # dense, as the store writes it: arithmetic
            starts = list(range(1, count + 1, rows_per_chunk))
            chains = dict(
                self.query(
                    "SELECT position, chain_hash FROM events WHERE position IN ("
                    + ", ".join(str(first - 1) for first in starts[1:] or [0])
                    + ")"
                )
            )
            return [(first, first - 1, bytes(chains.get(first - 1) or b"")) for first in starts]
        # A log with holes (only a writer past the store makes one): number the rows.
        found = self.query(
            "SELECT position, previous, previous_chain FROM ("
            "SELECT position, row_number() OVER (ORDER BY position) AS number, "
            "lag(position, 1, 0) OVER (ORDER BY position) AS previous, "
            "lag(chain_hash) OVER (ORDER BY position) AS previous_chain FROM events"
            # (n - 1) mod size, spelled so that neither driver reads a placeholder in it
            f") AS numbered WHERE (number - 1) - ((number - 1) / {int(rows_per_chunk)}) * "
            f"{int(rows_per_chunk)} = 0 ORDER BY position"
        )
        return [(first, previous, bytes(chain or b"")) for first, previous, chain in found]

    def blob_digests(self) -> set[str]:
        """The digests the blob store holds (their contents are not read)."""
        return {digest for (digest,) in self.query("SELECT digest FROM blobs")}

    def blobs(self) -> Iterator[tuple[str, int, bytes]]:
        b = tables.blobs.c
        result = self._conn.execution_options(yield_per=256).execute(
            sa.select(b.digest, b.size, b.data).order_by(b.digest)
        )
        for digest, size, data in result:
            yield digest, size, bytes(data)


# Blobs up to this size are inserted without asking whether they are stored (a
# duplicate is dropped by the database): resending one costs less than a round trip.
SMALL_BLOB = 64 * 1024


class WriteTx:
    """One write transaction holding the ledger lock (see ``Store.write``)."""

    def __init__(self, store: Store, cursor: Any, aux: Any, tails: TailsView | None = None) -> None:
        self._store, self._cursor, self._aux = store, cursor, aux
        # The writer's tails (``ledger.tails``): stream reads answered from memory once
        # the lock is held and the tails are brought up to the locked head.
        self._tails = tails
        self.backend = store.backend
        self.ph = store.placeholder  # the driver's placeholder: "?" or "%s"
        self._size: int | None = None
        # The head row as the lock read it (size, chain hash, frontier), and the streams'
        # versions this transaction has read under the lock: an append needs to read
        # neither again (nothing can move them while the lock is held).
        self._head: tuple[int, bytes, bytes] | None = None
        self._versions: dict[str, int] = {}
        self._event_ids: list[str] = []
        self._reader: Any = None
        self._writer: Any = None

    @property
    def _reads(self) -> Any:
        """The cursor of this transaction's reads (``query``, ``read_stream``, ...): its
        own, never the one the caller's writes go to. On PostgreSQL the transaction runs
        in pipeline mode, where a statement's results arrive whenever the server flushes
        them and are handed to the cursor that sent it: a read on the cursor of a long
        ``executemany`` could take one of the insert's late results for its own
        (tests/test_write_tx.py). A cursor that only ever reads, each read fetched at
        once, has no result pending but its own. (SQLite has no pipeline: its one cursor
        serves.)"""
        if self._reader is None:
            self._reader = self._own_cursor()
        return self._reader

    @property
    def _writes(self) -> Any:
        """The cursor of the caller's ``execute``/``executemany``: its own too, so that
        no result of theirs is pending on the cursor the append path reads the head
        with, nor on the reads' (see ``_reads``)."""
        if self._writer is None:
            self._writer = self._own_cursor()
        return self._writer

    def _own_cursor(self) -> Any:
        return self._aux if self._aux is self._cursor else self._aux.connection.cursor()

    @property
    def appended(self) -> bool:
        """Whether this transaction has appended events (not committed before it ends)."""
        return bool(self._event_ids)

    def head_size(self) -> int:
        """The log's size, locking the head first if this transaction has not yet."""
        if self._size is None:
            tails = self._tails
            if tails is not None and tails.size is not None:
                # The events since the tails' head, read in the lock's round trip.
                rows = self._lock_with(
                    f"SELECT {_EVENT_COLUMNS} FROM events WHERE position > {self.ph} "
                    f"ORDER BY position LIMIT {CATCH_UP_LIMIT + 1}",
                    (tails.size,),
                )
                assert self._size is not None
                tails.catch_up(self._size, rows)
            else:
                self._cursor.execute(self._store._backend.lock_head_sql)
                self._took_head(self._cursor.fetchone())
        assert self._size is not None
        return self._size

    def _took_head(self, row: Sequence[Any]) -> None:
        size, chain, packed = row
        self._head = (size, bytes(chain), bytes(packed))
        self._size = size

    def _locked_read(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """The rows of a read made under the lock. The first read of the transaction
        takes the lock with it (unless the tails have their own read to make then)."""
        if self._size is None and (self._tails is None or self._tails.size is None):
            return self._lock_with(sql, params)
        self.head_size()
        reads = self._reads
        reads.execute(sql, params)
        return list(reads.fetchall())

    def _lock_with(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """Take the lock, then read: on PostgreSQL both statements go in one round trip
        (the read runs after the lock is granted, so in READ COMMITTED it sees every
        append committed before ours)."""
        reads = self._reads
        self._cursor.execute(self._store._backend.lock_head_sql)
        if reads is self._cursor:  # SQLite: one cursor, each result taken before the next
            self._took_head(self._cursor.fetchone())
            reads.execute(sql, params)
        else:
            reads.execute(sql, params)
            self._took_head(self._cursor.fetchone())
        return list(reads.fetchall())

    def append_batch(
        self, appends: Sequence[StreamAppend], *, blobs: Iterable[bytes] = ()
    ) -> list[RecordedEvent]:
        """Append inside this transaction; returns the events as they will be stored."""
        prepared = self._store._prepare_rows(appends)
        rows = self._append_prepared(appends, prepared, list(blobs))
        payloads = [new.payload for _s, events, _e in appends for new in events]
        return [
            RecordedEvent(
                position=row[0],
                event_id=row[1],
                stream=row[2],
                stream_version=row[3],
                type=row[4],
                schema_version=row[5],
                recorded_at=row[6],
                actor=row[7],
                correlation_id=row[8],
                causation_id=row[9],
                payload=payload,
                # As the read path decodes it (a fresh list, JSON's own types).
                delta=[] if row[11] == _EMPTY_DELTA else _decode_json(row[11]),
                leaf_hash=row[12],
                chain_hash=row[13],
            )
            for row, payload in zip(rows, payloads, strict=True)
        ]

    def read_stream(self, stream: str, from_version: int = 1) -> list[RecordedEvent]:
        """One stream's events, read under this transaction's lock: a decision made on
        them cannot be overtaken by another writer before it commits. From the tails
        when they hold them (no statement)."""
        tails = self._tails
        if tails is not None and tails.size is not None:
            self.head_size()  # takes the lock and brings the tails up to its head
            held = tails.rows_from(stream, from_version)
            if held is not None:
                self._versions[stream] = tails.version(stream)
                return [self._store._decode(row) for row in held]
        rows = self._locked_read(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE stream = {self.ph} "
            f"AND stream_version >= {self.ph} ORDER BY stream_version",
            (stream, from_version),
        )
        if tails is not None:
            tails.learn_read(stream, from_version, rows)
        events = [self._store._decode(row) for row in rows]
        # Every version from ``from_version`` on was read: the last is the stream's.
        if events:
            self._versions[stream] = events[-1].stream_version
        elif from_version == 1:
            self._versions[stream] = 0
        return events

    def read_range(self, first: int, last: int) -> list[RecordedEvent]:
        """The events at positions ``first`` to ``last``, read under this transaction's
        lock."""
        self.head_size()
        reads = self._reads
        reads.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE position >= {self.ph} "
            f"AND position <= {self.ph} ORDER BY position",
            (first, last),
        )
        return [self._store._decode(row) for row in reads.fetchall()]

    def read_types(self, types: Sequence[str], after: int = 0) -> list[RecordedEvent]:
        """Every event of the given types after position ``after``, in position order
        (the type index), read under this transaction's lock."""
        self.head_size()
        reads = self._reads
        reads.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE type IN "
            f"({', '.join([self.ph] * len(types))}) AND position > {self.ph} ORDER BY position",
            (*types, after),
        )
        return [self._store._decode(row) for row in reads.fetchall()]

    def read_types_to_head(
        self, types: Sequence[str], after: int = 0
    ) -> tuple[int, list[RecordedEvent]]:
        """``read_types`` under this transaction's lock, with the log's size."""
        return self.head_size(), self.read_types(types, after)

    def present_blobs(self, digests: Sequence[str]) -> set[str]:
        """Which of ``digests`` the blob store holds (read under this transaction)."""
        self.head_size()
        reads = self._reads
        return {d for d in digests if self._store._has_blob(reads, d)}

    def get_blob(self, digest: str) -> bytes | None:
        """A blob's bytes (read under this transaction); None when it is not stored."""
        self.head_size()
        reads = self._reads
        reads.execute(f"SELECT data FROM blobs WHERE digest = {self.ph}", (digest,))
        row = reads.fetchone()
        return bytes(row[0]) if row is not None else None

    def execute(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._writes.execute(sql, params)

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if rows:
            self._writes.executemany(sql, rows)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        reads = self._reads
        reads.execute(sql, params)
        return list(reads.fetchall())

    def _append_prepared(
        self,
        appends: Sequence[StreamAppend],
        prepared: list[list[tuple[Any, ...]]],
        blob_list: list[bytes],
    ) -> list[tuple[Any, ...]]:
        """Lock, check versions, hash, insert; returns the stored rows."""
        store, cursor = self._store, self._cursor
        for stream_rows in prepared:
            self._event_ids.extend(row[0] for row in stream_rows)
        streams = list(dict.fromkeys(a.stream for a in appends))
        known = self._versions
        if self._size is None and self._tails is not None and self._tails.size is not None:
            self.head_size()  # the tails learn what came before the lock
        if self._head is not None and all(stream in known for stream in streams):
            size, chain, packed = self._head  # read under the lock this transaction holds
            versions = {stream: known[stream] for stream in streams}
        else:
            size, chain, packed, found = store._backend.read_head_locked(cursor, self._aux, streams)
            versions = {stream: v or 0 for stream, v in zip(streams, found, strict=True)}
        frontier = Frontier.from_bytes(size, bytes(packed))
        hashes = frontier.hashes
        chain = bytes(chain)
        position = size
        rows: list[tuple[Any, ...]] = []
        for (stream, _events, expected), stream_rows in zip(appends, prepared, strict=True):
            version = versions[stream]
            if expected is not ANY:
                want = 0 if expected is NO_STREAM else expected
                if version != want:
                    shown = expected.value if isinstance(expected, Expect) else expected
                    raise ConcurrencyError(stream, shown, version)
            for (
                event_id,
                type_name,
                sv,
                recorded_at,
                actor,
                corr,
                caus,
                payload,
                delta,
                head,
                middle,
                tail,
            ) in stream_rows:
                position += 1
                version += 1
                # RFC 9162 leaf hash of the envelope's bytes (LEAF_JOIN is leaf_bytes),
                # the 0x00 prefix formatted in: one buffer, no copy behind the prefix.
                leaf = sha256(_LEAF_INPUT % (head, position, middle, version, tail)).digest()
                chain = sha256(chain + leaf).digest()  # chain_next
                hashes.append(leaf)  # as Frontier.append: the size before it is position - 1
                merge_up(hashes, position - 1)
                rows.append(
                    (
                        position,
                        event_id,
                        stream,
                        version,
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
                    )
                )
            versions[stream] = version
        frontier.size = position
        if blob_list:
            store._insert_blobs(cursor, blob_list)
        packed = frontier.to_bytes()
        if rows:
            if len(rows) == 1:
                cursor.execute(store._insert_sql, rows[0])
            else:
                cursor.executemany(store._insert_sql, rows)
            cursor.execute(store._update_head_sql, (position, chain, packed))
        self._size = position
        self._head = (position, chain, packed)
        known.update(versions)
        if self._tails is not None:
            for row in rows:
                self._tails.learn_row(row)
        return rows


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


def _check_ulid(value: str, what: str) -> None:
    if not is_ulid(value):
        raise InvalidEventError(f"{what} {value!r} is not a ULID (26 Crockford base32 chars)")


class Store:
    """An open ledger. Thread-safe for concurrent use; one per process is typical."""

    def __init__(self, engine: Engine, catalog: Catalog = DEFAULT_CATALOG) -> None:
        self.engine = engine
        self.catalog = catalog
        # What this database does its own way; ``backend`` is its name.
        self._backend = backend_for(engine)
        self.backend: str = self._backend.name  # "sqlite" | "postgresql"
        ph = self._backend.placeholder
        self._insert_sql = f"INSERT INTO events ({_EVENT_COLUMNS}) VALUES ({', '.join([ph] * 14)})"
        self._update_head_sql = (
            f"UPDATE ledger_head SET size = {ph}, chain_hash = {ph}, frontier = {ph} WHERE id = 1"
        )
        self._decoders = catalog.current_decoders()
        # payload class -> (type name, schema version, checking decode, leaf tail)
        self._payload_types: dict[type, _PayloadType] = {}
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
        prepared = self._prepare_rows(appends)
        blob_list = list(blobs)
        # ``write()`` without its own context-manager layer: each layer costs a few
        # microseconds, several times that right after the previous commit's fsync.
        tx: WriteTx | None = None
        try:
            with self._driver_errors(), self._write_cursor() as (cursor, aux):
                tx = WriteTx(self, cursor, aux)
                rows = tx._append_prepared(appends, prepared, blob_list)
        except self._integrity_error as exc:
            self._raise_duplicate(exc, tx)
            raise
        return [row[0] for row in rows]

    @contextmanager
    def write(self, *, tails: StreamTails | None = None) -> Iterator[WriteTx]:
        """A write transaction holding the ledger lock.

        Appends made through it and the caller's own statements (read models, written
        inline by command handlers) commit together or not at all. With ``tails`` (the
        writer's own, kept across its transactions: ``ledger.tails``) stream reads the
        tails hold cost no statement.
        """
        tx: WriteTx | None = None
        view = tails.claim() if tails is not None else None
        try:
            with self._driver_errors(), self._write_cursor() as (cursor, aux):
                tx = WriteTx(self, cursor, aux, view)
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
            tails.release(tx._size)

    def _raise_duplicate(self, exc: Exception, tx: WriteTx | None) -> None:
        """A unique violation on ``event_id``: which of the ids are already stored."""
        if "event_id" in str(exc) and tx is not None and tx._event_ids:
            raise DuplicateEventError(self._existing_ids(tx._event_ids)) from None

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

    @contextmanager
    def _write_cursor(self) -> Iterator[tuple[Any, Any]]:
        """A write transaction on this thread's driver connection.

        The append path talks to the driver directly: it is the hot path, and on
        PostgreSQL it pipelines (head lock + stream versions in one round trip; inserts,
        head update and commit in a second).
        """
        raw = self._writer()
        driver = driver_connection(raw)
        try:
            with self._backend.write_cursors(driver) as cursors:
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

    def _prepare_rows(self, appends: Sequence[StreamAppend]) -> list[list[tuple[Any, ...]]]:
        """Validate and encode outside the lock: event id, payload and delta bytes, and
        the event's leaf bytes but for position and stream version (``leaf_parts``)."""
        recorded_at = utc_now()
        payload_type = self._payload_types.get
        seen: set[str] = set()
        refs: set[str] = set()  # correlation/causation ids already checked in this call
        # The ids the store makes, all at once (ULIDs by construction: not checked).
        missing = sum(not new.event_id for _s, events, _e in appends for new in events)
        fresh = iter(new_ulids(missing))
        # The JSON forms of the actors and reference ids of this call (the same for most
        # of its events), for the leaf head.
        json_of: dict[str | None, bytes] = {None: b"null"}
        prepared = []
        for stream, events, _expected in appends:
            if not stream or len(stream) > 512 or not stream.isprintable():
                raise InvalidEventError(f"invalid stream name {stream!r}")
            middles: dict[int, bytes] = {}  # schema version -> leaf middle, for this stream
            rows = []
            for new in events:
                payload = new.payload
                known = payload_type(type(payload)) or self._payload_type(type(payload))
                type_name, sv, encode, decode, tail = known
                event_id = new.event_id
                if not event_id:  # None (or empty): the store makes one
                    event_id = next(fresh)
                else:
                    _check_ulid(event_id, "event id")
                if event_id in seen:
                    raise DuplicateEventError([event_id])
                seen.add(event_id)
                corr, caus = new.correlation_id, new.causation_id
                if corr is not None and corr not in refs:
                    _check_ulid(corr, "correlation id")
                    refs.add(corr)
                if caus is not None and caus not in refs:
                    _check_ulid(caus, "causation id")
                    refs.add(caus)
                actor = new.actor
                if not actor:
                    raise InvalidEventError("an event needs an actor")
                try:
                    payload_bytes = encode(payload)  # canonical_struct
                    # What is stored must read back: this also type-checks the payload,
                    # which msgspec does not do when a Struct is constructed.
                    decode(payload_bytes)
                    delta_bytes = (
                        canonical_json(new.delta, safe_numbers=True) if new.delta else _EMPTY_DELTA
                    )
                except (CanonicalizationError, msgspec.ValidationError) as exc:
                    raise InvalidEventError(f"{type_name}: {exc}") from None
                middle = middles.get(sv)
                if middle is None:
                    middle = middles[sv] = leaf_middle(recorded_at, sv, stream)
                rows.append(
                    (
                        event_id,
                        type_name,
                        sv,
                        recorded_at,
                        actor,
                        corr,
                        caus,
                        payload_bytes,
                        delta_bytes,
                        LEAF_HEAD  # leaf_head, with the JSON forms at hand
                        % (
                            json_of.get(actor) or json_of.setdefault(actor, json_string(actor)),
                            json_of.get(caus) or json_of.setdefault(caus, json_string(caus)),
                            json_of.get(corr) or json_of.setdefault(corr, json_string(corr)),
                            delta_bytes,
                            json_string(event_id),
                            payload_bytes,
                        ),
                        middle,
                        tail,
                    )
                )
            prepared.append(rows)
        return prepared

    def _payload_type(self, cls: type) -> _PayloadType:
        """What appending a payload of class ``cls`` needs of it: its type name (in the
        catalog, or refused), schema version, its canonical encoder, the decode that
        checks its bytes read back (as ``Catalog.decode`` would), and its leaf tail.
        Cached per class: a type name names one class in a catalog for good
        (``Catalog.add``)."""
        type_name = cls.type_name()  # type: ignore[attr-defined]
        if type_name not in self.catalog:
            raise InvalidEventError(f"event type {type_name!r} is not in the catalog")
        sv = cls.SCHEMA_VERSION  # type: ignore[attr-defined]
        decoder = self._decoders.get((type_name, sv))
        decode: Callable[[bytes], Any] = (
            decoder.decode
            if decoder is not None
            else partial(self.catalog.decode, type_name, sv)  # a type added since, say
        )
        known = (type_name, sv, struct_encoder(cls), decode, leaf_tail(type_name))
        self._payload_types[cls] = known
        return known

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
            return self._insert_blobs(cursor, [data])[0]

    def _insert_blobs(self, cursor: Any, blob_list: list[bytes]) -> list[str]:
        ph = self.placeholder
        digests = [sha256(data).hexdigest() for data in blob_list]
        if all(len(data) <= SMALL_BLOB for data in blob_list):
            # Small blobs are sent whether or not they are stored: one statement that
            # needs no answer, where asking first would cost a round trip under the lock.
            cursor.executemany(
                f"INSERT INTO blobs (digest, size, data) VALUES ({ph}, {ph}, {ph}) "
                "ON CONFLICT (digest) DO NOTHING",
                list({d: (d, len(b), b) for d, b in zip(digests, blob_list, strict=True)}.values()),
            )
            return digests
        unique = list(dict.fromkeys(digests))
        cursor.execute(
            f"SELECT digest FROM blobs WHERE digest IN ({', '.join([ph] * len(unique))})",
            unique,
        )
        present = {row[0] for row in cursor.fetchall()}
        fresh: dict[str, bytes] = {}
        for digest, data in zip(digests, blob_list, strict=True):
            if digest not in present:
                fresh[digest] = data
        if fresh:
            cursor.executemany(
                f"INSERT INTO blobs (digest, size, data) VALUES ({ph}, {ph}, {ph})",
                [(d, len(b), b) for d, b in fresh.items()],
            )
        return digests

    def present_blobs(self, digests: Sequence[str]) -> set[str]:
        """Which of ``digests`` the blob store holds."""
        with self._transaction() as conn:
            cursor = driver_connection(conn.connection).cursor()
            try:
                return {d for d in digests if self._has_blob(cursor, d)}
            finally:
                cursor.close()

    def _has_blob(self, cursor: Any, digest: str) -> bool:
        cursor.execute(f"SELECT 1 FROM blobs WHERE digest = {self.placeholder}", (digest,))
        return cursor.fetchone() is not None

    def get_blob(self, digest: str) -> bytes | None:
        with self._transaction() as conn:
            return conn.execute(
                sa.select(tables.blobs.c.data).where(tables.blobs.c.digest == digest)
            ).scalar_one_or_none()

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
        sql = f"SELECT {_EVENT_COLUMNS} FROM events WHERE stream = {ph} AND stream_version >= {ph}"
        params: tuple[Any, ...] = (stream, from_version)
        if as_of is not None:
            sql += f" AND position <= {ph}"
            params += (as_of,)
        sql += " ORDER BY stream_version"
        return [self._decode(row) for row in self._read_rows(sql, params)]

    def read_types(self, types: Sequence[str], after: int = 0) -> list[RecordedEvent]:
        """Every event of the given types after position ``after``, in position order
        (the type index), in one statement: for the few, small types of policy."""
        ph = self.placeholder
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE type IN ({', '.join([ph] * len(types))}) "
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
        columns = ", ".join(f"e.{c.strip()}" for c in _EVENT_COLUMNS.split(","))
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
            _EVENT_COLUMNS, 2, from_position, to_position, batch_size, types, stream, stream_prefix
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
            _BARE_COLUMNS, 1, from_position, to_position, batch_size, None, None, stream_prefix
        ):
            try:
                # The common case in one comprehension: every (type, version) current.
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
        columns: str,
        stream_at: int,
        from_position: int,
        to_position: int | None,
        batch_size: int,
        types: Sequence[str] | None,
        stream: str | None,
        stream_prefix: str | None,
    ) -> Iterator[list[tuple[Any, ...]]]:
        """The raw rows of ``read_batches`` (``columns``, the stream at ``stream_at``):
        the one paging logic of ``read_batches`` and ``read_bare``."""
        ph = self.placeholder
        position = max(from_position, 1)
        windowed = not types and stream is None
        if windowed:
            end = to_position if to_position is not None else self.head().size
            sql = (
                f"SELECT {columns} FROM events WHERE position >= {ph} "
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
                f"SELECT {columns} FROM events WHERE {' AND '.join(where)} "
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
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)} "
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

    def _decode(self, row: Sequence[Any]) -> RecordedEvent:
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
                [] if delta == _EMPTY_DELTA else _decode_json(delta),
                bytes(leaf),
                bytes(chain),
            )
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise _undecodable(position, type_name, sv, exc) from None

    def _decode_bare(self, row: Sequence[Any]) -> BareEvent:
        """One row of ``read_bare`` (its columns), decoded as ``_decode`` decodes the
        payload."""
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
