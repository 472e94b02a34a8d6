"""Group commit (``Plane.run_batch``, ``commands/service/committer.py``): the service
decides several plans' jobs in one transaction and commits once. The rules: each job is
decided against the log as the jobs before it in the batch left it (as if they ran one
after the other); a job its own rules refuse is refused alone and appends nothing; a
failure of the transaction fails every job and appends nothing — and leaves no trace of
the rolled-back events in what the plane remembers of a plan; nobody is answered before
the commit; the log stays dense and verifiable."""

from __future__ import annotations

import hashlib
import threading

import pytest

from commands.plane import CommandRefused, Plane
from commands.plane.core import Job, StreamState
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.service.committer import GroupCommitter
from ledger.events import EventPayload, GateChecked
from ledger.verify import verify_store
from projections.states import PlanState

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
PLANS = ("P-1", "P-2", "P-3")
CHECKED = b'{"path": "a"}'  # the bytes each check names (kept as a blob)


def _ledger(url: str) -> None:
    with Plane.open(url) as plane:
        register_tool(plane, {"name": "read", "command": ["true"], "input_schema": SCHEMA})
        for plan in PLANS:
            create_plan(plane, plan, project="api", resources=[f"repo:{plan}"])
            record_strategy(plane, plan, "read")
            enter_execute(plane, plan)
        create_plan(plane, "P-9", project="api", resources=["repo:P-9"])  # not in Execute


def _check(plan_id: str) -> Job:
    """A passing input-gate check of ``plan_id``, refused outside Execute."""

    def decide(state: StreamState) -> list[EventPayload]:
        doc = state.of(PlanState)
        assert doc is not None
        if doc.phase != "execute":
            raise CommandRefused(f"plan {plan_id} is in {doc.phase}")
        return [
            GateChecked(
                plan_id=plan_id,
                gate="input",
                verdict="pass",
                attempt=doc.attempt,
                iteration=doc.iteration,
                strict_mode=doc.global_config.strict_mode,
                checked_sha256=hashlib.sha256(CHECKED).hexdigest(),
                tool="read",
                deviations=[],
            )
        ]

    return Job(f"plan:{plan_id}", decide, actor="agent", blobs=[CHECKED])


def _checks(plane: Plane, plan_id: str) -> int:
    doc = plane.state(f"plan:{plan_id}").of(PlanState)
    assert doc is not None
    return doc.gate_checks


def test_a_batch_is_decided_in_order_and_committed_once(db_url: str) -> None:
    _ledger(db_url)
    with Plane.open(db_url, inline_read_models=False) as plane:
        head = plane.store.head().size
        answers = plane.run_batch([_check("P-1"), _check("P-2"), _check("P-1"), _check("P-9")])
        assert [len(a) for a in answers[:3] if isinstance(a, list)] == [1, 1, 1]
        assert isinstance(answers[3], CommandRefused)  # refused alone: the others stand
        # The second check of P-1 was decided on the log the first left: version after it.
        first, second = answers[0], answers[2]
        assert isinstance(first, list) and isinstance(second, list)
        assert second[0].stream_version == first[0].stream_version + 1
        assert [e.position for e in plane.store.read_all(head + 1)] == [
            head + 1,
            head + 2,
            head + 3,
        ]
        assert (_checks(plane, "P-1"), _checks(plane, "P-2")) == (2, 1)
        assert verify_store(plane.store).ok


def test_a_failed_batch_appends_nothing_and_leaves_no_trace(db_url: str) -> None:
    """The third job breaks the transaction after two were appended in it: nothing of
    the batch is committed, and the plane's memory of P-1 (a later job in the batch read
    the first's events) does not keep what was rolled back."""
    _ledger(db_url)
    with Plane.open(db_url, inline_read_models=False) as plane:
        head = plane.store.head().size

        def broken(_state: StreamState) -> list[EventPayload]:
            raise RuntimeError("the transaction breaks")

        with pytest.raises(RuntimeError, match="breaks"):
            plane.run_batch([_check("P-1"), _check("P-1"), Job("plan:P-2", broken)])
        assert plane.store.head().size == head
        assert _checks(plane, "P-1") == 0  # folded afresh: no phantom check
        gate_input(plane, "P-1", "read", b'{"path": "a"}')  # the plan is as it was
        assert _checks(plane, "P-1") == 1
        assert verify_store(plane.store).ok


def test_only_a_plane_that_leaves_the_read_models_batches(db_url: str) -> None:
    _ledger(db_url)
    with Plane.open(db_url) as plane, pytest.raises(TypeError, match="follower"):
        plane.run_batch([_check("P-1")])


def test_the_committer_answers_each_caller_after_the_commit(db_url: str) -> None:
    """Many threads submit at once: every check is appended exactly once, each caller
    gets its own events (or its own refusal), and the log is dense and verifies."""
    _ledger(db_url)
    committer = GroupCommitter(lambda: Plane.open(db_url, inline_read_models=False))
    committer.start()
    results: dict[tuple[str, int], object] = {}
    try:
        with Plane.open(db_url, inline_read_models=False) as reader:
            head = reader.store.head().size

            def agent(plan_id: str) -> None:
                for i in range(10):
                    try:
                        results[plan_id, i] = committer.submit(_check(plan_id))
                    except CommandRefused as exc:
                        results[plan_id, i] = exc

            threads = [threading.Thread(target=agent, args=(p,)) for p in (*PLANS, "P-9")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            appended = list(reader.store.read_all(head + 1))
            assert len(appended) == 30
            assert [e.position for e in appended] == list(range(head + 1, head + 31))
            for plan_id in PLANS:
                mine = [results[plan_id, i] for i in range(10)]
                assert all(isinstance(r, list) and r[0].stream == f"plan:{plan_id}" for r in mine)
                assert _checks(reader, plan_id) == 10
            assert all(isinstance(results["P-9", i], CommandRefused) for i in range(10))
            assert verify_store(reader.store).ok
    finally:
        committer.stop()
    with pytest.raises(RuntimeError, match="not running"):
        committer.submit(_check("P-1"))


def test_a_plane_with_a_committer_appends_through_it(db_url: str) -> None:
    _ledger(db_url)
    committer = GroupCommitter(lambda: Plane.open(db_url, inline_read_models=False))
    committer.start()
    try:
        with Plane.open(db_url, inline_read_models=False) as plane:
            plane.committer = committer
            assert gate_input(plane, "P-1", "read", b'{"path": "a"}').passed
            with pytest.raises(CommandRefused, match="only in Execute"):
                gate_input(plane, "P-9", "read", b'{"path": "a"}')
            assert _checks(plane, "P-1") == 1
    finally:
        committer.stop()
