"""A writer killed with SIGKILL mid-work must leave a whole, verifiable log behind.

Each round a fresh child process appends batches of 20-50 events, each batch to its own
new stream, in a loop; once the head has grown the parent kills it at a random moment.
The child logs ``begin``/``done`` around every append to a marker file, so the parent
knows which batches were acknowledged and which one (if any) was in flight. After each
kill: every batch is in the log whole or not at all, acknowledged batches are all there,
positions are dense, the log verifies and extends the previous round's tree head, and
the parent can append again.
"""

from __future__ import annotations

import multiprocessing
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

import ledger
from ledger.verify import TreeHeadRef, verify_store
from tests._worker_ledger import crash_worker
from tests.helpers import strategy

ROUNDS = 20
MAX_KILL_DELAY_S = 0.03  # how long after the first committed batch the kill may land
START_TIMEOUT_S = 60.0  # a hang guard only; nothing is asserted about time


def _batch_size(stream: str) -> int:
    """Streams are named ``crash:<round>:<batch>:<size>``."""
    return int(stream.rsplit(":", 1)[1])


def _read_markers(path: Path) -> tuple[list[str], set[str]]:
    """The streams the child began appending (in order) and those it saw committed."""
    begun: list[str] = []
    done: set[str] = set()
    for line in path.read_text().splitlines():
        word, _, stream = line.partition(" ")
        if word == "begin":
            begun.append(stream)
        elif word == "done":
            done.add(stream)
    return begun, done


def _wait_for_dead_writer(store: ledger.Store) -> None:
    """Take the write lock once, so a killed writer's transaction has fully ended.

    On PostgreSQL the server may still be finishing the dead client's transaction (a
    COMMIT already sent commits after the kill). It holds the head row lock until then,
    so locking that row waits it out. On SQLite the dying process's locks are gone and
    the WAL already says what was committed, so there is nothing to wait for.
    """
    if store.backend == "postgresql":
        with store.engine.begin() as conn:
            conn.exec_driver_sql("SELECT size FROM ledger_head WHERE id = 1 FOR UPDATE")


def _start_child_and_kill_it(
    db_url: str, store: ledger.Store, round_id: int, marker: Path, rng: random.Random
) -> None:
    ctx = multiprocessing.get_context("spawn")
    size_before = store.head().size
    child = ctx.Process(
        target=crash_worker,
        args=(db_url, round_id, str(marker), rng.randrange(2**32)),
        daemon=True,
    )
    child.start()
    try:
        # Wait for real work (at least one commit), then kill at a random moment.
        deadline = time.monotonic() + START_TIMEOUT_S
        while store.head().size == size_before:
            if not child.is_alive():
                pytest.fail(
                    f"round {round_id}: the writer died on its own (exit code {child.exitcode})"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"round {round_id}: the writer never committed a batch")
            time.sleep(0.002)
        time.sleep(rng.uniform(0, MAX_KILL_DELAY_S))
    finally:
        child.kill()
        child.join()
    assert child.exitcode == -signal.SIGKILL


@pytest.mark.slow
def test_sigkilled_writer_leaves_whole_batches_and_a_valid_log(db_url: str, tmp_path: Path) -> None:
    rng = random.Random(20_260_101)
    store = ledger.open(db_url)
    in_flight_rounds = in_flight_committed = 0
    try:
        previous = store.head()
        for round_id in range(ROUNDS):
            marker = tmp_path / f"round-{round_id}.log"
            _start_child_and_kill_it(db_url, store, round_id, marker, rng)
            _wait_for_dead_writer(store)

            begun, done = _read_markers(marker)
            in_flight = [s for s in begun if s not in done]
            # Appends run one after another: only the last one begun can be unfinished.
            assert in_flight in ([], begun[-1:]), f"round {round_id}: {in_flight}"
            in_flight_rounds += bool(in_flight)

            # Only the child wrote since the previous round's head.
            new_events = list(store.read_all(from_position=previous.size + 1))
            counts = Counter(e.stream for e in new_events)
            assert set(counts) <= set(begun), "events in a stream the child never began"
            for stream, count in counts.items():
                # Whole batch or nothing: a visible stream holds exactly its batch.
                assert count == _batch_size(stream), f"partial batch in {stream}"
                versions = [e.stream_version for e in new_events if e.stream == stream]
                assert versions == list(range(1, count + 1))
            # Every acknowledged append survived the kill.
            assert done <= set(counts), f"acknowledged batches lost: {done - set(counts)}"
            # An in-flight batch may be whole or absent: on PostgreSQL a COMMIT the child
            # sent before dying still commits, so this is often the whole batch there.
            in_flight_committed += sum(s in counts for s in in_flight)

            # Positions are dense and the head agrees with the rows.
            head = store.head()
            assert [e.position for e in new_events] == list(range(previous.size + 1, head.size + 1))
            report = verify_store(
                store, against=TreeHeadRef(size=previous.size, root=previous.root.hex())
            )
            assert report.ok, report.problems
            assert report.size == head.size

            # The ledger still takes writes: the dead writer left no lock or bad head.
            positions = store.append(
                f"after-crash:{round_id}",
                [strategy("parent", "after the kill", round_id)],
                ledger.NO_STREAM,
            )
            assert positions == [head.size + 1]
            previous = store.head()

        final = verify_store(store)
        assert final.ok, final.problems
        # The kills did land mid-append: the child spends nearly all its time inside
        # store.append, so over 20 rounds some kill found a batch begun but not done.
        assert in_flight_rounds > 0
        print(
            f"{in_flight_rounds}/{ROUNDS} kills landed during an append "
            f"({in_flight_committed} of those batches had committed)"
        )
    finally:
        store.close()
