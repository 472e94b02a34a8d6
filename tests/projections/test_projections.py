"""The projection engine: inline, catch-up and rebuild agree; checkpoints move with
their rows; a changed version rebuilds; lagging projections are never skipped over."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

import ledger
from commands.plane import Plane
from commands.plane.plans import create_plan
from ledger.events import ExecuteEntered, StrategyRecorded
from projections import ALL_PROJECTIONS, ProjectionEngine
from projections.documents import fold_all
from projections.read_models import PLANS, TOOLS
from tests.helpers import plan_created


def _snapshot(engine: ProjectionEngine) -> dict[str, list[dict]]:
    return {name: engine.documents(name) for name in engine.projections}


def test_inline_updates_are_visible_at_once(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        status = {s.name: s for s in plane.projections.status()}
        assert all(s.position == 1 and s.lag == 0 for s in status.values())
        assert plane.projections.document("plans", "P-1")[1] == 1


def test_catch_up_and_rebuild_equal_inline(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        for i in range(5):
            create_plan(plane, f"P-{i}", project="api" if i % 2 else "web", resources=[f"repo:{i}"])
        # Events appended behind the read models' back: they lag until caught up.
        plane.store.append(
            "plan:P-0",
            [
                ledger.NewEvent(
                    payload=StrategyRecorded(plan_id="P-0", revision=0, strategy="first")
                )
            ],
            1,
        )
        lagging = {s.name: s.lag for s in plane.projections.status()}
        assert lagging == {
            "tools": 1,
            "skills": 1,
            "attachments": 1,
            "plans": 1,
            "outcomes": 1,
            "approvers": 1,
            "analytics": 1,
        }
        create_plan(plane, "P-9", project="api", resources=["repo:9"])  # catches up first
        incremental = _snapshot(plane.projections)
        assert incremental["plans"][0].strategy == "first"
        plane.projections.rebuild()
        assert _snapshot(plane.projections) == incremental
        head = plane.store.head().size
        assert plane.projections.fold_as_of("plans", head) == {
            d.plan_id: d for d in incremental["plans"]
        }


def test_a_lagging_projection_is_not_advanced_inline(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        plane.store.append("plan:P-1", [plan_created("P-1")])  # not applied
        events = None
        with plane.store.write() as tx:
            events = tx.append_batch([ledger.StreamAppend("plan:P-2", [plan_created("P-2")])])
            plane.projections.apply_inline(tx, events)
        # Inline would have skipped P-1: so nothing moved, and catch-up does both.
        assert {s.position for s in plane.projections.status()} == {0}
        assert plane.projections.document("plans", "P-2") is None
        plane.projections.catch_up()
        assert [d.plan_id for d in plane.projections.documents("plans")] == ["P-1", "P-2"]


def test_rows_and_checkpoint_roll_back_with_a_failed_append(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        with pytest.raises(ledger.ConcurrencyError), plane.store.write() as tx:
            events = tx.append_batch([ledger.StreamAppend("plan:P-2", [plan_created("P-2")])])
            plane.projections.apply_inline(tx, events)
            tx.append_batch([ledger.StreamAppend("plan:P-1", [plan_created("P-1")], 7)])
        assert plane.projections.document("plans", "P-2") is None
        assert {s.position for s in plane.projections.status()} == {1}
        assert plane.store.head().size == 1


def test_a_changed_version_is_rebuilt_on_open(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        plane.store.append(
            "plan:P-1", [ledger.NewEvent(payload=ExecuteEntered(plan_id="P-1", revision=0))], 1
        )
    bumped = [
        dataclasses.replace(p, version=p.version + (p.name == "plans")) for p in ALL_PROJECTIONS
    ]
    store = ledger.open(db_url)
    try:
        with store.engine.begin() as conn:  # vandalise the read model: a rebuild restores it
            conn.execute(sa.text("DELETE FROM rm_plans"))
        engine = ProjectionEngine(store, bumped).open()
        versions = {s.name: s.stored_version for s in engine.status()}
        assert versions["plans"] == PLANS.version + 1 and versions["tools"] == TOOLS.version
        (doc,) = engine.documents("plans")
        assert doc == fold_all("plan:P-1", [e.payload for e in store.read_stream("plan:P-1")])
        assert doc.phase == "execute"
    finally:
        store.close()


def test_rebuild_twice_keeps_indexes_and_names(db_url: str) -> None:
    with Plane.open(db_url) as plane:
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        plane.projections.rebuild()
        plane.projections.rebuild(["plans"])
        create_plan(plane, "P-2", project="api", resources=["repo:api"])
        assert len(plane.projections.documents("plans", lambda t: t.c.project == "api")) == 2
        names = set(sa.inspect(plane.store.engine).get_table_names())
        assert {"rm_tools", "rm_skills", "rm_attachments", "rm_plans"} <= names
        assert not [n for n in names if "__rb_" in n]
