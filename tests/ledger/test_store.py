"""The store's contract, on SQLite and PostgreSQL alike."""

from __future__ import annotations

import hashlib
import json
import threading

import msgspec
import pytest
import rfc8785
import sqlalchemy as sa

import ledger
from ledger import ANY, NO_STREAM, ConcurrencyError, DuplicateEventError, NewEvent
from ledger.events import Catalog, EventPayload, PlanCreated, StrategyRecorded
from ledger.verify import verify_store
from tests.helpers import plan_created, strategy


def _count(store: ledger.Store) -> int:
    return store.head().size


def test_append_and_read_back(store: ledger.Store) -> None:
    positions = store.append("plan:P-1", [plan_created(), strategy()], NO_STREAM)
    assert positions == [1, 2]
    events = store.read_stream("plan:P-1")
    assert [e.type for e in events] == ["plan.created", "plan.strategy_recorded"]
    assert [e.stream_version for e in events] == [1, 2]
    assert isinstance(events[0].payload, PlanCreated)
    assert events[0].payload.resources == ["repo:api"]
    assert events[1].payload == StrategyRecorded(
        plan_id="P-1", revision=0, strategy="fix the tests"
    )
    assert len(events[0].event_id) == 26
    assert events[0].recorded_at.endswith("Z")
    assert [e.position for e in store.read_all()] == [1, 2]


def test_expected_versions(store: ledger.Store) -> None:
    store.append("s", [strategy()], NO_STREAM)
    with pytest.raises(ConcurrencyError) as info:
        store.append("s", [strategy()], NO_STREAM)
    assert (info.value.stream, info.value.expected, info.value.actual) == ("s", "no_stream", 1)
    store.append("s", [strategy()], 1)
    with pytest.raises(ConcurrencyError, match="at version 2, but the append expected 1"):
        store.append("s", [strategy()], 1)
    store.append("s", [strategy()], ANY)
    assert store.stream_version("s") == 3
    assert _count(store) == 3


def test_a_failed_append_leaves_no_hole(store: ledger.Store) -> None:
    store.append("a", [strategy()])
    with pytest.raises(ConcurrencyError):
        store.append_batch(
            [
                ledger.StreamAppend("b", [strategy(), strategy()], NO_STREAM),
                ledger.StreamAppend("a", [strategy()], 5),  # wrong: nothing of the batch lands
            ]
        )
    assert store.stream_version("b") == 0
    assert store.append("c", [strategy()]) == [2]
    assert verify_store(store).ok


def test_duplicate_event_id_is_an_error_not_a_drop(store: ledger.Store) -> None:
    event = plan_created(event_id="01J0000000000000000000000A")
    store.append("plan:P-1", [event])
    with pytest.raises(DuplicateEventError) as info:
        store.append("plan:P-2", [strategy(), event])
    assert info.value.event_ids == ["01J0000000000000000000000A"]
    with pytest.raises(DuplicateEventError):  # twice within one batch
        store.append("plan:P-3", [plan_created(event_id="01J0000000000000000000000B")] * 2)
    assert _count(store) == 1
    assert store.append("plan:P-2", [strategy()]) == [2]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"event_id": "not-a-ulid"}, "event id"),
        ({"correlation_id": "lowercase0000000000000000x"}, "correlation id"),
        ({"actor": ""}, "actor"),
    ],
)
def test_invalid_events_are_refused(store: ledger.Store, kwargs: dict, message: str) -> None:
    with pytest.raises(ledger.InvalidEventError, match=message):
        store.append("s", [plan_created(**kwargs)])
    assert _count(store) == 0


def test_payload_without_a_json_form_is_refused(store: ledger.Store) -> None:
    bad = NewEvent(payload=strategy().payload, delta=[{"op": "add", "value": float("nan")}])
    with pytest.raises(ledger.InvalidEventError, match="no JSON representation"):
        store.append("s", [bad])
    assert _count(store) == 0


