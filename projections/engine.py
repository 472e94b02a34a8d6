"""The projection engine: read models folded from the log, never state kept on the side.

A projection here is a name, a version, the stream kind it folds (its pure fold is the
stream document fold of ``projections.documents``), and one read-model table holding
each stream's folded document plus a few columns extracted for queries. Its checkpoint
(the last position it has applied) lives in ``projection_checkpoints`` and is written in
the same transaction as its rows.

Two ways of keeping up:

- **inline**: a command handler appends through ``Store.write()`` and calls
  ``apply_inline`` in that same transaction, so a query right after the command sees
  it. Only projections that were current (checkpoint == the position before the
  append) are advanced; a lagging one is left to catch up, never skipped over.
- **catch-up**: ``catch_up`` applies everything from a checkpoint to the head, under
  the ledger lock, in bounded transactions.

``rebuild`` folds the log into a fresh table and swaps it in atomically; a projection
whose version changed is rebuilt automatically when the engine opens. ``fold_as_of``
folds in memory up to any position: incremental == rebuilt == folded, always.

A second shape, ``AggregateProjection``, is for cross-stream aggregates (analytics):
its own tables ``rm_<name>_<part>`` and an ``apply(tx, tables, events)`` step that
writes rows with SQL. It is kept exactly like the document projections (inline in the
append's transaction, catch-up, rebuild into fresh tables with an atomic swap, one
checkpoint row, rebuilt when its version changes).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import sqlalchemy as sa

from ledger import EventPayload, RecordedEvent, Store
from ledger import WriteTx
from ledger.timestamps import utc_now

from .documents import Document
from .documents import fold as fold_stream

Progress = Callable[[int, int], None]  # (done, total)

CHECKPOINTS = "projection_checkpoints"
_checkpoint_meta = sa.MetaData()
checkpoints = sa.Table(
    CHECKPOINTS,
    _checkpoint_meta,
    sa.Column("name", sa.String(64), primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("updated_at", sa.String(32), nullable=False),
)

CATCH_UP_BATCH = 5_000  # events per catch-up transaction: bounds how long the lock is held

_encode = msgspec.json.encode
_decode = msgspec.json.decode


@dataclass(frozen=True)
class Column:
    """A column extracted from the document for queries."""

    name: str
    type: sa.types.TypeEngine[Any]
    value: Callable[[Document], Any]
    index: bool = False


@dataclass(frozen=True)
class Projection:
    """One read model: documents folded from the streams of one kind, keyed by the
    stream's id. The fold defaults to the stream document fold; a projection with its
    own view of the same streams (outcome classification) brings its own."""

    name: str
    version: int
    kind: str  # the stream kind folded: "tool" folds the streams "tool:{name}"
    columns: tuple[Column, ...] = ()
    fold: Callable[[str, Document, EventPayload], Document] = fold_stream

    def step(self, stream: str, doc: Document, payload: EventPayload) -> Document:
        return self.fold(stream, doc, payload)

    @property
    def table_name(self) -> str:
        return f"rm_{self.name}"

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

    def key_of(self, stream: str) -> str | None:
        kind, sep, key = stream.partition(":")
        return key if sep and kind == self.kind else None

    def row(self, key: str, stream_version: int, position: int, doc: Document) -> tuple:
        return (key, stream_version, position, _encode(doc),
                *(c.value(doc) for c in self.columns))


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
            *(sa.Column(name, type_, nullable=name not in self.primary_key)
              for name, type_ in self.columns),
            sa.PrimaryKeyConstraint(*self.primary_key, name=f"pk_{physical}"),
        )


# (write transaction, part name -> physical table name, events in position order)
AggregateApply = Callable[[WriteTx, Mapping[str, str], Sequence[RecordedEvent]], None]


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
    apply: AggregateApply

    def table_names(self, suffix: str = "") -> dict[str, str]:
        return {part.name: f"rm_{self.name}_{part.name}{suffix}" for part in self.parts}


AnyProjection = Projection | AggregateProjection


class _Discard(Exception):
    """Raised to roll back a scratch transaction (``fold_as_of`` of an aggregate)."""


@dataclass(frozen=True)
class ReadModelCheck:
    """A read model compared with a fresh fold of the log up to its own checkpoint."""

    name: str
    checkpoint: int
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
    checkpoint: int
    head: int

    @property
    def lag(self) -> int:
        return self.head - self.checkpoint


class ProjectionEngine:
    """Keeps a set of projections over one store current (see the module docstring)."""

    def __init__(self, store: Store, projections: Sequence[AnyProjection]) -> None:
        self.store = store
        self.projections: dict[str, AnyProjection] = {p.name: p for p in projections}
        ph = store.placeholder
        self._ph = ph
        self._upsert: dict[str, str] = {}
        for p in projections:
            if isinstance(p, Projection):
                self._upsert[p.table_name] = self._upsert_sql(p, p.table_name)

    # -- opening ----------------------------------------------------------------------

    def open(self, progress: Progress | None = None) -> ProjectionEngine:
        """Create missing read models, rebuild changed ones, catch up the rest."""
        _checkpoint_meta.create_all(self.store.engine)
        stored = self._stored_versions()
        for p in self.projections.values():
            tables = ([p.table_name] if isinstance(p, Projection)
                      else list(p.table_names().values()))
            if stored.get(p.name) != p.version or not all(map(self._table_exists, tables)):
                self.rebuild([p.name], progress)
        self.catch_up()
        return self

    def _stored_versions(self) -> dict[str, int]:
        with self.store.engine.connect() as conn:
            return dict(conn.execute(sa.select(checkpoints.c.name, checkpoints.c.version)).all())

    def _table_exists(self, name: str) -> bool:
        with self.store.engine.connect() as conn:
            return sa.inspect(conn).has_table(name)

    # -- inline -----------------------------------------------------------------------

    def apply_inline(self, tx: WriteTx, events: Sequence[RecordedEvent]) -> None:
        """Advance every current projection by ``events`` inside the append's transaction."""
        if not events:
            return
        before, last = events[0].position - 1, events[-1].position
        ph = tx.ph
        current = {
            name for name, position in tx.query(f"SELECT name, position FROM {CHECKPOINTS}")
            if position == before and name in self.projections
        }
        for name in current:
            self._apply_any(tx, self.projections[name], events)
        # One statement advances all of them; a lagging projection keeps its checkpoint.
        tx.execute(
            f"UPDATE {CHECKPOINTS} SET position = {ph}, updated_at = {ph} WHERE position = {ph}",
            (last, utc_now(), before),
        )

    def _apply_any(self, tx: WriteTx, p: AnyProjection, events: Sequence[RecordedEvent]) -> None:
        """Advance the live tables of either shape of projection by ``events``."""
        if isinstance(p, Projection):
            self._apply(tx, p, p.table_name, events)
        else:
            p.apply(tx, p.table_names(), events)

    def _apply(
        self, tx: WriteTx, p: Projection, table: str, events: Iterable[RecordedEvent]
    ) -> None:
        """Fold events into the rows of ``table``: load each touched document once."""
        ph = tx.ph
        docs: dict[str, tuple[int, int, Document]] = {}
        for event in events:
            key = p.key_of(event.stream)
            if key is None:
                continue
            if key in docs:
                doc = docs[key][2]
            else:
                found = tx.query(f"SELECT doc FROM {table} WHERE key = {ph}", (key,))
                doc = _decode(found[0][0]) if found else {}
            docs[key] = (event.stream_version, event.position,
                         p.step(event.stream, doc, event.payload))
        tx.executemany(self._upsert_sql(p, table) if table != p.table_name
                       else self._upsert[table],
                       [p.row(key, v, pos, doc) for key, (v, pos, doc) in docs.items()])

    def _upsert_sql(self, p: Projection, table: str) -> str:
        names = ["key", "stream_version", "position", "doc", *(c.name for c in p.columns)]
        updates = ", ".join(f"{n} = excluded.{n}" for n in names[1:])
        return (f"INSERT INTO {table} ({', '.join(names)}) "
                f"VALUES ({', '.join([self._ph] * len(names))}) "
                f"ON CONFLICT (key) DO UPDATE SET {updates}")

    # -- catch-up ---------------------------------------------------------------------

    def catch_up(self) -> int:
        """Apply whatever the checkpoints are behind the head by; returns events applied."""
        applied = 0
        while True:
            with self.store.write() as tx:
                head = tx.head_size()
                behind = {
                    name: position
                    for name, position in tx.query(f"SELECT name, position FROM {CHECKPOINTS}")
                    if name in self.projections and position < head
                }
                if not behind:
                    return applied
                start = min(behind.values()) + 1
                end = min(head, start + CATCH_UP_BATCH - 1)
                events = list(self.store.read_all(start, to_position=end))
                for name, position in behind.items():
                    p = self.projections[name]
                    self._apply_any(tx, p, [e for e in events if e.position > position])
                    self._set_checkpoint(tx, name, p.version, end)
                applied += len(events)

    def _set_checkpoint(self, tx: WriteTx, name: str, version: int, position: int) -> None:
        ph = tx.ph
        tx.execute(
            f"UPDATE {CHECKPOINTS} SET version = {ph}, position = {ph}, updated_at = {ph} "
            f"WHERE name = {ph}", (version, position, utc_now(), name),
        )

    # -- rebuild ----------------------------------------------------------------------

    def rebuild(self, names: Iterable[str] | None = None,
                progress: Progress | None = None) -> None:
        """Fold the log into fresh tables (one pass for all of them) and swap each in
        atomically; appends made meanwhile are applied to the fresh table before the
        swap, under the lock."""
        every = [self.projections[n] for n in (names if names is not None
                                                else list(self.projections))]
        aggregates = [p for p in every if isinstance(p, AggregateProjection)]
        chosen = [p for p in every if isinstance(p, Projection)]
        store = self.store
        target = store.head().size
        # Private names: two processes rebuilding at once never share a table.
        fresh_sets = {p.name: p.table_names(f"__rb_{secrets.token_hex(4)}")
                      for p in aggregates}
        try:
            if aggregates:
                with store.write() as tx:
                    for p in aggregates:
                        self._create_tables(tx, p, fresh_sets[p.name])
                events: Iterable[RecordedEvent] = self._applying(aggregates, fresh_sets, target)
            else:
                prefix = f"{chosen[0].kind}:" if len(chosen) == 1 else None
                events = store.read_all(to_position=target, stream_prefix=prefix)
            # One pass over the log: the aggregates are applied batch by batch as the
            # document folds consume the events.
            folded = fold_documents(chosen, events, progress=progress, total=target)
            for p in aggregates:
                self._swap_aggregate(p, fresh_sets[p.name], target)
        except BaseException:
            if aggregates:
                with store.write() as tx:  # a swapped set was renamed: IF EXISTS skips it
                    for table_names in fresh_sets.values():
                        for table in table_names.values():
                            tx.execute(f"DROP TABLE IF EXISTS {table}")
            raise
        for p in chosen:
            # A private name: two processes rebuilding at once never share a table.
            fresh = f"{p.table_name}__rb_{secrets.token_hex(4)}"
            ddl = str(sa.schema.CreateTable(p.table(fresh)).compile(dialect=store.engine.dialect))
            with store.write() as tx:
                tx.execute(ddl)
                tx.executemany(self._upsert_sql(p, fresh), [
                    p.row(key, v, pos, doc) for key, (v, pos, doc) in folded[p.name].items()])
            try:
                self._swap(p, fresh, target)
            except BaseException:
                with store.write() as tx:
                    tx.execute(f"DROP TABLE IF EXISTS {fresh}")
                raise

    def _swap(self, p: Projection, fresh: str, built_to: int) -> None:
        """Bring the fresh table to the head and put it in place, in one transaction."""
        with self.store.write() as tx:
            head = tx.head_size()
            if head > built_to:
                self._apply(tx, p, fresh, self.store.read_all(built_to + 1, to_position=head))
            _put_in_place(tx, fresh, p.table_name,
                          [(c.name,) for c in p.columns if c.index])
            _reset_checkpoint(tx, p, head)

    # -- aggregates -------------------------------------------------------------------

    def _create_tables(self, tx: WriteTx, p: AggregateProjection, names: Mapping[str, str]
                       ) -> None:
        dialect = self.store.engine.dialect
        for part in p.parts:
            tx.execute(str(sa.schema.CreateTable(part.table(names[part.name]))
                           .compile(dialect=dialect)))

    def _fill(self, tx: WriteTx, p: AggregateProjection, names: Mapping[str, str],
              start: int, end: int) -> None:
        """Apply the events ``start..end`` to the tables ``names``, batch by batch."""
        for batch in self.store.read_batches(start, to_position=end,
                                             batch_size=CATCH_UP_BATCH):
            p.apply(tx, names, batch)

    def _applying(self, chosen: Sequence[AggregateProjection],
                  fresh: Mapping[str, Mapping[str, str]], target: int
                  ) -> Iterator[RecordedEvent]:
        """The events ``1..target``, each batch applied to the aggregates' fresh tables
        (its own bounded transaction) before it is passed on."""
        for batch in self.store.read_batches(1, to_position=target,
                                             batch_size=CATCH_UP_BATCH):
            with self.store.write() as tx:
                for p in chosen:
                    p.apply(tx, fresh[p.name], batch)
            yield from batch

    def _swap_aggregate(self, p: AggregateProjection, fresh: Mapping[str, str],
                        built_to: int) -> None:
        """Bring the fresh tables to the head and put them in place, in one transaction."""
        live = p.table_names()
        with self.store.write() as tx:
            head = tx.head_size()
            if head > built_to:
                self._fill(tx, p, fresh, built_to + 1, head)
            for part in p.parts:
                _put_in_place(tx, fresh[part.name], live[part.name], part.indexes)
            _reset_checkpoint(tx, p, head)

    @staticmethod
    def _rows(query: Callable[[str], Sequence[Sequence[Any]]], p: AggregateProjection,
              names: Mapping[str, str]) -> dict[str, Document]:
        """Every row of an aggregate as a document keyed ``part/primary key``."""
        rows: dict[str, Document] = {}
        for part in p.parts:
            columns = [name for name, _ in part.columns]
            found = query(f"SELECT {', '.join(columns)} FROM {names[part.name]}")
            for values in found:
                row = dict(zip(columns, values, strict=True))
                key = "/".join(str(row[c]) for c in part.primary_key)
                rows[f"{part.name}/{key}"] = row
        return dict(sorted(rows.items()))

    def _aggregate_rows(self, p: AggregateProjection) -> dict[str, Document]:
        with self.store.engine.connect() as conn:
            return self._rows(lambda sql: conn.exec_driver_sql(sql).all(), p,
                              p.table_names())

    def _aggregate_as_of(self, p: AggregateProjection, position: int) -> dict[str, Document]:
        """Apply the log up to ``position`` to scratch tables in a transaction that is
        rolled back: the same step as inline and rebuild, and nothing is kept."""
        names = p.table_names(f"__asof_{secrets.token_hex(4)}")
        rows: dict[str, Document] = {}
        try:
            with self.store.write() as tx:
                self._create_tables(tx, p, names)
                self._fill(tx, p, names, 1, position)
                rows = self._rows(tx.query, p, names)
                raise _Discard
        except _Discard:
            pass
        return rows

    # -- checking ---------------------------------------------------------------------

    def check(self, name: str, max_differences: int = 10) -> ReadModelCheck:
        """Compare the stored read model with a fresh fold of the log up to the position
        it claims (its checkpoint): rows and checkpoint are read in one snapshot, so a
        concurrent append cannot make a sound model look wrong. A model built by another
        version of its projection is ``stale`` (the next open rebuilds it), not compared."""
        p = self.projections[name]
        if not self._table_exists(CHECKPOINTS):
            return ReadModelCheck(name, 0, "absent")
        with self.store.snapshot() as snap:
            found = {n: (v, pos) for n, v, pos in snap.query(
                f"SELECT name, version, position FROM {CHECKPOINTS}")}
            if name not in found:
                return ReadModelCheck(name, 0, "absent")
            version, checkpoint = found[name]
            if version != p.version:
                return ReadModelCheck(name, checkpoint, "stale")
            if isinstance(p, AggregateProjection):
                stored = self._rows(snap.query, p, p.table_names())
            else:
                columns = ", ".join(c.name for c in p.table().columns)
                stored = {key: (v, pos, _decode(doc), *extracted)
                          for key, v, pos, doc, *extracted
                          in snap.query(f"SELECT {columns} FROM {p.table_name}")}
        if isinstance(p, AggregateProjection):
            fresh = self._aggregate_as_of(p, checkpoint)
        else:
            folded = fold_documents([p], self.store.read_all(to_position=checkpoint,
                                                             stream_prefix=f"{p.kind}:"))
            fresh = {key: (v, pos, doc, *(c.value(doc) for c in p.columns))
                     for key, (v, pos, doc) in folded[name].items()}
        differences = []
        for key in sorted(stored.keys() | fresh.keys()):
            if key not in fresh:
                differences.append(f"{key}: in the read model, not in the log")
            elif key not in stored:
                differences.append(f"{key}: in the log, missing from the read model")
            elif stored[key] != fresh[key]:  # SQLite's 0/1 equals False/True here
                differences.append(f"{key}: stored {_short(stored[key])}, "
                                   f"rebuilt {_short(fresh[key])}")
            if len(differences) == max_differences:
                break
        return ReadModelCheck(name, checkpoint, "differs" if differences else "ok",
                              tuple(differences))

    # -- reading ----------------------------------------------------------------------

    def status(self) -> list[ProjectionStatus]:
        head = self.store.head().size
        with self.store.engine.connect() as conn:
            rows = {name: (version, position) for name, version, position in conn.execute(
                sa.select(checkpoints.c.name, checkpoints.c.version, checkpoints.c.position))}
        return [
            ProjectionStatus(p.name, p.version, rows.get(p.name, (None, 0))[0],
                             rows.get(p.name, (None, 0))[1], head)
            for p in self.projections.values()
        ]

    def _document_projection(self, name: str) -> Projection:
        p = self.projections[name]
        if not isinstance(p, Projection):
            raise TypeError(f"projection {name!r} is an aggregate: it has no documents by key")
        return p

    def document(self, name: str, key: str) -> tuple[Document, int] | None:
        """A stream's current document and stream version, or None if it has none."""
        p = self._document_projection(name)
        t = p.table()
        with self.store.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.c.doc, t.c.stream_version).where(t.c.key == key)
            ).first()
        return (_decode(row[0]), row[1]) if row else None

    def documents(self, name: str, *where: Any) -> list[Document]:
        """Every current document of a projection, filtered on its extracted columns
        (an aggregate's rows, unfiltered, in the order of ``keyed_documents``)."""
        p = self.projections[name]
        if isinstance(p, AggregateProjection):
            return list(self._aggregate_rows(p).values())
        t = p.table()
        query = sa.select(t.c.doc).order_by(t.c.key)
        for condition in where:
            query = query.where(condition(t))
        with self.store.engine.connect() as conn:
            return [_decode(doc) for (doc,) in conn.execute(query)]

    def keyed_documents(self, name: str, *where: Any) -> dict[str, Document]:
        """Every current document of a projection, by key (the stream's id), filtered as
        ``documents`` filters; for an aggregate, every row keyed ``part/primary key``."""
        p = self.projections[name]
        if isinstance(p, AggregateProjection):
            return self._aggregate_rows(p)
        t = p.table()
        query = sa.select(t.c.key, t.c.doc).order_by(t.c.key)
        for condition in where:
            query = query.where(condition(t))
        with self.store.engine.connect() as conn:
            return {key: _decode(doc) for key, doc in conn.execute(query)}

    def fold_as_of(self, name: str, position: int) -> dict[str, Document]:
        """The projection's documents as of ``position``, folded in memory (pure); an
        aggregate's rows as of ``position``, built in a rolled-back transaction."""
        p = self.projections[name]
        if isinstance(p, AggregateProjection):
            return self._aggregate_as_of(p, position)
        folded = fold_documents([p], self.store.read_all(to_position=position,
                                                         stream_prefix=f"{p.kind}:"))
        return {key: doc for key, (_v, _pos, doc) in folded[name].items()}


