"""The projection engine: read models folded from the log, never state kept on the side.

A projection here is a name, a version, the stream kind it folds (its pure fold is the
stream document fold of ``projections.documents``), and one read-model table holding
each stream's folded document plus a few columns extracted for queries. Its position
(the last event it has applied) lives in ``projection_checkpoints`` and is written in
the same transaction as its rows.

Two ways of keeping up:

- **inline**: a command handler appends through ``Store.write()`` and calls
  ``apply_inline`` in that same transaction, so a query right after the command sees
  it. Only projections that were current (position == the position before the
  append) are advanced; a lagging one is left to catch up, never skipped over.
- **catch-up**: ``catch_up`` applies everything from a projection's position to the head, under
  the ledger lock, in bounded transactions.

``rebuild`` folds the log into a fresh table and swaps it in atomically; a projection
whose version changed is rebuilt automatically when the engine opens. ``fold_as_of``
folds in memory up to any position: incremental == rebuilt == folded, always.

A second shape, ``AggregateProjection``, is for cross-stream aggregates (analytics):
its own tables ``rm_<name>_<part>`` and a ``step(tx, tables, events)`` that
writes rows with SQL. It is kept exactly like the document projections (inline in the
append's transaction, catch-up, rebuild into fresh tables with an atomic swap, one
position row, rebuilt when its version changes).

Both shapes implement one protocol, ``ReadModel``: the engine never asks which shape
it holds. A read model names its tables (``table_names``, part -> physical name; a
document projection has one part), creates them, applies events to them (inline,
catch-up, and the tail of a rebuild), rebuilds into fresh ones from one pass over the log
(``rebuilder``), and reads itself back (rows for ``check``, documents by key, and the
same folded or built in scratch as of any position).
"""

from __future__ import annotations

import gc
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, Protocol, TypeVar

import msgspec
import sqlalchemy as sa

from ledger import EventPayload, Store, WriteTx
from ledger.timestamps import utc_now

from .documents import FOLDS, to_json
from .folding import StreamFold
from .read_ahead import read_ahead

Progress = Callable[[int, int], None]  # (done, total)
Query = Callable[[str], Sequence[Sequence[Any]]]

POSITIONS = "projection_checkpoints"  # the table keeps its first name: old ledgers open
_positions_meta = sa.MetaData()
positions = sa.Table(
    POSITIONS,
    _positions_meta,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.String(32), nullable=False),
)

T = TypeVar("T")

CATCH_UP_BATCH = 5_000  # events per catch-up transaction: bounds how long the lock is held

_encode = msgspec.json.encode
_decode = msgspec.json.decode
_EMPTY = b"{}"  # a stream with no document yet: its row holds the empty document


class Folded(Protocol):
    """What a read model reads of an event: a ``RecordedEvent`` (inline, as appended)
    or a ``ledger.store.BareEvent`` (catch-up and rebuild, read lean)."""

    @property
    def position(self) -> int: ...
    @property
    def stream(self) -> str: ...
    @property
    def stream_version(self) -> int: ...
    @property
    def payload(self) -> EventPayload: ...


class Batch:
    """Events in position order, handed to every read model at once: each document
    projection folds only the streams of its kind, grouped here once for all of them
    (not filtered by every projection over every event)."""

    __slots__ = ("_kinds", "events")

    def __init__(self, events: Sequence[Folded]) -> None:
        self.events = events
        self._kinds: dict[str, list[Folded]] | None = None

    def of_kind(self, kind: str) -> Sequence[Folded]:
        """The events of the streams ``"{kind}:..."``, in position order."""
        if self._kinds is None:
            kinds: dict[str, list[Folded]] = {}
            for event in self.events:
                stream = event.stream
                cut = stream.find(":")
                if cut >= 0:
                    found = kinds.get(stream[:cut])
                    if found is None:
                        kinds[stream[:cut]] = [event]
                    else:
                        found.append(event)
            self._kinds = kinds
        return self._kinds.get(kind, ())

    def after(self, position: int) -> Batch:
        """The events after ``position`` (a read model that is ahead of the others)."""
        if not self.events or self.events[0].position > position:
            return self
        return Batch([e for e in self.events if e.position > position])


