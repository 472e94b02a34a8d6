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

Both shapes (``shapes``) implement one protocol, ``ReadModel``: the engine never asks
which shape it holds. A read model names its tables (``table_names``, part -> physical name; a
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
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa

from ledger import Store, WriteTx
from ledger.timestamps import utc_now

from .read_ahead import read_ahead
from .shapes import (
    CATCH_UP_BATCH,
    Batch,
    Folded,
    Projection,
    ReadModel,
    _encode,
)

Progress = Callable[[int, int], None]  # (done, total)

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


class LogFolds:
    """Every stream's state as a reader walking the log folds it (the stream state
    folds), and the states the document read models with folds of their own give the
    same streams: what a fresh fold of each would hold at the position the walk reached,
    without reading the log again (``ProjectionEngine.check``)."""

    def __init__(self, projections: Iterable[ReadModel]) -> None:
        self.position = 0
        self.streams: dict[str, tuple[int, int, Any]] = {}  # stream -> (version, pos, state)
        self.own: dict[str, tuple[str, Any, dict[str, Any]]] = {
            p.name: (p.stream_prefix, p.folder, {})
            for p in projections
            if isinstance(p, Projection) and p.fold is not None
        }

    def take(self, event: Folded, state: Any) -> None:
        """``event`` walked, its stream's state now ``state``."""
        stream = event.stream
        self.position = event.position
        self.streams[stream] = (event.stream_version, event.position, state)
        for prefix, folder, states in self.own.values():
            if stream.startswith(prefix):
                states[stream] = folder(states.get(stream), event.payload)

    def rows(self, p: ReadModel, position: int) -> dict[str, Any] | None:
        """``p``'s rows as of ``position`` (None: not a document read model, or the walk
        is elsewhere)."""
        if position != self.position or not isinstance(p, Projection):
            return None
        prefix, cut = p.stream_prefix, len(p.stream_prefix)
        if p.fold is None:
            found = self.streams
        elif p.name in self.own:
            found = {s: (*self.streams[s][:2], doc) for s, doc in self.own[p.name][2].items()}
        else:
            return None
        return p.rows_of((s[cut:], f) for s, f in found.items() if s.startswith(prefix))


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
        with no_gc():
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
            with no_gc():
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

    def check(
        self, name: str, max_differences: int = 10, *, walked: LogFolds | None = None
    ) -> ReadModelCheck:
        """Compare the stored read model with a fresh fold of the log up to the position
        it claims (its position): rows and position are read in one snapshot, so a
        concurrent append cannot make a sound model look wrong. A model built by another
        version of its projection is ``stale`` (the next open rebuilds it), not compared.

        ``walked``: the folds of a reader that just walked the log (the audit); a
        document read model at the position it reached is compared with them instead of
        reading the log again."""
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
        fresh = walked.rows(p, position) if walked is not None else None
        if fresh is None:
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
def no_gc() -> Iterator[None]:
    """The cyclic garbage collector off while a rebuild, a catch-up or an audit folds:
    it makes many small objects (states, rows) and no cycles, and each young-generation
    pass would walk them all again. Reference counting still frees what is dropped."""
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
