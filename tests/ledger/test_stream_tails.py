"""A writer's stream tails (``ledger.tails``): what a long-lived writer — the service's
group committer — remembers of the streams' ends between its write transactions, so
that folding what it appended last costs no statement under the ledger lock.

The rule is that a read through the tails is exactly the read of the database it
replaces. The attacks on it: another writer appending to a stream the tails hold (the
agent holding the database file, a second service process), more of them than the
tails catch up, a transaction that appended and rolled back, a log whose head is not
what the tails counted. In each case the read must still equal a fresh read, and a
plane deciding from it must still refuse a plan its forged events break.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ledger
from commands.plane import Plane
from commands.plane.authority import TamperedPlan
from commands.plane.core import Job
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from ledger import RecordedEvent, StreamAppend, WriteTx
from ledger.tails import CATCH_UP_LIMIT, StreamTails, TailsView
from tests.helpers import forge, forged_halt, strategy


class Writer:
    """A writer as the plane writes: it remembers how far it has folded each stream,
    reads the rest under the lock, and appends expecting the version it folded."""

    def __init__(self, store: ledger.Store) -> None:
        self.store = store
        self.tails = StreamTails()
        self.folded: dict[str, list[RecordedEvent]] = {}

    def fold(self, tx: WriteTx, stream: str) -> list[RecordedEvent]:
        events = self.folded.setdefault(stream, [])
        events.extend(tx.read_stream(stream, len(events) + 1))
        return events

    def append(self, stream: str, n: int = 1, *, fail: bool = False) -> None:
        with self.store.write(tails=self.tails) as tx:
            version = len(self.fold(tx, stream))
            tx.append_batch([StreamAppend(stream, [strategy(text=stream)] * n, version)])
            if fail:
                raise RuntimeError("roll back")
        self.folded[stream] = []  # what it appended is read back on the next fold

    def read(self, stream: str, from_version: int = 1) -> list[RecordedEvent]:
        with self.store.write(tails=self.tails) as tx:
            return tx.read_stream(stream, from_version)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stream reads that went to the database (a spy on the real method)."""
    seen: list[str] = []
    real = WriteTx._locked_read

    def counted(self: WriteTx, sql: str, params: tuple) -> list:
        seen.append(params[0])
        return real(self, sql, params)

    monkeypatch.setattr(WriteTx, "_locked_read", counted)
    return seen


@pytest.fixture
def other(db_url: str) -> Iterator[ledger.Store]:
    """Another writer's store on the same database (its own connections)."""
    with ledger.open(db_url, create=False) as store:
        yield store


def _foreign(store: ledger.Store, stream: str, n: int = 1) -> None:
    store.append(stream, [strategy(text=f"foreign {stream}")] * n)


def test_a_writer_reads_what_it_appended_from_memory(store: ledger.Store, reads: list[str]) -> None:
    writer = Writer(store)
    writer.append("plan:A", 3)
    writer.append("plan:B")
    reads.clear()
    assert writer.read("plan:A", 2) == store.read_stream("plan:A", 2)
    assert writer.read("plan:A", 4) == []  # past its end: nothing, and no statement
    assert writer.read("plan:B") == store.read_stream("plan:B")
    assert writer.read("plan:none") == []  # a stream it read as absent stays known absent
    assert reads == ["plan:none"]
    assert writer.tails.size == store.head().size


def test_a_foreign_append_is_caught_up_in_the_locks_round_trip(
    store: ledger.Store, other: ledger.Store, reads: list[str]
) -> None:
    writer = Writer(store)
    writer.append("plan:A")
    _foreign(other, "plan:A", 2)
    _foreign(other, "plan:Z")  # a stream the writer never read: stays unknown
    reads.clear()
    assert writer.read("plan:A", 2) == store.read_stream("plan:A", 2)
    assert len(writer.read("plan:A", 2)) == 2
    assert reads == []
    assert writer.read("plan:Z") == store.read_stream("plan:Z")
    assert reads == ["plan:Z"]
    writer.append("plan:A")  # expects the version it caught up
    assert [e.stream_version for e in store.read_stream("plan:A")] == [1, 2, 3, 4]


def test_more_foreign_events_than_the_catch_up_takes_are_read_again(
    store: ledger.Store, other: ledger.Store, reads: list[str]
) -> None:
    writer = Writer(store)
    writer.append("plan:A")
    _foreign(other, "plan:A", CATCH_UP_LIMIT + 1)
    reads.clear()
    assert writer.read("plan:A", 2) == store.read_stream("plan:A", 2)
    assert reads == ["plan:A"]
    assert writer.tails.size == store.head().size


def test_a_transaction_that_rolled_back_leaves_nothing_remembered(
    store: ledger.Store, reads: list[str]
) -> None:
    writer = Writer(store)
    writer.append("plan:A")
    with pytest.raises(RuntimeError, match="roll back"):
        writer.append("plan:A", 2, fail=True)
    assert writer.tails.size is None
    reads.clear()
    assert writer.read("plan:A") == store.read_stream("plan:A")
    assert len(store.read_stream("plan:A")) == 1
    assert reads == ["plan:A"]


