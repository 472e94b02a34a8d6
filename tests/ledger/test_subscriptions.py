"""Catch-up subscriptions: position order, checkpoints moved only by acknowledgement, and
a consumer running alongside concurrent writers that sees exactly 1..N."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
import sqlalchemy as sa
from ulid import ULID

import ledger
import ledger.subscriptions as subscriptions_module
from ledger import tables
from ledger.subscriptions import SubscriptionError, consumer_position, consumers, subscribe
from tests.helpers import plan_created, strategy

WRITERS = 3
APPENDS_PER_WRITER = 150
TIMEOUT_S = 240.0


def _fill(store: ledger.Store, n: int) -> None:
    for i in range(n):
        store.append(f"plan:S{i}", [plan_created(f"S{i}")])


def test_reads_in_order_in_batches(store: ledger.Store) -> None:
    _fill(store, 7)
    sub = subscribe(store, batch_size=3)
    batches = list(sub.batches())
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [e.position for b in batches for e in b] == list(range(1, 8))
    assert [e.position for e in subscribe(store, from_position=5).events()] == [5, 6, 7]


def test_checkpoint_moves_only_on_ack(store: ledger.Store) -> None:
    _fill(store, 5)
    sub = subscribe(store, consumer="wh", batch_size=2)
    first = next(sub.batches())
    assert [e.position for e in first] == [1, 2]
    assert consumer_position(store, "wh") is None  # read but not acknowledged
    sub.ack(first[-1].position)
    assert consumer_position(store, "wh") == 2
    next(sub.batches())  # positions 3, 4 delivered, never acknowledged
    # At-least-once: a new subscription of the same consumer gets 3.. again.
    again = subscribe(store, consumer="wh")
    assert [e.position for e in again.events()] == [3, 4, 5]
    again.ack()
    assert consumer_position(store, "wh") == 5
    assert consumers(store)["wh"][0] == 5
    assert list(subscribe(store, consumer="wh").events()) == []


def test_ack_never_moves_backwards_nor_ahead(store: ledger.Store) -> None:
    _fill(store, 4)
    sub = subscribe(store, consumer="c")
    list(sub.events())
    with pytest.raises(SubscriptionError, match="only 4 was delivered"):
        sub.ack(5)
    sub.ack(4)
    other = subscribe(store, consumer="c", from_position=None)
    other.scanned = 4
    other.acked = 0
    other.ack(2)  # a stale instance of the same consumer
    assert consumer_position(store, "c") == 4


def test_type_filter_and_ack_covers_skipped_positions(store: ledger.Store) -> None:
    store.append("plan:T", [plan_created("T"), strategy("T"), strategy("T", revision=1)])
    store.append("plan:U", [plan_created("U")])
    sub = subscribe(store, consumer="f", types=["plan.created"])
    assert [e.position for e in sub.events()] == [1, 4]
    sub.ack()
    assert consumer_position(store, "f") == 4


def test_refusals(store: ledger.Store) -> None:
    with pytest.raises(SubscriptionError, match="not both"):
        subscribe(store, from_position=1, consumer="x")
    with pytest.raises(SubscriptionError, match="unknown event type"):
        subscribe(store, types=["no.such"])
    with pytest.raises(SubscriptionError, match="consumer name"):
        subscribe(store, consumer="")
    assert issubclass(SubscriptionError, ledger.LedgerError)


def test_existing_ledger_gets_the_checkpoint_table(db_url: str) -> None:
    store = ledger.open(db_url)
    _fill(store, 1)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE consumer_checkpoints")  # a ledger made before it
    store.close()
    store = ledger.open(db_url, create=False)
    try:
        assert sa.inspect(store.engine).has_table(tables.consumer_checkpoints.name)
        sub = subscribe(store, consumer="late")
        list(sub.events())
        sub.ack()
        assert consumer_position(store, "late") == 1
    finally:
        store.close()


def test_follow_waits_for_new_events_and_stop_ends_it(store: ledger.Store) -> None:
    _fill(store, 2)
    sub = subscribe(store, poll_interval=0.05)
    seen: list[int] = []

    def consume() -> None:
        for batch in sub.batches(follow=True):
            seen.extend(e.position for e in batch)

    thread = threading.Thread(target=consume)
    thread.start()
    deadline = time.monotonic() + 30
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    store.append("plan:late", [plan_created("late")])
    while len(seen) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    sub.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert seen == [1, 2, 3]


def _delivered(
    store: ledger.Store, monkeypatch: pytest.MonkeyPatch, *, poll_interval: float, wait: float
) -> bool:
    """Whether a following subscription sees one append within ``wait`` seconds, the
    append made once the follower is caught up and in its wait (an event tells when,
    not a sleep)."""
    waiting = threading.Event()
    original = subscriptions_module._Waiter.wait

    def wait_then(self: object, interval: float) -> None:
        waiting.set()
        original(self, interval)  # type: ignore[arg-type]

    monkeypatch.setattr(subscriptions_module._Waiter, "wait", wait_then)
    sub = subscribe(store, poll_interval=poll_interval)
    appended = store.head().size + 1  # where the append lands (no other writer)
    seen = threading.Event()

    def consume() -> None:
        for batch in sub.batches(follow=True):
            if batch[-1].position >= appended:
                seen.set()

    thread = threading.Thread(target=consume)
    thread.start()
    try:
        assert waiting.wait(30)  # the existing event read: caught up, now waiting
        assert not seen.is_set()
        store.append("plan:late", [plan_created("late")])
        return seen.wait(wait)
    finally:
        sub.stop()
        thread.join(10)
        assert not thread.is_alive()  # stop() is noticed while listening too
        monkeypatch.undo()


def test_postgresql_notify_wakes_a_follower_before_its_next_poll(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ledger.open(pg_url) as store:
        _fill(store, 1)
        # The next poll is an hour away: only the append trigger's NOTIFY can deliver it
        # (seen at all is the proof; no latency bound, which a loaded machine would break).
        assert _delivered(store, monkeypatch, poll_interval=3600, wait=60)


def test_without_notify_the_poll_still_delivers(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with ledger.open(pg_url) as store:
        _fill(store, 1)
        with store.engine.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER {tables.NOTIFY_TRIGGER} ON ledger_head")
            assert _notify_triggers(conn) == 0
        # (Not "nothing wakes a follower now": another ledger on the same server may
        # NOTIFY the channel at any moment, and any notification rightly wakes it.)
        assert _delivered(store, monkeypatch, poll_interval=0.2, wait=60)
    # a ledger made before the trigger gets it when it is opened
    with ledger.open(pg_url, create=False) as store, store.engine.connect() as conn:
        assert _notify_triggers(conn) == 1


def _notify_triggers(conn: sa.Connection) -> int:
    return int(
        conn.exec_driver_sql(
            "SELECT count(*) FROM pg_trigger WHERE tgname = %s "
            "AND tgrelid = 'ledger_head'::regclass",
            (tables.NOTIFY_TRIGGER,),
        ).scalar_one()
    )


def writer(url: str, worker: int, count: int, start: object) -> None:
    """Child process: ``count`` appends of 1-3 events each, as fast as it can."""
    store = ledger.open(url, create=False)
    try:
        start.wait(60)  # type: ignore[attr-defined]
        done = 0
        i = 0
        while done < count:
            n = min(1 + i % 3, count - done)
            events = [plan_created(f"w{worker}-{i}-{k}", event_id=str(ULID())) for k in range(n)]
            store.append_batch(
                [ledger.StreamAppend(f"plan:w{worker}-{i}-{k}", [e]) for k, e in enumerate(events)]
            )
            done += n
            i += 1
    finally:
        store.close()


@pytest.mark.slow
def test_consumer_alongside_concurrent_writers_sees_exactly_1_to_n(db_url: str) -> None:
    store = ledger.open(db_url)
    total = WRITERS * APPENDS_PER_WRITER
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [
        ctx.Process(target=writer, args=(db_url, w, APPENDS_PER_WRITER, start), daemon=True)
        for w in range(WRITERS)
    ]
    for p in procs:
        p.start()
    seen: list[int] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        start.set()
        # Two consumer sessions: the first stops half way, the second resumes from the
        # checkpoint the first acknowledged.
        for goal in (total // 2, total):
            sub = subscribe(store, consumer="tally", batch_size=50, poll_interval=0.01)
            for batch in sub.batches(follow=True):
                seen.extend(e.position for e in batch)
                sub.ack(batch[-1].position)
                if len(seen) >= goal or time.monotonic() > deadline:
                    break
    finally:
        for p in procs:
            p.join(TIMEOUT_S)
            if p.is_alive():
                p.kill()
    try:
        assert [p.exitcode for p in procs] == [0] * WRITERS
        assert seen == list(range(1, total + 1))  # no gap, no duplicate, in order
        assert store.head().size == total
        assert consumer_position(store, "tally") == total
    finally:
        store.close()