class Rebuilder(Protocol):
    """Consumes the log once, batch by batch, into a read model's fresh tables. The
    engine gives each batch one write transaction shared by every rebuilder that
    ``writes`` per batch (None when none does), and the finish one shared by all."""

    @property
    def writes(self) -> bool: ...
    def feed(self, tx: WriteTx | None, batch: Batch) -> None: ...
    def finish(self, tx: WriteTx) -> None: ...


class ReadModel(Protocol):
    """What the engine needs of a projection, whatever its shape (module docstring)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def stream_prefix(self) -> str | None:
        """The only streams it reads (``"tool:"``), or None for any."""
        ...

    def table_names(self, suffix: str = "") -> dict[str, str]: ...
    def indexes(self, part: str) -> Sequence[Sequence[str]]: ...
    def create_tables(self, tx: WriteTx, names: Mapping[str, str], dialect: sa.Dialect) -> None: ...
    def apply(self, tx: WriteTx, names: Mapping[str, str], batch: Batch) -> None: ...
    def rebuilder(self, names: Mapping[str, str]) -> Rebuilder: ...
    def rows(self, query: Query, names: Mapping[str, str]) -> dict[str, Any]:
        """Every stored row, keyed, as ``check`` compares them."""
        ...

    def rows_as_of(self, store: Store, position: int) -> dict[str, Any]:
        """The rows a fresh build up to ``position`` holds (as ``rows`` gives them)."""
        ...

    def as_of(self, store: Store, position: int) -> dict[str, Any]:
        """The documents (an aggregate: its rows) by key as of ``position``."""
        ...

    def keyed(self, conn: sa.Connection, *where: Any) -> dict[str, Any]:
        """The current documents by key (filtered on extracted columns, if it has any)."""
        ...

    def document(self, conn: sa.Connection, key: str) -> tuple[Any, int] | None: ...


ROWS_PER_STATEMENT = 5_000  # PostgreSQL: rows sent in one statement (as arrays)


@cache
def _pg_dialect() -> sa.Dialect:
    """PostgreSQL's dialect, to spell array types: imported on a PostgreSQL ledger only
    (about 40 ms of start-up a SQLite ledger does not need)."""
    from sqlalchemy.dialects import postgresql

    return postgresql.dialect()


def insert_rows(
    tx: WriteTx,
    table: str,
    columns: Sequence[tuple[str, sa.types.TypeEngine[Any]]],
    rows: Sequence[Sequence[Any]],
    tail: str = "",
) -> None:
    """``INSERT INTO {table} ({columns}) VALUES (row), ... {tail}``.

    On PostgreSQL each column's values go as one array parameter (``INSERT ... SELECT
    * FROM unnest(%s::type[], ...)``): psycopg's ``executemany`` in the write
    transaction's pipeline sends one statement per row, a few Python-side steps each,
    and a multi-row ``VALUES`` text with thousands of placeholders is parsed anew each
    time (psycopg caches only short statements); this text is short, one per table,
    and its arrays are dumped in C. On SQLite ``executemany`` (its loop is in C). With
    ``ON CONFLICT ... DO UPDATE`` in ``tail`` the rows must have distinct keys (one
    statement may not update a row twice)."""
    if not rows:
        return
    names = ", ".join(name for name, _ in columns)
    if tx.backend != "postgresql":
        values = ", ".join([tx.ph] * len(columns))
        tx.executemany(f"INSERT INTO {table} ({names}) VALUES ({values}){tail}", rows)
        return
    arrays = ", ".join(f"%s::{type_.compile(dialect=_pg_dialect())}[]" for _, type_ in columns)
    sql = f"INSERT INTO {table} ({names}) SELECT * FROM unnest({arrays}){tail}"
    for i in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[i : i + ROWS_PER_STATEMENT]
        tx.execute(sql, [list(column) for column in zip(*chunk, strict=True)])


def _create(tx: WriteTx, table: sa.Table, dialect: sa.Dialect) -> None:
    tx.execute(str(sa.schema.CreateTable(table).compile(dialect=dialect)))


@dataclass(frozen=True)
class Column:
    """A column extracted from the document (the stream's state, or None) for queries."""

    name: str
    type: sa.types.TypeEngine[Any] | type[sa.types.TypeEngine[Any]]
    value: Callable[[Any], Any]
    index: bool = False


@dataclass(frozen=True)
class Projection:
    """One read model: documents folded from the streams of one kind, keyed by the
    stream's id. The fold defaults to the stream state fold of its kind
    (``documents.FOLDS``); a projection with its own view of the same streams (outcome
    classification) brings its own. A row holds the state's JSON form (``to_json``)."""

    name: str
    version: int
    kind: str  # the stream kind folded: "tool" folds the streams "tool:{name}"
    columns: tuple[Column, ...] = ()
    fold: StreamFold[Any] | None = None

    @cached_property
    def folder(self) -> StreamFold[Any]:
        return self.fold if self.fold is not None else FOLDS[self.kind]

    def step(self, doc: Any, payload: EventPayload) -> Any:
        return self.folder(doc, payload)

    @property
    def stream_prefix(self) -> str:
        return f"{self.kind}:"

    @property
    def table_name(self) -> str:
        return f"rm_{self.name}"

    def table_names(self, suffix: str = "") -> dict[str, str]:
        return {"": f"{self.table_name}{suffix}"}

    def indexes(self, part: str) -> list[tuple[str]]:
        return [(c.name,) for c in self.columns if c.index]

    def table(self, name: str | None = None) -> sa.Table:
        name = name or self.table_name
        return sa.Table(
            name,
            sa.MetaData(),
            sa.Column("key", sa.Text, nullable=False),
            sa.Column("stream_version", sa.BigInteger, nullable=False),
            sa.Column("position", sa.BigInteger, nullable=False),
            sa.Column("doc", sa.LargeBinary, nullable=False),
            *(sa.Column(c.name, c.type) for c in self.columns),
            sa.PrimaryKeyConstraint("key", name=f"pk_{name}"),
        )

    def decode(self, raw: bytes) -> Any:
        """A stored document as its state (None for the empty document)."""
        raw = bytes(raw)
        return None if raw == _EMPTY else _decode(raw, type=self.folder.state)

    def row(self, key: str, stream_version: int, position: int, doc: Any) -> tuple:
        return (
            key,
            stream_version,
            position,
            _encode(to_json(doc)),
            *(c.value(doc) for c in self.columns),
        )

    @cached_property
    def _row_columns(self) -> list[tuple[str, sa.types.TypeEngine[Any]]]:
        """The columns of ``row``'s values, in its order, with their types."""
        return [(c.name, c.type) for c in self.table().columns]

    def upsert(self, tx: WriteTx, table: str, docs: Mapping[str, tuple[int, int, Any]]) -> None:
        """Write the rows of ``docs`` (key -> stream version, position, state)."""
        columns = self._row_columns
        updates = ", ".join(f"{n} = excluded.{n}" for n, _ in columns[1:])
        insert_rows(
            tx,
            table,
            columns,
            [self.row(key, v, pos, doc) for key, (v, pos, doc) in docs.items()],
            f" ON CONFLICT (key) DO UPDATE SET {updates}",
        )

    def create_tables(self, tx: WriteTx, names: Mapping[str, str], dialect: sa.Dialect) -> None:
        _create(tx, self.table(names[""]), dialect)

    def apply(self, tx: WriteTx, names: Mapping[str, str], batch: Batch) -> None:
        """Fold events into the rows of the table: each touched document loaded once
        (a few statements per batch, not one per stream), each written once."""
        events = batch.of_kind(self.kind)
        if not events:
            return
        table, ph = names[""], tx.ph
        cut = len(self.kind) + 1
        touched = list(dict.fromkeys([e.stream[cut:] for e in events]))
        docs: dict[str, tuple[int, int, Any]] = {}
        for i in range(0, len(touched), 500):
            chunk = touched[i : i + 500]
            for key, raw in tx.query(
                f"SELECT key, doc FROM {table} WHERE key IN ({', '.join([ph] * len(chunk))})",
                chunk,
            ):
                docs[key] = (0, 0, self.decode(raw))
        self._fold(events, docs)
        self.upsert(tx, table, docs)

    def _fold(self, events: Iterable[Folded], docs: dict[str, tuple[int, int, Any]]) -> None:
        """Fold ``events`` (all of streams of this kind) into ``docs``: key -> (stream
        version, position, state)."""
        cut = len(self.kind) + 1
        step = self.folder
        get = docs.get
        for event in events:
            key = event.stream[cut:]
            previous = get(key)
            docs[key] = (
                event.stream_version,
                event.position,
                step(None if previous is None else previous[2], event.payload),
            )

    def rebuilder(self, names: Mapping[str, str]) -> Rebuilder:
        return _FoldInMemory(self, names[""])

    def _folded(self, store: Store, position: int) -> dict[str, tuple[int, int, Any]]:
        docs: dict[str, tuple[int, int, Any]] = {}
        for batch in store.read_bare(
            1, to_position=position, batch_size=CATCH_UP_BATCH, stream_prefix=self.stream_prefix
        ):
            self._fold(batch, docs)
        return docs

    def rows(self, query: Query, names: Mapping[str, str]) -> dict[str, Any]:
        columns = ", ".join(c.name for c in self.table().columns)
        return {
            key: (v, pos, self.decode(doc), *extracted)
            for key, v, pos, doc, *extracted in query(f"SELECT {columns} FROM {names['']}")
        }

    def rows_as_of(self, store: Store, position: int) -> dict[str, Any]:
        return {
            key: (v, pos, doc, *(c.value(doc) for c in self.columns))
            for key, (v, pos, doc) in self._folded(store, position).items()
        }

    def as_of(self, store: Store, position: int) -> dict[str, Any]:
        return {key: doc for key, (_v, _pos, doc) in self._folded(store, position).items()}

    def keyed(self, conn: sa.Connection, *where: Any) -> dict[str, Any]:
        t = self.table()
        query = sa.select(t.c.key, t.c.doc).order_by(t.c.key)
        for condition in where:
            query = query.where(condition(t))
        return {key: self.decode(doc) for key, doc in conn.execute(query)}

    def document(self, conn: sa.Connection, key: str) -> tuple[Any, int] | None:
        t = self.table()
        row = conn.execute(sa.select(t.c.doc, t.c.stream_version).where(t.c.key == key)).first()
        return (self.decode(row[0]), row[1]) if row else None


@dataclass
class _FoldInMemory:
    """A document projection's rebuild: fold in memory, write the rows at the end."""

    p: Projection
    table: str
    docs: dict[str, tuple[int, int, Any]] = field(default_factory=dict)
    writes = False  # the rows are written once, at the finish

    def feed(self, tx: WriteTx | None, batch: Batch) -> None:
        self.p._fold(batch.of_kind(self.p.kind), self.docs)

    def finish(self, tx: WriteTx) -> None:
        self.p.upsert(tx, self.table, self.docs)


@dataclass(frozen=True)
class Part:
    """One table of an aggregate projection: ``rm_<projection>_<name>``."""

    name: str
    columns: tuple[tuple[str, sa.types.TypeEngine[Any]], ...]
    primary_key: tuple[str, ...]
    indexes: tuple[tuple[str, ...], ...] = ()

    def table(self, physical: str) -> sa.Table:
        return sa.Table(
            physical,
            sa.MetaData(),
            *(
                sa.Column(name, type_, nullable=name not in self.primary_key)
                for name, type_ in self.columns
            ),
            sa.PrimaryKeyConstraint(*self.primary_key, name=f"pk_{physical}"),
        )


# (write transaction, part name -> physical table name, events in position order)
AggregateApply = Callable[[WriteTx, Mapping[str, str], Sequence[Folded]], None]


class _Discard(Exception):
    """Raised to roll back a scratch transaction (``as_of`` of an aggregate)."""


@dataclass(frozen=True)
class AggregateProjection:
    """A cross-stream projection: rows in its own tables, written by ``apply``.

    ``apply`` must be deterministic in the events it is given and the rows already in
    the tables it is given (never other tables, never the clock): that is what makes
    incremental == rebuilt. It receives the physical names, so the same step fills the
    live tables inline and fresh ones during a rebuild.
    """

    name: str
    version: int
    parts: tuple[Part, ...]
    step: AggregateApply

    stream_prefix = None  # every stream

    def table_names(self, suffix: str = "") -> dict[str, str]:
        return {part.name: f"rm_{self.name}_{part.name}{suffix}" for part in self.parts}

    def indexes(self, part: str) -> Sequence[Sequence[str]]:
        return next(p.indexes for p in self.parts if p.name == part)

    def create_tables(self, tx: WriteTx, names: Mapping[str, str], dialect: sa.Dialect) -> None:
        for part in self.parts:
            _create(tx, part.table(names[part.name]), dialect)

    def apply(self, tx: WriteTx, names: Mapping[str, str], batch: Batch) -> None:
        self.step(tx, names, batch.events)

    def rebuilder(self, names: Mapping[str, str]) -> Rebuilder:
        return _ApplyInBatches(self, names)

    def _fill(
        self, store: Store, tx: WriteTx, names: Mapping[str, str], start: int, end: int
    ) -> None:
        for batch in store.read_bare(start, to_position=end, batch_size=CATCH_UP_BATCH):
            self.step(tx, names, batch)

    def rows(self, query: Query, names: Mapping[str, str]) -> dict[str, Any]:
        """Every row as a document keyed ``part/primary key``."""
        rows: dict[str, Any] = {}
        for part in self.parts:
            columns = [name for name, _ in part.columns]
            for values in query(f"SELECT {', '.join(columns)} FROM {names[part.name]}"):
                row = dict(zip(columns, values, strict=True))
                key = "/".join(str(row[c]) for c in part.primary_key)
                rows[f"{part.name}/{key}"] = row
        return dict(sorted(rows.items()))

    def rows_as_of(self, store: Store, position: int) -> dict[str, Any]:
        """Apply the log up to ``position`` to scratch tables in a transaction that is
        rolled back: the same step as inline and rebuild, and nothing is kept."""
        names = self.table_names(f"__asof_{secrets.token_hex(4)}")
        rows: dict[str, Any] = {}
        try:
            with store.write() as tx:
                self.create_tables(tx, names, store.engine.dialect)
                self._fill(store, tx, names, 1, position)
                rows = self.rows(tx.query, names)
                raise _Discard
        except _Discard:
            pass
        return rows

    as_of = rows_as_of

    def keyed(self, conn: sa.Connection, *where: Any) -> dict[str, Any]:
        return self.rows(lambda sql: conn.exec_driver_sql(sql).all(), self.table_names())

    def document(self, conn: sa.Connection, key: str) -> tuple[Any, int] | None:
        raise TypeError(f"projection {self.name!r} is an aggregate: it has no documents by key")


@dataclass
class _ApplyInBatches:
    """An aggregate's rebuild: each batch applied in the engine's transaction of it."""

    p: AggregateProjection
    names: Mapping[str, str]
    writes = True

    def feed(self, tx: WriteTx | None, batch: Batch) -> None:
        assert tx is not None
        self.p.apply(tx, self.names, batch)

    def finish(self, tx: WriteTx) -> None:
        pass


AnyProjection = ReadModel


@dataclass(frozen=True)
class ReadModelCheck:
    """A read model compared with a fresh fold of the log up to its own position."""

    name: str
    position: int  # the last event the read model has applied
    status: str  # "ok" | "differs" | "stale" (built by another version) | "absent"
    differences: tuple[str, ...] = ()  # "key: what differs", the first few

    @property
    def ok(self) -> bool:
        return self.status != "differs"


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    version: int
    stored_version: int | None
    position: int  # the last event the read model has applied
    head: int

    @property
    def lag(self) -> int:
        return self.head - self.position


class ProjectionEngine:
    """Keeps a set of projections over one store current (see the module docstring)."""

    def __init__(self, store: Store, projections: Sequence[ReadModel]) -> None:
        self.store = store
        self.projections: dict[str, ReadModel] = {p.name: p for p in projections}
        ph = store.placeholder
        self._ph = ph

    # -- opening ----------------------------------------------------------------------

    def open(self, progress: Progress | None = None, *, catch_up: bool = True) -> ProjectionEngine:
        """Create missing read models, rebuild changed ones, catch up the rest (unless
        ``catch_up`` is False: someone else keeps them current)."""
        _positions_meta.create_all(self.store.engine)
        stored = self._stored_versions()
        for p in self.projections.values():
            tables = p.table_names().values()
            if stored.get(p.name) != p.version or not all(map(self._table_exists, tables)):
                self.rebuild([p.name], progress)
        if catch_up:
            self.catch_up(progress)
        return self

    def _stored_versions(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            return dict(conn.execute(sa.select(positions.c.name, positions.c.version)).all())

    def _table_exists(self, name: str) -> bool:
        with self.store.engine.connect() as conn:
            return sa.inspect(conn).has_table(name)

    # -- inline -----------------------------------------------------------------------

    def apply_inline(self, tx: WriteTx, events: Sequence[Folded]) -> None:
        """Advance every current projection by ``events`` inside the append's transaction."""
        if not events:
            return
        before, last = events[0].position - 1, events[-1].position
        ph = tx.ph
        current = {
            name
            for name, position in tx.query(f"SELECT name, position FROM {POSITIONS}")
            if position == before and name in self.projections
        }
        batch = Batch(events)
        for name in current:
            p = self.projections[name]
            p.apply(tx, p.table_names(), batch)
        # One statement advances all of them; a lagging projection keeps its position.
        tx.execute(
            f"UPDATE {POSITIONS} SET position = {ph}, updated_at = {ph} WHERE position = {ph}",
            (last, utc_now(), before),
        )

    # -- catch-up ---------------------------------------------------------------------

    def behind(self, tx: WriteTx) -> dict[str, int]:
        """The projections whose position is behind the head, with their positions."""
        head = tx.head_size()
        return {
            name: position
            for name, position in tx.query(f"SELECT name, position FROM {POSITIONS}")
            if name in self.projections and position < head
        }

    def catch_up_locked(self, tx: WriteTx, limit: int | None = None) -> bool:
        """Inside a write transaction (under the ledger lock): bring every lagging read
        model to the head when it lags by at most ``limit`` events (one catch-up
        window), so that an inline append can follow; False (nothing done) when one lags
        further or is empty — ``catch_up``'s, outside the lock. A writer that needs its
        read models current thus always makes progress, however often others append
        without them."""
        behind = self.behind(tx)
        if not behind:
            return True
        head = tx.head_size()
        first = min(behind.values()) + 1
        limit = CATCH_UP_BATCH if limit is None else limit
        if 0 in behind.values() or head - first + 1 > limit:
            return False
        batch = Batch(tx.read_range(first, head))
        for name, position in behind.items():
            p = self.projections[name]
            p.apply(tx, p.table_names(), batch.after(position))
            self._set_position(tx, name, p.version, head)
        return True

    def lagging(self) -> bool:
        """Whether a read model is behind the head, read without the ledger lock (a
        follower's cheap question before ``catch_up``, which takes it)."""
        head = self.store.head().size
        with self.store.read_transaction() as conn:
            rows = conn.exec_driver_sql(f"SELECT name, position FROM {POSITIONS}").all()
        return any(name in self.projections and position < head for name, position in rows)

    def catch_up(self, progress: Progress | None = None, *, chase: bool = True) -> int:
        """Apply whatever the projections' positions are behind the head by; returns events
        applied. ``progress(done, total)`` after each transaction (events of the range
        being caught up).

        The log up to the head is read one window ahead of the fold (``read_ahead``: rows
        at or below the head never change, so they are read outside the lock); each
        window is applied in a write transaction of its own, to each projection from its
        own position as that transaction finds it (another process may have moved it),
        until none is behind — or, with ``chase=False``, none is behind the head as the
        first pass found it (a follower that runs again soon need not chase appends that
        keep coming). A read model at position 0 holds nothing: it is built as a
        rebuild builds it (folded in memory into fresh tables, each row written once,
        indexed after), which costs less per event than updating live tables."""
        applied = 0
        target: int | None = None
        while True:
            with self.store.write() as tx:
                head = tx.head_size()
                behind = self.behind(tx)
            if target is None or chase:
                target = head
            if not any(position < target for position in behind.values()):
                return applied
            empty = [name for name, position in behind.items() if position == 0]
            if empty:
                self.rebuild(empty, progress)
                applied += head
            else:
                applied += self.apply_in_place(min(behind.values()) + 1, head, progress)

    def apply_in_place(self, first: int, head: int, progress: Progress | None = None) -> int:
        """One pass of ``catch_up`` over the live tables: events ``first`` to ``head``
        applied window by window to each read model from its own position (those
        further behind than ``first`` are left for the next pass); returns events read."""
        applied = 0
        with _no_gc():
            windows = self.store.read_bare(first, to_position=head, batch_size=CATCH_UP_BATCH)
            # One window is read in this thread: reading ahead pays only past it.
            ahead = head - first >= CATCH_UP_BATCH
            for events in self._ahead(windows) if ahead else windows:
                if not events:
                    continue
                start, end = events[0].position, events[-1].position
                batch = Batch(events)
                with self.store.write() as tx:
                    for name, position in self.behind(tx).items():
                        # One behind the window's start (or inside it) continues here.
                        if start - 1 <= position < end:
                            p = self.projections[name]
                            p.apply(tx, p.table_names(), batch.after(position))
                            self._set_position(tx, name, p.version, end)
                applied += len(events)
                if progress is not None:
                    progress(end - first + 1, head - first + 1)
        return applied

    def _ahead(self, windows: Iterator[list[T]]) -> Iterator[list[T]]:
        """``windows`` read one ahead of the fold, unless the store has one connection
        for reads and writes (in memory): then in turn."""
        return windows if self.store.one_connection else read_ahead(windows)

    def _set_position(self, tx: WriteTx, name: str, version: int, position: int) -> None:
        ph = tx.ph
        tx.execute(
            f"UPDATE {POSITIONS} SET version = {ph}, position = {ph}, updated_at = {ph} "
            f"WHERE name = {ph}",
            (version, position, utc_now(), name),
        )

    # -- rebuild ----------------------------------------------------------------------

    def rebuild(self, names: Iterable[str] | None = None, progress: Progress | None = None) -> None:
        """Fold the log into fresh tables (one pass for all of them) and swap them in
        atomically, all in one transaction; appends made meanwhile are applied to the
        fresh tables before the swap, under the lock."""
        chosen = [
            self.projections[n] for n in (names if names is not None else list(self.projections))
        ]
        store = self.store
        target = store.head().size
        # Private names: two processes rebuilding at once never share a table.
        fresh = {p.name: p.table_names(f"__rb_{secrets.token_hex(4)}") for p in chosen}
        prefixes = {p.stream_prefix for p in chosen}
        prefix = prefixes.pop() if len(prefixes) == 1 else None
        try:
            with store.write() as tx:
                for p in chosen:
                    p.create_tables(tx, fresh[p.name], store.engine.dialect)
            builders = [p.rebuilder(fresh[p.name]) for p in chosen]
            writing = any(builder.writes for builder in builders)
            with _no_gc():
                # One pass over the log for all of them; each batch's writes (an
                # aggregate's rows) in one bounded transaction.
                for events in self._ahead(
                    store.read_bare(
                        1, to_position=target, batch_size=CATCH_UP_BATCH, stream_prefix=prefix
                    )
                ):
                    batch = Batch(events)
                    if writing:
                        with store.write() as tx:
                            for builder in builders:
                                builder.feed(tx, batch)
                    else:
                        for builder in builders:
                            builder.feed(None, batch)
                    if progress is not None:
                        progress(events[-1].position, target)
                if progress is not None:
                    progress(target, target)
                with store.write() as tx:
                    for builder in builders:
                        builder.finish(tx)
                    self._swap(tx, chosen, fresh, target)
        except BaseException:
            with store.write() as tx:  # a swapped set was renamed: IF EXISTS skips it
                for table_names in fresh.values():
                    for table in table_names.values():
                        tx.execute(f"DROP TABLE IF EXISTS {table}")
            raise

    def _swap(
        self,
        tx: WriteTx,
        chosen: Sequence[ReadModel],
        fresh: Mapping[str, Mapping[str, str]],
        built_to: int,
    ) -> None:
        """Bring the fresh tables to the head and put them in place (in the caller's
        transaction, which holds the lock)."""
        head = tx.head_size()
        if head > built_to:
            for events in self.store.read_bare(
                built_to + 1, to_position=head, batch_size=CATCH_UP_BATCH
            ):
                batch = Batch(events)
                for p in chosen:
                    p.apply(tx, fresh[p.name], batch)
        for p in chosen:
            for part, table in p.table_names().items():
                _put_in_place(tx, fresh[p.name][part], table, p.indexes(part))
            _reset_position(tx, p, head)

    # -- checking ---------------------------------------------------------------------

    def check(self, name: str, max_differences: int = 10) -> ReadModelCheck:
        """Compare the stored read model with a fresh fold of the log up to the position
        it claims (its position): rows and position are read in one snapshot, so a
        concurrent append cannot make a sound model look wrong. A model built by another
        version of its projection is ``stale`` (the next open rebuilds it), not compared."""
        p = self.projections[name]
        if not self._table_exists(POSITIONS):
            return ReadModelCheck(name, 0, "absent")
        with self.store.snapshot() as snap:
            found = {
                n: (v, pos)
                for n, v, pos in snap.query(f"SELECT name, version, position FROM {POSITIONS}")
            }
            if name not in found:
                return ReadModelCheck(name, 0, "absent")
            version, position = found[name]
            if version != p.version:
                return ReadModelCheck(name, position, "stale")
            stored = p.rows(snap.query, p.table_names())
        fresh = p.rows_as_of(self.store, position)
        differences = []
        for key in sorted(stored.keys() | fresh.keys()):
            if key not in fresh:
                differences.append(f"{key}: in the read model, not in the log")
            elif key not in stored:
                differences.append(f"{key}: in the log, missing from the read model")
            elif stored[key] != fresh[key]:  # SQLite's 0/1 equals False/True here
                differences.append(
                    f"{key}: stored {_short(stored[key])}, rebuilt {_short(fresh[key])}"
                )
            if len(differences) == max_differences:
                break
        return ReadModelCheck(
            name, position, "differs" if differences else "ok", tuple(differences)
        )

    # -- reading ----------------------------------------------------------------------

    def status(self) -> list[ProjectionStatus]:
        head = self.store.head().size
        with self.store.engine.connect() as conn:
            rows = {
                name: (version, position)
                for name, version, position in conn.execute(
                    sa.select(positions.c.name, positions.c.version, positions.c.position)
                )
            }
        return [
            ProjectionStatus(
                p.name,
                p.version,
                rows.get(p.name, (None, 0))[0],
                rows.get(p.name, (None, 0))[1],
                head,
            )
            for p in self.projections.values()
        ]

    def document(self, name: str, key: str) -> tuple[Any, int] | None:
        """A stream's current state and stream version, or None if it has no row (an
        aggregate has no documents by key: TypeError)."""
        with self.store.engine.connect() as conn:
            return self.projections[name].document(conn, key)

    def documents(self, name: str, *where: Any) -> list[Any]:
        """Every current document of a projection, filtered on its extracted columns
        (an aggregate's rows, unfiltered, in the order of ``keyed_documents``)."""
        return list(self.keyed_documents(name, *where).values())

    def keyed_documents(self, name: str, *where: Any) -> dict[str, Any]:
        """Every current document of a projection, by key (the stream's id), filtered as
        ``documents`` filters; for an aggregate, every row keyed ``part/primary key``."""
        with self.store.engine.connect() as conn:
            return self.projections[name].keyed(conn, *where)

    def fold_as_of(self, name: str, position: int) -> dict[str, Any]:
        """The projection's documents as of ``position``, folded in memory (pure); an
        aggregate's rows as of ``position``, built in a rolled-back transaction."""
        return self.projections[name].as_of(self.store, position)


@contextmanager
def _no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a rebuild or a catch-up folds: it makes
    many small objects (states, rows) and no cycles, and each young-generation pass
    would walk them all again. Reference counting still frees what is dropped."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _put_in_place(tx: WriteTx, fresh: str, live: str, indexes: Iterable[Sequence[str]]) -> None:
    """Replace table ``live`` by ``fresh`` (in the caller's transaction), with its
    primary key renamed to match and its indexes made."""
    tx.execute(f"DROP TABLE IF EXISTS {live}")
    tx.execute(f"ALTER TABLE {fresh} RENAME TO {live}")
    if tx.backend == "postgresql":  # constraint names are schema-wide there
        tx.execute(f"ALTER TABLE {live} RENAME CONSTRAINT pk_{fresh} TO pk_{live}")
    for columns in indexes:
        tx.execute(f"CREATE INDEX ix_{live}_{'_'.join(columns)} ON {live} ({', '.join(columns)})")


def _reset_position(tx: WriteTx, p: ReadModel, position: int) -> None:
    """The projection's position row, rewritten for a table just put in place."""
    ph = tx.ph
    tx.execute(f"DELETE FROM {POSITIONS} WHERE name = {ph}", (p.name,))
    tx.execute(
        f"INSERT INTO {POSITIONS} (name, version, position, updated_at) "
        f"VALUES ({ph}, {ph}, {ph}, {ph})",
        (p.name, p.version, position, utc_now()),
    )


def _short(value: Any, limit: int = 160) -> str:
    text = _encode(value).decode("utf-8", "replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"