def test_one_transaction_at_a_time_holds_the_tails() -> None:
    tails = StreamTails()
    held = tails.claim()
    assert held is not None and tails.claim() is None
    tails.release(7)
    assert tails.size == 7 and tails.claim() is held


def _row(stream: str, version: int) -> tuple:
    return (0, "id", stream, version, "t", 1, "", "a", None, None, b"{}", b"[]", b"", b"")


def test_a_head_that_is_not_the_known_one_plus_what_was_read_forgets_every_stream() -> None:
    view = TailsView(10, OrderedDict(), max_streams=8, max_rows=4)
    view.learn_row(_row("s", 3))
    view.catch_up(12, [_row("s", 4)])  # one event read, the head moved by two
    assert not view.streams and view.size == 12  # knows nothing, as of the head it locked
    view = TailsView(10, OrderedDict(), max_streams=8, max_rows=4)
    view.learn_row(_row("s", 3))
    view.catch_up(9, [])  # the head went back (a restored database)
    assert not view.streams and view.size == 9


def test_a_gap_in_a_held_stream_drops_it() -> None:
    view = TailsView(10, OrderedDict(), max_streams=8, max_rows=4)
    view.learn_row(_row("s", 3))
    view.catch_up(11, [_row("s", 5)])
    assert view.rows_from("s", 4) is None and view.size == 11


def test_memory_is_bounded() -> None:
    view = TailsView(0, OrderedDict(), max_streams=2, max_rows=2)
    for version in range(1, 6):
        view.learn_row(_row("s", version))
    assert [r[3] for r in view.rows_from("s", 4) or ()] == [4, 5]
    assert view.rows_from("s", 3) is None  # no longer held: read from the database
    view.learn_row(_row("t", 1))
    view.learn_row(_row("u", 1))
    assert "s" not in view.streams  # the least recently used went


STREAMS = ("plan:A", "plan:B", "plan:C")
STEP = st.one_of(
    st.tuples(st.just("own"), st.sampled_from(STREAMS), st.integers(1, 3)),
    st.tuples(st.just("foreign"), st.sampled_from(STREAMS), st.integers(1, 40)),
    st.tuples(st.just("fail"), st.sampled_from(STREAMS), st.integers(1, 3)),
    st.tuples(st.just("read"), st.sampled_from(STREAMS), st.integers(1, 12)),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(steps=st.lists(STEP, min_size=1, max_size=12))
def test_a_read_through_the_tails_is_the_read_of_the_database(
    sqlite_url: str, steps: list[tuple[str, str, int]]
) -> None:
    """Whatever the interleaving of the writer's appends, its rolled-back ones and
    another writer's, every read the writer makes equals a fresh read."""
    with ledger.open(sqlite_url) as store, ledger.open(sqlite_url) as foreign:
        store.append("reset", [strategy(text="x")])  # streams differ per
        prefix = f"{store.head().size}/"  # example: the database is the test's own
        writer = Writer(store)
        for kind, stream, n in steps:
            stream = prefix + stream
            if kind == "own":
                writer.append(stream, n)
            elif kind == "foreign":
                _foreign(foreign, stream, n)
            elif kind == "fail":
                with pytest.raises(RuntimeError):
                    writer.append(stream, n, fail=True)
            else:
                assert writer.read(stream, n) == store.read_stream(stream, n)
            for name in STREAMS:
                assert writer.read(prefix + name) == store.read_stream(prefix + name)


# -- the plane deciding from its tails ----------------------------------------------------

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@pytest.mark.parametrize("batched", [False, True], ids=["run", "run_batch"])
def test_a_warm_plane_refuses_a_plan_the_agent_appended_to_since(
    db_url: str, batched: bool
) -> None:
    """The service's plane has just folded and appended to the plan (its tails hold
    it); the agent then appends a forged halt through its own store. The plane's next
    check must see it (caught up under the lock) and refuse the plan, not decide from
    what it remembered."""
    with Plane.open(db_url) as plane:
        register_tool(plane, {"name": "read", "command": ["true"], "input_schema": SCHEMA})
        create_plan(plane, "P-1", project="api", resources=["repo:api"])
        record_strategy(plane, "P-1", "read")
        enter_execute(plane, "P-1")
    with Plane.open(db_url, inline_read_models=not batched) as service:
        assert gate_input(service, "P-1", "read", b'{"path": "a"}').passed
        assert service._tails.size == service.store.head().size  # it holds the plan
        with ledger.open(db_url, create=False) as agent:
            forge(agent, "plan:P-1", forged_halt())
        if batched:
            [answer] = service.run_batch([Job("plan:P-1", lambda state: [])])
            assert isinstance(answer, TamperedPlan)
        else:
            with pytest.raises(TamperedPlan, match="breaks a rule"):
                gate_input(service, "P-1", "read", b'{"path": "a"}')
