"""One write transaction holding the ledger lock (``Store.write``, ``Store.append``).

Holding the lock, an append reads the head, assigns the next dense positions, checks
the expected stream versions, hashes each event into the chain and the Merkle frontier,
inserts, and writes the head back. Reads made in the transaction see the log as the lock
holds it: a decision made on them cannot be overtaken by another writer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from hashlib import sha256
from typing import Any

import msgspec

from .appends import ANY, EMPTY_DELTA, NO_STREAM, Expect, Prepared, RowEncoder, StreamAppend
from .backends import Backend
from .envelope import LEAF_JOIN
from .errors import ConcurrencyError
from .events import RecordedEvent
from .merkle import Frontier, merge_up
from .rows import COLUMNS, Row, StoredRow, column_list
from .tails import CATCH_UP_LIMIT, TailsView

__all__ = ["SMALL_BLOB", "WritePath", "WriteTx", "has_blob", "insert_blobs"]

_LEAF_INPUT = b"\x00" + LEAF_JOIN  # what the leaf hash is over: 0x00 || leaf bytes
_SELECT_ROWS = f"SELECT {column_list()} FROM events"
_decode_json = msgspec.json.decode


# Blobs up to this size are inserted without asking whether they are stored (a
# duplicate is dropped by the database): resending one costs less than a round trip.
SMALL_BLOB = 64 * 1024


def insert_blobs(cursor: Any, ph: str, blob_list: list[bytes]) -> list[str]:
    """Store ``blob_list`` content-addressed through ``cursor`` (in a transaction that
    holds the ledger lock); returns their SHA-256 hex digests."""
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


def has_blob(cursor: Any, ph: str, digest: str) -> bool:
    """Whether the blob store holds ``digest`` (read through ``cursor``)."""
    cursor.execute(f"SELECT 1 FROM blobs WHERE digest = {ph}", (digest,))
    return cursor.fetchone() is not None


class WritePath:
    """What a store's write transactions share, made once per store: its backend, its
    rows' encoder and decoder, and the statements of an append."""

    __slots__ = ("backend", "decode", "encoder", "insert_sql", "ph", "update_head_sql")

    def __init__(
        self, backend: Backend, encoder: RowEncoder, decode: Callable[[Row], RecordedEvent]
    ) -> None:
        self.backend, self.encoder, self.decode = backend, encoder, decode
        self.ph = ph = backend.placeholder  # the driver's placeholder: "?" or "%s"
        values = ", ".join([ph] * len(COLUMNS))
        self.insert_sql = f"INSERT INTO events ({column_list()}) VALUES ({values})"
        self.update_head_sql = (
            f"UPDATE ledger_head SET size = {ph}, chain_hash = {ph}, frontier = {ph} WHERE id = 1"
        )