def _put_in_place(tx: WriteTx, fresh: str, live: str,
                  indexes: Iterable[Sequence[str]]) -> None:
    """Replace table ``live`` by ``fresh`` (in the caller's transaction), with its
    primary key renamed to match and its indexes made."""
    tx.execute(f"DROP TABLE IF EXISTS {live}")
    tx.execute(f"ALTER TABLE {fresh} RENAME TO {live}")
    if tx.backend == "postgresql":  # constraint names are schema-wide there
        tx.execute(f"ALTER TABLE {live} RENAME CONSTRAINT pk_{fresh} TO pk_{live}")
    for columns in indexes:
        tx.execute(f"CREATE INDEX ix_{live}_{'_'.join(columns)} "
                   f"ON {live} ({', '.join(columns)})")


def _reset_checkpoint(tx: WriteTx, p: AnyProjection, position: int) -> None:
    """The projection's checkpoint row, rewritten for a table just put in place."""
    ph = tx.ph
    tx.execute(f"DELETE FROM {CHECKPOINTS} WHERE name = {ph}", (p.name,))
    tx.execute(f"INSERT INTO {CHECKPOINTS} (name, version, position, updated_at) "
               f"VALUES ({ph}, {ph}, {ph}, {ph})", (p.name, p.version, position, utc_now()))


def _short(value: Any, limit: int = 160) -> str:
    text = _encode(value).decode("utf-8", "replace")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def fold_documents(
    chosen: Sequence[Projection],
    events: Iterable[RecordedEvent],
    *,
    progress: Progress | None = None,
    total: int = 0,
) -> dict[str, dict[str, tuple[int, int, Document]]]:
    """name -> key -> (stream version, position, document), folded from ``events``."""
    folded: dict[str, dict[str, tuple[int, int, Document]]] = {p.name: {} for p in chosen}
    by_kind: dict[str, list[Projection]] = {}
    for p in chosen:
        by_kind.setdefault(p.kind, []).append(p)
    for done, event in enumerate(events, start=1):
        kind, _, key = event.stream.partition(":")
        for p in by_kind.get(kind, ()):
            docs = folded[p.name]
            previous = docs.get(key)
            doc = p.step(event.stream, previous[2] if previous else {}, event.payload)
            docs[key] = (event.stream_version, event.position, doc)
        if progress is not None and done % 1000 == 0:
            progress(event.position, total)
    if progress is not None:
        progress(total, total)
    return folded


