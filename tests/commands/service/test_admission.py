"""The service's admission (``commands.service.admission``): places in flight given out
in turn among the credentials waiting, each credential within its share, a bounded wait,
and no place ever lost, whatever order requests come, finish or go away in."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked
from anyio.abc import TaskGroup
from anyio.lowlevel import checkpoint
from hypothesis import given, settings
from hypothesis import strategies as st

from commands.service.admission import Admission, Overloaded


class Requests:
    """Requests of named credentials against one ``Admission``: each enters, then holds
    its place until told to finish."""

    def __init__(self, admission: Admission, tg: TaskGroup) -> None:
        self.admission, self.tg = admission, tg
        self.started: list[str] = []  # who got a place, in order
        self.refused: list[tuple[str, int]] = []
        self.finish: dict[int, anyio.Event] = {}
        self.scopes: dict[int, anyio.CancelScope] = {}
        self.running: set[int] = set()
        self.waiting: set[int] = set()
        self._next = 0

    def send(self, who: str) -> int:
        n, self._next = self._next, self._next + 1
        self.finish[n] = anyio.Event()
        self.tg.start_soon(self._request, n, who)
        return n

    async def _request(self, n: int, who: str) -> None:
        with anyio.CancelScope() as scope:
            self.scopes[n] = scope
            self.waiting.add(n)
            try:
                await self.admission.enter(who)
            except Overloaded as exc:
                self.refused.append((who, exc.status))
                return
            finally:
                self.waiting.discard(n)
            self.started.append(who)
            self.running.add(n)
            try:
                await self.finish[n].wait()
            finally:
                self.running.discard(n)
                self.admission.leave(who)


async def _with_requests(admission: Admission, body: Callable[[Requests], Awaitable[None]]) -> None:
    async with anyio.create_task_group() as tg:
        requests = Requests(admission, tg)
        await body(requests)
        await wait_all_tasks_blocked()
        tg.cancel_scope.cancel()


def test_a_freed_place_goes_to_the_next_credential_in_turn_not_the_first_to_ask() -> None:
    """Six places held; G asks twice, then H once: the places freed go G, H, G."""

    async def body(r: Requests) -> None:
        holders = [r.send(f"c{i}") for i in range(6)]
        await wait_all_tasks_blocked()
        for who in ("G", "G", "H"):
            r.send(who)
            await wait_all_tasks_blocked()
        assert r.admission.queued == 3
        for n in holders[:3]:
            r.finish[n].set()
            await wait_all_tasks_blocked()
        assert r.started[6:] == ["G", "H", "G"]
        assert r.admission.queued == 0 and r.admission.active == 6

    anyio.run(_with_requests, Admission(6), body)


def test_past_its_share_a_credential_is_refused_429_waiting_included() -> None:
    async def body(r: Requests) -> None:
        for _ in range(2):
            r.send("A")  # its share of four places: two
        await wait_all_tasks_blocked()
        r.send("A")
        await wait_all_tasks_blocked()
        assert r.refused == [("A", 429)]
        for who in ("B", "B", "C", "C"):  # B runs twice; C waits twice
            r.send(who)
        await wait_all_tasks_blocked()
        r.send("C")  # running or waiting: its share is spent
        await wait_all_tasks_blocked()
        assert r.refused == [("A", 429), ("C", 429)]

    anyio.run(_with_requests, Admission(4), body)


def test_no_place_within_the_wait_is_503_and_the_waiter_is_forgotten() -> None:
    async def body(r: Requests) -> None:
        r.send("A")
        await wait_all_tasks_blocked()
        r.send("B")
        with anyio.fail_after(5):
            while not r.refused:
                await anyio.sleep(0.01)
        assert r.refused == [("B", 503)]
        assert (r.admission.queued, r.admission.active, r.admission.held) == (0, 1, {"A": 1})

    anyio.run(_with_requests, Admission(1, wait_s=0.05), body)


def test_a_full_queue_is_503_at_once() -> None:
    async def body(r: Requests) -> None:
        for who in ("A", "B", "C"):
            r.send(who)
        await wait_all_tasks_blocked()
        assert r.refused == [("C", 503)] and r.admission.queued == 1

    anyio.run(_with_requests, Admission(1, queue=1), body)


def test_a_request_that_goes_away_gives_its_place_or_its_turn_up() -> None:
    """Cancelled while it waits: out of the line. Cancelled once a place was handed to
    it, before it ran: the place passes on, nothing is lost."""

    async def body(r: Requests) -> None:
        holder = r.send("A")
        await wait_all_tasks_blocked()
        gone = r.send("B")
        handed = r.send("C")
        last = r.send("D")
        await wait_all_tasks_blocked()
        r.scopes[gone].cancel()
        await wait_all_tasks_blocked()
        assert r.admission.queued == 2 and "B" not in r.admission.held
        r.finish[holder].set()  # the place goes to C ...
        r.scopes[handed].cancel()  # ... which is gone before it runs
        await wait_all_tasks_blocked()
        assert r.started == ["A", "D"] and last in r.running
        assert (r.admission.active, r.admission.queued) == (1, 0)

    anyio.run(_with_requests, Admission(1), body)


# -- no place lost, whatever happens ----------------------------------------------------------

steps = st.lists(
    st.tuples(st.sampled_from(["send", "finish", "cancel"]), st.integers(0, 5)),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 4), steps)
def test_the_places_and_the_lines_always_add_up(places: int, script: list[Any]) -> None:
    admission = Admission(places, queue=6)

    def sound(r: Requests) -> None:
        a = admission
        assert a.active == len(r.running) <= a.places
        assert a.queued == len(r.waiting) == sum(len(line) for line in a._lines.values())
        assert sum(a.held.values()) == a.active + a.queued
        assert all(count > 0 for count in a.held.values())
        assert set(a._turns) == set(a._lines) and len(a._turns) == len(a._lines)
        if a.queued:
            assert a.active == a.places  # nobody waits beside a free place

    async def body(r: Requests) -> None:
        for action, k in script:
            if action == "send":
                r.send(f"c{k}")
            else:
                pool = sorted(r.running if action == "finish" else r.waiting)
                if pool:
                    n = pool[k % len(pool)]
                    (r.finish[n].set if action == "finish" else r.scopes[n].cancel)()
            await wait_all_tasks_blocked()
            await checkpoint()
            sound(r)

    anyio.run(_with_requests, admission, body)


def test_places_must_be_at_least_one() -> None:
    with pytest.raises(ValueError):
        Admission(0)