class WriteTx:
    """One write transaction holding the ledger lock (see ``Store.write``)."""

    def __init__(
        self, path: WritePath, cursor: Any, aux: Any, tails: TailsView | None = None
    ) -> None:
        self._path, self._cursor, self._aux = path, cursor, aux
        # The writer's tails (``ledger.tails``): stream reads answered from memory once
        # the lock is held and the tails are brought up to the locked head.
        self._tails = tails
        self.backend: str = path.backend.name  # "sqlite" | "postgresql"
        self.ph = path.ph  # the driver's placeholder: "?" or "%s"
        self._size: int | None = None
        # The head row as the lock read it (size, chain hash, frontier), and the streams'
        # versions this transaction has read under the lock: an append needs to read
        # neither again (nothing can move them while the lock is held).
        self._head: tuple[int, bytes, bytes] | None = None
        self._versions: dict[str, int] = {}
        self._event_ids: list[str] = []
        self._reader: Any = None
        self._writer: Any = None
        # Whether the commit may leave its flush to the next durable one: None until a
        # writer says, and False once any writer of the transaction needs it durable.
        self._deferrable: bool | None = None

    def defer_flush(self, allowed: bool) -> None:
        """One writer's word on this transaction's flush (``Store.write``): it is left
        to the next durable commit only if every writer allowed it (a group commit's
        jobs each have a say)."""
        self._deferrable = allowed and self._deferrable is not False

    @property
    def lasting(self) -> bool:
        """Whether the commit flushes to disk before it returns."""
        return self._deferrable is not True

    @property
    def _reads(self) -> Any:
        """The cursor of this transaction's reads (``query``, ``read_stream``, ...): its
        own, never the one the caller's writes go to. On PostgreSQL the transaction runs
        in pipeline mode, where a statement's results arrive whenever the server flushes
        them and are handed to the cursor that sent it: a read on the cursor of a long
        ``executemany`` could take one of the insert's late results for its own
        (tests/ledger/test_write_tx.py). A cursor that only ever reads, each read fetched at
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

    @property
    def event_ids(self) -> list[str]:
        """The ids of the events this transaction has appended (or tried to)."""
        return list(self._event_ids)

    @property
    def locked_size(self) -> int | None:
        """The log's size as this transaction's lock last saw it, its own appends
        counted; None while it has not taken the lock."""
        return self._size

    def head_size(self) -> int:
        """The log's size, locking the head first if this transaction has not yet."""
        if self._size is None:
            tails = self._tails
            if tails is not None and tails.size is not None:
                # The events since the tails' head, read in the lock's round trip.
                rows = self._lock_with(
                    f"{_SELECT_ROWS} WHERE position > {self.ph} "
                    f"ORDER BY position LIMIT {CATCH_UP_LIMIT + 1}",
                    (tails.size,),
                )
                assert self._size is not None
                tails.catch_up(self._size, rows)
            else:
                self._cursor.execute(self._path.backend.lock_head_sql)
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
        self._cursor.execute(self._path.backend.lock_head_sql)
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
        prepared = self._path.encoder.prepare(appends)
        rows = self.append_prepared(appends, prepared, list(blobs))
        payloads = [new.payload for _s, events, _e in appends for new in events]
        events = []
        for row, payload in zip(map(StoredRow._make, rows), payloads, strict=True):
            events.append(
                RecordedEvent(
                    position=row.position,
                    event_id=row.event_id,
                    stream=row.stream,
                    stream_version=row.stream_version,
                    type=row.type,
                    schema_version=row.schema_version,
                    recorded_at=row.recorded_at,
                    actor=row.actor,
                    correlation_id=row.correlation_id,
                    causation_id=row.causation_id,
                    payload=payload,
                    # As the read path decodes it (a fresh list, JSON's own types).
                    delta=[] if row.delta == EMPTY_DELTA else _decode_json(row.delta),
                    leaf_hash=row.leaf_hash,
                    chain_hash=row.chain_hash,
                )
            )
        return events

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
                return [self._path.decode(row) for row in held]
        rows = self._locked_read(
            f"{_SELECT_ROWS} WHERE stream = {self.ph} "
            f"AND stream_version >= {self.ph} ORDER BY stream_version",
            (stream, from_version),
        )
        if tails is not None:
            tails.learn_read(stream, from_version, rows)
        events = [self._path.decode(row) for row in rows]
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
            f"{_SELECT_ROWS} WHERE position >= {self.ph} "
            f"AND position <= {self.ph} ORDER BY position",
            (first, last),
        )
        return [self._path.decode(row) for row in reads.fetchall()]

    def read_types(self, types: Sequence[str], after: int = 0) -> list[RecordedEvent]:
        """Every event of the given types after position ``after``, in position order
        (the type index), read under this transaction's lock."""
        self.head_size()
        reads = self._reads
        reads.execute(
            f"{_SELECT_ROWS} WHERE type IN "
            f"({', '.join([self.ph] * len(types))}) AND position > {self.ph} ORDER BY position",
            (*types, after),
        )
        return [self._path.decode(row) for row in reads.fetchall()]

    def read_types_to_head(
        self, types: Sequence[str], after: int = 0
    ) -> tuple[int, list[RecordedEvent]]:
        """``read_types`` under this transaction's lock, with the log's size."""
        return self.head_size(), self.read_types(types, after)

    def present_blobs(self, digests: Sequence[str]) -> set[str]:
        """Which of ``digests`` the blob store holds (read under this transaction)."""
        self.head_size()
        reads = self._reads
        return {d for d in digests if has_blob(reads, self.ph, d)}

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

    def append_prepared(
        self,
        appends: Sequence[StreamAppend],
        prepared: list[list[Prepared]],
        blob_list: list[bytes],
    ) -> list[Row]:
        """Lock, check versions, hash, insert ``appends``, their events ``prepared``
        (``RowEncoder.prepare``, outside the lock); returns the stored rows.

        Kept whole: everything here happens under the ledger's lock, once per event, in
        one pass with the hashing bound to locals; each split would add a call per event
        to the time the lock is held (``bench/append.py``)."""
        path, cursor = self._path, self._cursor
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
            size, chain, packed, found = path.backend.read_head_locked(cursor, self._aux, streams)
            versions = {stream: v or 0 for stream, v in zip(streams, found, strict=True)}
        frontier = Frontier.from_bytes(size, bytes(packed))
        hashes = frontier.hashes
        chain = bytes(chain)
        position = size
        rows: list[Row] = []
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
                    (  # a ``StoredRow``'s columns, in order (a plain tuple: the hot path)
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
            insert_blobs(cursor, path.ph, blob_list)
        packed = frontier.to_bytes()
        if rows:
            if len(rows) == 1:
                cursor.execute(path.insert_sql, rows[0])
            else:
                cursor.executemany(path.insert_sql, rows)
            cursor.execute(path.update_head_sql, (position, chain, packed))
        self._size = position
        self._head = (position, chain, packed)
        known.update(versions)
        if self._tails is not None:
            for row in rows:
                self._tails.learn_row(row)
        return rows
