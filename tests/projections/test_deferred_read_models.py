"""Read models kept beside the appends rather than in them: the service's planes append
without touching the read models (``Plane(..., inline_read_models=False)``) and its
follower thread catches them up. The rules: a deferred append leaves the read models
behind and never wrong; a writer that keeps them inline still makes progress however
often others append without them (the gap is applied under its lock); the follower brings
them to the head and stops promptly; and every read model equals a rebuild after all of it."""

from __future__ import annotations

import threading
import time

import pytest

import projections.engine as engine_module
from commands.plane import Plane
from commands.plane.gates import gate_input
from commands.plane.phases import enter_execute, record_strategy
from commands.plane.plans import create_plan
from commands.plane.registry import register_tool
from commands.service.follower import ReadModelFollower

SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


def _ledger(url: str) -> None:
    with Plane.open(url) as plane:
        register_tool(plane, {"name": "read", "command": ["true"], "input_schema": SCHEMA})
        for plan in ("P-1", "P-2"):
            create_plan(plane, plan, project="api", resources=[f"repo:{plan}"])
            record_strategy(plane, plan, "read")
            enter_execute(plane, plan)


def _positions(plane: Plane) -> set[int]:
    return {s.position for s in plane.projections.status()}


def _gate_checks(plane: Plane, plan_id: str) -> int:
    """The plan's gate checks as its read model holds them (not caught up first)."""
    found = plane.projections.document("plans", plan_id)
    assert found is not None
    return int(found[0].gate_checks)


def _all_sound(plane: Plane) -> bool:
    return all(
        plane.projections.check(name).status == "ok" for name in plane.projections.projections
    )


def test_a_deferred_append_leaves_the_read_models_behind_not_wrong(db_url: str) -> None:
    _ledger(db_url)
    with Plane.open(db_url, inline_read_models=False) as deferred:
        before = _positions(deferred)
        outcome = gate_input(deferred, "P-1", "read", b'{"path": "a"}')
        assert outcome.passed
        assert _positions(deferred) == before  # nothing written to them
        assert deferred.projections.lagging()
        assert _all_sound(deferred)  # behind is sound: each is right as of its position
        assert _gate_checks(deferred, "P-1") == 0


def test_an_inline_writer_applies_the_gap_under_its_lock(db_url: str) -> None:
    _ledger(db_url)
    with (
        Plane.open(db_url, inline_read_models=False) as deferred,
        Plane.open(db_url) as inline,
    ):
        for _ in range(3):
            gate_input(deferred, "P-1", "read", b'{"path": "a"}')
        gate_input(inline, "P-2", "read", b'{"path": "b"}')
        head = inline.store.head().size
        assert _positions(inline) == {head}
        assert _gate_checks(inline, "P-1") == 3
        assert _all_sound(inline)


def test_a_gap_past_the_limit_is_caught_up_outside_the_lock_first(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _ledger(db_url)
    monkeypatch.setattr(engine_module, "CATCH_UP_BATCH", 2)
    with (
        Plane.open(db_url, inline_read_models=False) as deferred,
        Plane.open(db_url) as inline,
    ):
        for _ in range(5):
            gate_input(deferred, "P-1", "read", b'{"path": "a"}')
        with inline.store.write() as tx:
            assert inline.projections.catch_up_locked(tx) is False  # 5 > 2: not here
        gate_input(inline, "P-2", "read", b'{"path": "b"}')
        assert _positions(inline) == {inline.store.head().size}
        assert _all_sound(inline)


def test_the_follower_catches_up_and_stops_promptly(db_url: str) -> None:
    _ledger(db_url)
    follower = ReadModelFollower(db_url, interval=0.01)
    follower.start()
    try:
        with Plane.open(db_url, inline_read_models=False) as deferred:
            for _ in range(4):
                gate_input(deferred, "P-1", "read", b'{"path": "a"}')
                follower.poke()
            deadline = time.monotonic() + 30  # a failure bound only
            while deferred.projections.lagging() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert not deferred.projections.lagging()
            assert _gate_checks(deferred, "P-1") == 4
    finally:
        follower.stop()
    # Told to stop while it waits out an hour's interval: it catches up once more and
    # ends (only the stop can end that wait before the generous bound below).
    slow = ReadModelFollower(db_url, interval=3600)
    waiting = _Waiting()
    slow._stopping = waiting
    slow.start()
    with Plane.open(db_url, inline_read_models=False) as deferred:
        gate_input(deferred, "P-2", "read", b'{"path": "b"}')
        slow.poke()
        assert waiting.entered.wait(30)  # inside the interval's wait
        stopper = threading.Thread(target=slow.stop)
        stopper.start()
        stopper.join(60)
        assert not stopper.is_alive() and not waiting.timed_out
        assert not deferred.projections.lagging()
        assert _all_sound(deferred)


class _Waiting(threading.Event):
    """The follower's stop flag, saying when the follower waits on it (and whether a
    wait ran out its interval rather than being woken)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.timed_out = False

    def wait(self, timeout: float | None = None) -> bool:
        self.entered.set()
        woken = super().wait(timeout)
        self.timed_out = self.timed_out or not woken
        return woken
