"""The lean paths of rebuild and catch-up: ``Store.read_bare`` reads what
``read_batches`` reads, batches grouped by stream kind, multi-row writes, and catch-up
leaving the very rows a rebuild builds (on both backends)."""

from __future__ import annotations

from typing import Any

import ledger
import projections.engine as engine_module
import projections.shapes as shapes_module
from commands.plane.core import Plane
from ledger.store import BareEvent
from projections import ALL_PROJECTIONS, ProjectionEngine
from projections.shapes import Batch
from tests.helpers import plan_created, strategy


def _fill(store: ledger.Store, plans: int) -> int:
    for i in range(plans):
        store.append(f"plan:P-{i}", [plan_created(f"P-{i}"), strategy(f"P-{i}")])
    store.append("nokind", [plan_created("P-x")])  # a stream with no kind: no read model's
    return store.head().size


def _bare(events: list[ledger.RecordedEvent]) -> list[BareEvent]:
    return [BareEvent(e.position, e.stream, e.stream_version, e.type, e.payload) for e in events]


def test_read_bare_reads_what_read_batches_reads(store: ledger.Store, monkeypatch) -> None:
    _fill(store, 4)
    for kwargs in ({}, {"stream_prefix": "plan:"}, {"to_position": 5}):
        full = list(store.read_batches(2, batch_size=3, **kwargs))  # type: ignore[arg-type]
        bare = list(store.read_bare(2, batch_size=3, **kwargs))  # type: ignore[arg-type]
        assert [len(b) for b in bare] == [len(b) for b in full]
        assert [e for b in bare for e in b] == _bare([e for b in full for e in b])
    # Without the direct decoders (an old version, an unknown type): row by row, the same.
    monkeypatch.setattr(store, "_decoders", {})
    assert [e for b in store.read_bare() for e in b] == _bare(list(store.read_all()))


def test_a_batch_groups_by_kind_in_position_order() -> None:
    events = [
        BareEvent(1, "plan:A", 1, "t", None),  # type: ignore[arg-type]
        BareEvent(2, "tool:x:y", 1, "t", None),  # type: ignore[arg-type]
        BareEvent(3, "nokind", 1, "t", None),  # type: ignore[arg-type]
        BareEvent(4, "plan:B", 1, "t", None),  # type: ignore[arg-type]
    ]
    batch = Batch(events)
    assert [e.position for e in batch.of_kind("plan")] == [1, 4]
    assert [e.position for e in batch.of_kind("tool")] == [2]
    assert list(batch.of_kind("nokind")) == [] and list(batch.of_kind("skill")) == []
    assert [e.position for e in batch.after(2).events] == [3, 4]
    assert batch.after(0) is batch


def _rows(engine: ProjectionEngine) -> dict[str, Any]:
    with engine.store.snapshot() as snap:
        return {p.name: p.rows(snap.query, p.table_names()) for p in ALL_PROJECTIONS}


def _started(db_url: str) -> None:
    """Read models that hold the log's first event (position 1), not nothing."""
    Plane.open(db_url).close()  # read models at position 0
    with ledger.open(db_url) as store:
        store.append("plan:P-first", [plan_created("P-first")])
        assert ProjectionEngine(store, ALL_PROJECTIONS).catch_up() == 1


def test_catch_up_in_small_batches_leaves_what_a_rebuild_builds(db_url: str, monkeypatch) -> None:
    _started(db_url)
    for module in (engine_module, shapes_module):  # several transactions
        monkeypatch.setattr(module, "CATCH_UP_BATCH", 4)
    monkeypatch.setattr(shapes_module, "ROWS_PER_STATEMENT", 3)  # several statements each
    with ledger.open(db_url) as store:
        n = _fill(store, 9)
        engine = ProjectionEngine(store, ALL_PROJECTIONS)
        rebuilt: list[object] = []
        monkeypatch.setattr(engine, "rebuild", lambda *a, **k: rebuilt.append(a))
        assert engine.catch_up() == n - 1
        assert rebuilt == []  # applied to the live tables, window by window
        monkeypatch.undo()
        caught_up = _rows(engine)
        assert len(caught_up["plans"]) == 10
        assert all(engine.check(p.name).status == "ok" for p in ALL_PROJECTIONS)
        engine.rebuild()
        assert _rows(engine) == caught_up
        assert {s.name: s.position for s in engine.status()} == dict.fromkeys(
            (p.name for p in ALL_PROJECTIONS), n
        )


def test_catch_up_takes_in_what_is_appended_while_it_reads_ahead(db_url: str, monkeypatch) -> None:
    """The log is read ahead of the fold, outside the lock, up to the head as the pass
    began; events another writer appends meanwhile are taken in by the next pass."""
    _started(db_url)
    monkeypatch.setattr(engine_module, "CATCH_UP_BATCH", 4)
    with ledger.open(db_url) as store, ledger.open(db_url) as other:
        n = _fill(store, 5)
        engine = ProjectionEngine(store, ALL_PROJECTIONS)
        read_bare = store.read_bare
        appended: list[int] = []

        def read_while_another_appends(*args: Any, **kwargs: Any) -> Any:
            for i, window in enumerate(read_bare(*args, **kwargs)):
                if i == 1 and not appended:  # in the reader's thread, between windows
                    appended.append(other.append("plan:P-late", [plan_created("P-late")])[0])
                yield window

        monkeypatch.setattr(store, "read_bare", read_while_another_appends)
        assert engine.catch_up() == n
        assert appended == [n + 1]
        assert all(engine.check(p.name).status == "ok" for p in ALL_PROJECTIONS)
        assert {s.name: s.position for s in engine.status()} == dict.fromkeys(
            (p.name for p in ALL_PROJECTIONS), n + 1
        )
        assert "P-late" in _rows(engine)["plans"]


def test_read_models_that_hold_nothing_are_caught_up_as_a_rebuild(db_url: str, monkeypatch) -> None:
    Plane.open(db_url).close()  # read models at position 0
    with ledger.open(db_url) as store:
        n = _fill(store, 6)
        engine = ProjectionEngine(store, ALL_PROJECTIONS)
        rebuilt: list[list[str]] = []
        rebuild = engine.rebuild
        monkeypatch.setattr(
            engine, "rebuild", lambda names, progress=None: rebuilt.append(names) or rebuild(names)
        )
        assert engine.catch_up() == n
        assert rebuilt == [[p.name for p in ALL_PROJECTIONS]]
        assert all(engine.check(p.name).status == "ok" for p in ALL_PROJECTIONS)
        assert len(_rows(engine)["plans"]) == 6


def test_an_aggregate_upsert_of_one_key_twice_keeps_the_last(store: ledger.Store) -> None:
    """As upserting the rows one by one would (PostgreSQL writes them in one statement,
    which may not update a row twice)."""
    from projections.analytics import ANALYTICS, _upsert

    columns = ("run_id", "attachment_id", "plan", "validation", "args", "args_digest")
    key = ("run_id", "attachment_id")
    names = ANALYTICS.table_names("__t")
    with store.write() as tx:
        ANALYTICS.create_tables(tx, names, store.engine.dialect)
        _upsert(tx, names, "runs", columns, key, [("r", "a", "P", "v", "1", "d1")])
        _upsert(
            tx,
            names,
            "runs",
            columns,
            key,
            [
                ("r", "a", "P", "v", "2", "d2"),
                ("r", "b", "P", "v", "3", "d3"),
                ("r", "a", "P", "v", "4", "d4"),
            ],
        )
        found = tx.query(f"SELECT attachment_id, args FROM {names['runs']} ORDER BY 1")
        assert found == [("a", "4"), ("b", "3")]