def test_reads_by_position_stream_type_and_as_of(store: ledger.Store) -> None:
    for i in range(1, 26):
        store.append(f"plan:P-{i % 3}", [strategy(f"P-{i % 3}", text=str(i))])
    assert [e.position for e in store.read_all(10, to_position=12)] == [10, 11, 12]
    batches = list(store.read_batches(batch_size=10))
    assert [len(b) for b in batches] == [10, 10, 5]
    assert [e.payload.strategy for e in store.read_stream("plan:P-1", 3)] == [
        str(i) for i in range(7, 26, 3)
    ]
    assert len(store.read_stream("plan:P-1", as_of=10)) == 4
    assert store.stream_version("plan:P-1", as_of=10) == 4
    store.append("plan:P-9", [plan_created("P-9")])
    assert [e.position for e in store.read_all(types=["plan.created"])] == [26]
    assert [e.position for e in store.read_all(stream="plan:P-9")] == [26]


def test_head_matches_a_third_party_recomputation(store: ledger.Store) -> None:
    # Only hashlib and the rfc8785 package: what an outside auditor would use.
    store.append("plan:P-1", [plan_created(), strategy(text='caf\u00e9 \U0001f600 "q"\n')])
    store.append(
        "x",
        [
            NewEvent(
                payload=strategy().payload,
                actor="agent/7",
                delta=[{"op": "add", "path": "/a", "value": 0.1}],
            )
        ],
    )
    level = []
    chain = bytes(32)
    for e in store.read_all():
        envelope = {
            "position": e.position,
            "event_id": e.event_id,
            "stream": e.stream,
            "stream_version": e.stream_version,
            "type": e.type,
            "schema_version": e.schema_version,
            "recorded_at": e.recorded_at,
            "actor": e.actor,
            "correlation_id": e.correlation_id,
            "causation_id": e.causation_id,
            "payload": msgspec.to_builtins(e.payload),
            "delta": e.delta,
        }
        leaf = hashlib.sha256(b"\x00" + rfc8785.dumps(envelope)).digest()
        chain = hashlib.sha256(chain + leaf).digest()
        assert (leaf, chain) == (e.leaf_hash, e.chain_hash)
        level.append(leaf)
    # Three leaves: root = H(1 || H(1 || l0 || l1) || l2)  (RFC 9162 2.1.1)
    node = lambda a, b: hashlib.sha256(b"\x01" + a + b).digest()  # noqa: E731
    assert store.head().root == node(node(level[0], level[1]), level[2])
    assert store.head().chain_hash == chain


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE events SET actor = 'mallory'",
        "DELETE FROM events",
        "UPDATE blobs SET size = 0",
        "DELETE FROM blobs",
        "DELETE FROM ledger_head",
    ],
)
def test_the_database_refuses_changes(store: ledger.Store, statement: str) -> None:
    store.append("s", [strategy()], blobs=[b"raw output"])
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
        conn.exec_driver_sql(statement)
    assert verify_store(store).ok
    assert _count(store) == 1


def test_blobs_are_content_addressed(store: ledger.Store) -> None:
    digest = store.put_blob(b"stdout of a test run")
    assert digest == hashlib.sha256(b"stdout of a test run").hexdigest()
    assert store.put_blob(b"stdout of a test run") == digest  # idempotent
    store.append("s", [strategy()], blobs=[b"stdout of a test run", b"other"])
    assert store.get_blob(digest) == b"stdout of a test run"
    assert store.get_blob("0" * 64) is None
    assert verify_store(store).checked_blobs == 2


def test_many_blobs_are_read_in_one_call(store: ledger.Store) -> None:
    """``get_blobs``: those stored, whatever the number asked (500 a statement)."""
    data = [f"output {i}".encode() for i in range(1200)]
    store.append("s", [strategy()], blobs=data)
    digests = [hashlib.sha256(d).hexdigest() for d in data]
    unknown = ["0" * 64, "f" * 64]
    found = store.get_blobs([*digests, *unknown, digests[0]])
    assert found == dict(zip(digests, data, strict=True))
    assert store.get_blobs([]) == {}


def test_reopen_and_init_are_idempotent(db_url: str) -> None:
    with ledger.open(db_url) as first:
        first.append("s", [strategy()])
        ledger_id = first.meta()["ledger_id"]
    with ledger.open(db_url) as again:
        assert again.meta()["ledger_id"] == ledger_id
        assert again.head().size == 1


def test_a_newer_schema_is_refused(db_url: str) -> None:
    with ledger.open(db_url) as s, s.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE ledger_meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(ledger.LedgerSchemaError, match="newer evidence-ledger"):
        ledger.open(db_url)


