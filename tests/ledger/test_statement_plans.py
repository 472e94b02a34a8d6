"""Every statement of an agent's hot path keeps its good plan on PostgreSQL, whatever the
table's statistics (issue 46: a young ledger's checks decayed when a generic plan chosen
on a tiny table was kept).

Measured, not assumed: a ledger of 30,000 events and 3,000 blobs that was never
analysed (autovacuum off for its tables, checked at the end), then the statements the
hot path sends to the server are recorded as psycopg sends them (gate checks, a call
with its output recorded, reads), each run more than psycopg's five times before it
prepares, and every one is explained with its own parameters: none may read the events
or the blobs table by a sequential scan. Every connection plans each run for its own
parameters (``plan_cache_mode = force_custom_plan``, pinned by test_driver_errors.py), so
these are the plans the hot path runs, however young the ledger was when it started.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

import ledger
from commands.plane import Plane
from commands.plane.gates import gate_input, gate_output
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.plane.runs import call_tool
from ledger import NewEvent
from ledger.appends import StreamAppend
from ledger.events import PlanCreated

pytestmark = pytest.mark.postgres

SEARCH = {
    "name": "search",
    "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}},
    "output_schema": {"type": "object", "properties": {"hits": {"type": "array"}}},
}
BIG_TABLES = ("events", "blobs")
EVENTS = 30_000  # and 3,000 blobs


def _history(store: ledger.Store) -> None:
    """Other plans' history: one event for each of many streams, with blobs."""
    for start in range(0, EVENTS, 500):
        created = (PlanCreated(plan_id=f"B-{i}", project="b", resources=["repo:b"])
                   for i in range(start, start + 500))  # fmt: skip
        blobs = [f"blob {i}".encode() * 10 for i in range(start // 10, start // 10 + 50)]
        with store.write() as tx:
            tx.append_batch(
                [StreamAppend(f"plan:{p.plan_id}", [NewEvent(payload=p)]) for p in created],
                blobs=blobs,
            )


@contextlib.contextmanager
def _recorded() -> Iterator[list[tuple[str, Any]]]:
    """Every statement psycopg sends while the block runs, with its parameters (the
    statements still run: this only writes them down)."""
    sent: list[tuple[str, Any]] = []
    original = psycopg.Cursor.execute

    def execute(self: psycopg.Cursor[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(self.connection)
        sent.append((text if isinstance(text, str) else text.decode(), params))
        return original(self, query, params, **kw)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = original  # type: ignore[method-assign]


def _connect(url: str) -> psycopg.Connection[Any]:
    """A connection of our own to the test schema (the URL's options set search_path)."""
    u = sa.engine.make_url(url)
    return psycopg.connect(
        host=u.host, port=u.port, user=u.username, password=u.password, dbname=u.database,
        options=str(u.query.get("options", "")), autocommit=True,
    )  # fmt: skip


def test_the_hot_paths_statements_read_by_index_on_an_unanalysed_ledger(pg_url: str) -> None:
    with ledger.open(pg_url) as store:
        store.head()  # the tables exist
    with _connect(pg_url) as admin:
        for table in BIG_TABLES:
            admin.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    with ledger.open(pg_url) as store:
        _history(store)
    with Plane.open(pg_url) as plane:
        register_tool(plane, SEARCH)
        create_plan(plane, "P", project="p", resources=["repo:p"],
                    config={"max_iterations": 100})  # fmt: skip
        record_strategy(plane, "P", "search")
        enter_execute(plane, "P")
        with _recorded() as sent:
            for i in range(7):  # past psycopg's prepare threshold (5)
                params = json.dumps({"query": f"q{i}"}).encode()
                gate_input(plane, "P", "search", params, step=f"s{i}")
                gate_output(plane, "P", f"s{i}", b'{"hits": []}')
                call_tool(plane, "P", "search", params, step=f"c{i}",
                          recorded_output=b'{"hits": [1]}')  # fmt: skip
                plane.store.read_stream("plan:P")
                plane.store.get_blob(plane.store.read_stream("plan:P")[-1].payload.checked_sha256)
    statements = {(q, json.dumps(p, default=str)): (q, p) for q, p in sent}
    explained = 0
    with _connect(pg_url) as conn:
        for query, params in statements.values():
            if not query.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE")):
                continue
            plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + query, params))
            explained += 1
            for table in BIG_TABLES:
                assert f"Seq Scan on {table}" not in plan, (query, plan)
        # The check sees a sequential scan where there is one (no index on the actor).
        control = conn.execute("EXPLAIN SELECT position FROM events WHERE actor = %s", ["x"])
        assert "Seq Scan on events" in "\n".join(row[0] for row in control)
        analysed = conn.execute(
            "SELECT relname, last_analyze, last_autoanalyze FROM pg_stat_user_tables "
            "WHERE relname = ANY(%s) AND schemaname = current_schema()",
            [list(BIG_TABLES)],
        ).fetchall()
    assert explained >= 5, statements  # the check sees the hot path's reads
    assert analysed and all(a is None and b is None for _t, a, b in analysed), analysed
