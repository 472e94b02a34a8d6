"""The two shapes of read models the engine (``engine``) keeps, behind one protocol,
``ReadModel``: what a read model names, creates, applies, rebuilds and reads back.

- ``Projection``: one document per stream of a kind (its pure fold is the stream
  document fold of ``projections.documents``), in one table with a few columns
  extracted for queries.
- ``AggregateProjection``: a cross-stream aggregate (analytics) in tables of its own,
  ``rm_<name>_<part>``, written with SQL by a ``step(tx, tables, events)``.

The engine never asks which shape it holds.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any, Protocol

import msgspec
import sqlalchemy as sa

from ledger import EventPayload, Store, WriteTx

from .documents import FOLDS, to_json
from .folding import StreamFold

Query = Callable[[str], Sequence[Sequence[Any]]]

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
        return self.rows_of(self._folded(store, position).items())

    def rows_of(self, docs: Iterable[tuple[str, tuple[int, int, Any]]]) -> dict[str, Any]:
        """The rows of folded documents: (key, (stream version, position, state)) each."""
        return {
            key: (v, pos, doc, *(c.value(doc) for c in self.columns)) for key, (v, pos, doc) in docs
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