def test_open_without_create_needs_a_ledger(db_url: str) -> None:
    with pytest.raises(ledger.LedgerOpenError, match="evidence init"):
        ledger.open(db_url, create=False)


class _PlanCreatedV2(EventPayload, tag="plan.created", kw_only=True):
    """Version 2 of plan.created (test only): ``resources`` renamed ``targets``."""

    SCHEMA_VERSION = 2
    plan_id: str
    project: str
    targets: list[str]
    global_config: dict = {}


def test_old_versions_are_upcast_on_read(db_url: str) -> None:
    with ledger.open(db_url) as v1:
        v1.append("plan:P-1", [plan_created()])
    catalog = Catalog([_PlanCreatedV2])

    @catalog.upcaster("plan.created", 1)
    def _rename(doc: dict) -> dict:
        doc["targets"] = doc.pop("resources")
        return doc

    with ledger.open(db_url, catalog=catalog) as v2:
        (event,) = v2.read_all()
        assert event.schema_version == 1  # the stored bytes are unchanged
        assert event.payload == _PlanCreatedV2(
            plan_id="P-1",
            project="proj",
            targets=["repo:api"],
            global_config={
                "strict_mode": False,
                "retry_limit": 3,
                "max_strategy_revisions": 1,
                "max_iterations": 3,
                "require_validation": True,
            },
        )
        assert verify_store(v2).ok


def test_unknown_event_type_on_read(db_url: str) -> None:
    class Alien(EventPayload, tag="alien.landed", kw_only=True):
        where: str

    catalog = Catalog([*ledger.DEFAULT_CATALOG, Alien])
    with ledger.open(db_url, catalog=catalog) as writer:
        writer.append("x", [NewEvent(payload=Alien(where="roswell"))])
    with ledger.open(db_url) as reader:
        with pytest.raises(ledger.UnknownEventTypeError, match=r"alien\.landed"):
            list(reader.read_all())
        assert verify_store(reader).ok  # verification needs no decoding


def test_event_json_shape(store: ledger.Store) -> None:
    store.append("plan:P-1", [plan_created(correlation_id="01J0000000000000000000000C")])
    (event,) = store.read_all()
    document = json.loads(msgspec.json.encode(event.to_json()))
    assert set(document) == {
        "position",
        "event_id",
        "stream",
        "stream_version",
        "type",
        "schema_version",
        "recorded_at",
        "actor",
        "correlation_id",
        "causation_id",
        "payload",
        "delta",
        "leaf_hash",
        "chain_hash",
    }
    assert document["payload"]["type"] == "plan.created"
    assert document["correlation_id"] == "01J0000000000000000000000C"
    assert len(document["leaf_hash"]) == 64


def test_threads_share_one_store(store: ledger.Store) -> None:
    # Each thread appends through its own writer connection; the log stays dense.
    import threading

    def work(n: int) -> None:
        for i in range(25):
            store.append(f"thread:{n}", [strategy(f"T-{n}", text=str(i))], i)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [e.position for e in store.read_all()] == list(range(1, 101))
    assert all(store.stream_version(f"thread:{n}") == 25 for n in range(4))
    assert verify_store(store).ok


def test_a_closed_store_releases_its_writers(db_url: str) -> None:
    s = ledger.open(db_url)
    s.append("s", [strategy()])
    s.close()
    with ledger.open(db_url) as again:  # nothing left holding a lock
        again.append("s", [strategy()], 1)
        assert again.head().size == 2


def test_the_connections_of_ended_threads_are_closed(store: ledger.Store) -> None:
    """Each thread reads and appends on a driver connection of its own; one whose thread
    has ended is closed when another thread makes its own, so a service whose worker
    threads come and go holds as many connections as it has threads, not as many as it
    ever had."""
    store.append("s", [strategy()])

    def work(n: int) -> None:
        store.read_stream("s")
        store.append(f"t:{n}", [strategy()])

    for n in range(20):  # one after the other: each thread ends before the next starts
        thread = threading.Thread(target=work, args=(n,))
        thread.start()
        thread.join()
    assert len(store._writers) <= 2  # the last worker's, and this thread's
    assert store.head().size == 21


