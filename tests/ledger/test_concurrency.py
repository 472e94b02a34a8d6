"""Concurrent writers in separate processes: optimistic concurrency must lose nothing.

Four real processes (``spawn``: fresh interpreters, own connections) each make 500
successful appends with an explicit expected version, partly into two shared streams
that all of them hammer and partly into streams of their own. Afterwards the log must
hold exactly the acknowledged events, once each, densely numbered, with dense stream
versions, and every conflict must have surfaced as ``ConcurrencyError``.

The last test (strict xfail) pins a bug: ``verify_store`` on a ledger that is being
appended to reports problems, because it reads rows and head in two snapshots.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

import ledger
from ledger.store import Snapshot
from ledger.verify import verify_store
from tests._worker_ledger import AppendRecord, WorkerReport, concurrency_worker
from tests.helpers import plan_created

WORKERS = 4
APPENDS_PER_WORKER = 500
# Rounds in which all workers append to one stream with the version they all read
# before a barrier: at most one wins each round, so at least WORKERS - 1 conflicts each.
LOCKSTEP_ROUNDS = 10
RESULT_TIMEOUT_S = 300.0  # a hang guard only; nothing is asserted about time


def _run_workers(db_url: str) -> list[WorkerReport]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    processes = [
        ctx.Process(
            target=concurrency_worker,
            args=(db_url, w, APPENDS_PER_WORKER, LOCKSTEP_ROUNDS, barrier, results),
            daemon=True,
        )
        for w in range(WORKERS)
    ]
    for p in processes:
        p.start()
    reports: list[WorkerReport] = []
    try:
        # Drain the queue before join(): a child blocks on exit until its data is read.
        for _ in processes:
            reports.append(results.get(timeout=RESULT_TIMEOUT_S))
    except queue.Empty:
        pytest.fail(
            f"only {len(reports)} of {WORKERS} workers reported; exit codes: "
            f"{[p.exitcode for p in processes]}"
        )
    finally:
        for p in processes:
            p.join(timeout=RESULT_TIMEOUT_S)
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in processes] == [0] * WORKERS
    return sorted(reports, key=lambda r: r.worker)


@pytest.mark.slow
def test_concurrent_writers_lose_nothing_and_conflicts_are_concurrency_errors(
    db_url: str,
) -> None:
    # Create the schema once up front, so the workers only ever open an existing ledger.
    store = ledger.open(db_url)
    try:
        reports = _run_workers(db_url)

        # Every conflict surfaced as ConcurrencyError: no other exception, and each
        # error names the stream, the version we expected and a newer actual version.
        assert [r.errors for r in reports] == [[]] * WORKERS
        assert [r.malformed_conflicts for r in reports] == [[]] * WORKERS
        shared_conflicts = sum(r.shared_conflicts for r in reports)
        print(f"{shared_conflicts} conflicts on the shared streams")
        assert shared_conflicts >= LOCKSTEP_ROUNDS * (WORKERS - 1)
        # Nobody else writes a worker's own streams, so its reads are never stale there.
        assert [r.solo_conflicts for r in reports] == [0] * WORKERS

        acknowledged: list[AppendRecord] = [a for r in reports for a in r.appends]
        assert len(acknowledged) == WORKERS * APPENDS_PER_WORKER
        # Each worker's appends are sequential, so their positions follow commit order.
        for r in reports:
            positions = [a.position for a in r.appends]
            assert positions == sorted(positions), f"worker {r.worker}: positions not in order"

        events = list(store.read_all())

        # No lost event and no phantom: the log is exactly the acknowledged appends.
        assert len(events) == len(acknowledged)
        assert store.head().size == len(events)
        # No duplicate event id.
        ids = Counter(e.event_id for e in events)
        assert [i for i, n in ids.items() if n > 1] == []
        # Each acknowledged append is in the log where and as its writer was told.
        stored = {e.event_id: (e.stream, e.position, e.stream_version) for e in events}
        assert {a.event_id: (a.stream, a.position, a.version) for a in acknowledged} == stored

        # Positions are exactly 1..N.
        assert [e.position for e in events] == list(range(1, len(events) + 1))

        # Each stream's versions are dense 1..k, in log order.
        versions: dict[str, list[int]] = defaultdict(list)
        for e in events:
            versions[e.stream].append(e.stream_version)
        for stream, seen in versions.items():
            assert seen == list(range(1, len(seen) + 1)), f"{stream}: versions {seen[:20]}..."
            assert store.stream_version(stream) == len(seen)
        assert {"shared:0", "shared:1"} <= versions.keys()

        report = verify_store(store)
        assert report.ok, report.problems
        assert report.size == len(events)
    finally:
        store.close()


def test_verify_is_not_fooled_by_an_append_between_its_reads(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """verify reads head, rows and blobs in one snapshot: an append that commits while
    it runs is simply not part of what it checks."""
    store = ledger.open(db_url)
    writer = ledger.open(db_url)  # another writer, with its own connections
    try:
        store.append("plan:P-1", [plan_created("P-1")], ledger.NO_STREAM)
        rows = Snapshot.rows

        def rows_then_let_a_writer_commit(
            self: Snapshot, *args: Any, **kwargs: Any
        ) -> Iterator[Any]:
            # Deterministic version of a live ledger: a real append commits after verify
            # has read the head and the rows, before it reads the blobs.
            yield from rows(self, *args, **kwargs)
            writer.append("plan:P-2", [plan_created("P-2")], ledger.NO_STREAM)

        monkeypatch.setattr(Snapshot, "rows", rows_then_let_a_writer_commit)
        report = verify_store(store)
        assert report.ok, report.problems
        assert report.size == 1
        monkeypatch.undo()
        assert verify_store(store).size == 2
    finally:
        writer.close()
        store.close()