def test_a_filtered_read_with_a_prefix_pages_past_pages_the_prefix_thins(store) -> None:
    # Pages of 2 strategy events, most of them in streams the prefix drops: a page the
    # prefix thins out is not the last page (the bug stopped reading after the first).
    for i in range(6):
        store.append(f"plan:other-{i}", [plan_created(f"other-{i}"), strategy(f"other-{i}")])
        store.append(f"plan:mine-{i}", [plan_created(f"mine-{i}"), strategy(f"mine-{i}")])
    found = [
        e.stream
        for e in store.read_all(
            types=["plan.strategy_recorded"], stream_prefix="plan:mine-", batch_size=2
        )
    ]
    assert found == [f"plan:mine-{i}" for i in range(6)]


def test_a_write_transaction_returns_the_events_as_they_read_back(store: ledger.Store) -> None:
    with store.write() as tx:
        made = tx.append_batch(
            [
                ledger.StreamAppend(
                    "plan:P-1",
                    [
                        plan_created(),
                        NewEvent(
                            payload=strategy().payload,
                            delta=[{"op": "add", "path": "/x", "value": 1.0}, (1, -0.0)],
                        ),
                    ],
                )
            ]
        )
    read = store.read_stream("plan:P-1")
    assert made == read
    # JSON's types, as read: 1.0 is stored as 1, a tuple as a list, -0.0 as 0.
    assert [type(v) for v in (read[1].delta[0]["value"], read[1].delta[1])] == [int, list]
    assert made[0].delta == [] and made[0].delta is not made[1].delta


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_opens_its_own_writer_connection(tmp_path) -> None:
    import os

    store = ledger.open(f"sqlite:///{tmp_path / 'fork.db'}")
    try:
        store.append("plan:P-1", [plan_created()])
        parent_writer = store._writer()
        pid = os.fork()
        if pid == 0:  # the child appends on a connection of its own
            code = 1
            try:
                if store._writer() is not parent_writer:
                    store.append("plan:P-2", [plan_created("P-2")])
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert store._writer() is parent_writer
        store.append("plan:P-3", [plan_created("P-3")])
        assert store.head().size == 3
        assert verify_store(store).ok
    finally:
        store.close()


def test_an_append_after_a_locked_read_takes_the_versions_it_read(store) -> None:  # type: ignore[no-untyped-def]
    """A stream read under the lock is not read again by the append (nothing can move it
    while the lock is held): the version checks hold the same, two appends in one
    transaction stay dense, and small blobs already stored are sent and dropped."""
    store.append("plan:P-1", [plan_created()], blobs=[b"kept"])
    with (
        pytest.raises(ConcurrencyError, match="at version 1, but the append expected 0"),
        store.write() as tx,
    ):
        assert [e.stream_version for e in tx.read_stream("plan:P-1")] == [1]
        tx.append_batch([ledger.StreamAppend("plan:P-1", [strategy()], 0)])
    with store.write() as tx:
        tx.read_stream("plan:P-1")
        tx.read_stream("plan:P-2")  # a stream with no events: version 0
        tx.append_batch([ledger.StreamAppend("plan:P-1", [strategy()], 1)], blobs=[b"kept"])
        tx.append_batch(
            [ledger.StreamAppend("plan:P-2", [plan_created("P-2")], NO_STREAM)], blobs=[b"kept"]
        )
        tx.append_batch([ledger.StreamAppend("plan:P-1", [strategy(revision=1)], 2)])
    assert [e.position for e in store.read_all()] == [1, 2, 3, 4]
    assert [e.stream_version for e in store.read_stream("plan:P-1")] == [1, 2, 3]
    assert store.get_blob(hashlib.sha256(b"kept").hexdigest()) == b"kept"
    assert verify_store(store).ok


def test_read_stream_types_reads_only_those_kinds_in_stream_order(store: ledger.Store) -> None:
    store.append("plan:P-1", [plan_created(), strategy(text="a"), strategy(text="b")])
    store.append("plan:P-2", [plan_created("P-2"), strategy("P-2")])
    found = store.read_stream_types("plan:P-1", ["plan.strategy_recorded"])
    assert [(e.stream, e.stream_version, e.payload.strategy) for e in found] == [
        ("plan:P-1", 2, "a"),
        ("plan:P-1", 3, "b"),
    ]
    both = store.read_stream_types("plan:P-1", ["plan.created", "plan.strategy_recorded"])
    assert [e.position for e in both] == [e.position for e in store.read_stream("plan:P-1")]
    assert store.read_stream_types("plan:P-3", ["plan.created"]) == []
