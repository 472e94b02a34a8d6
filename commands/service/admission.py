"""Who starts a plane operation next: places in flight given out fairly among agents.

At most ``places`` operations run at once. A request that finds them all taken waits,
in its credential's own line, for at most ``wait_s``; when a place frees it goes to the
next credential in turn (round robin over the credentials that have someone waiting),
not to whoever asked first or asks most often: with 32 or 128 agents each gets its
turn. One credential holds at most its share (half the places, at least one) running or
waiting: past it, ``429``. The service is saturated when no place freed within the
wait, or when ``queue`` requests already wait: ``503``. Both answers carry
``Retry-After``, and nothing has started.

Everything here runs on the event loop's thread: no lock.
"""

from __future__ import annotations

from collections import deque

import anyio

__all__ = ["QUEUE", "WAIT_S", "Admission", "Overloaded"]

WAIT_S = 2.0  # the longest a request waits for a place (well inside a client's patience)
QUEUE = 1024  # requests waiting for a place, in all; 503 beyond


class Overloaded(Exception):
    """No place now: ``status`` 429 (the credential's share) or 503 (the service's)."""

    def __init__(self, status: int, what: str) -> None:
        super().__init__(what)
        self.status = status


class _Waiter:
    __slots__ = ("event", "handed")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.handed = False  # a freed place was given to it


class Admission:
    """The places in flight and the lines waiting for them (see the module)."""

    def __init__(self, places: int, *, wait_s: float = WAIT_S, queue: int = QUEUE) -> None:
        if places < 1:
            raise ValueError("places must be at least 1")
        self.places = places
        self.share = max(1, places // 2)
        self.wait_s = wait_s
        self.queue = queue
        self.active = 0  # operations running
        self.queued = 0  # requests waiting
        self.held: dict[str, int] = {}  # credential -> running and waiting
        self._lines: dict[str, deque[_Waiter]] = {}  # credential -> its waiters, in order
        self._turns: deque[str] = deque()  # credentials with a waiter, next first

    async def enter(self, who: str) -> None:
        """A place for credential ``who`` (``leave`` gives it back), or ``Overloaded``."""
        held = self.held.get(who, 0)
        if held >= self.share:
            raise Overloaded(
                429, f"{held} operations of this credential running or waiting (its share)"
            )
        if self.active < self.places:  # (nobody waits while a place is free)
            self.active += 1
            self.held[who] = held + 1
            return
        if self.queued >= self.queue:
            raise Overloaded(503, f"{self.queued} operations waiting (the service is saturated)")
        await self._wait(who)

    def leave(self, who: str) -> None:
        """``who``'s operation ended: its place goes to the next credential in turn."""
        left = self.held.pop(who) - 1
        if left:
            self.held[who] = left
        if not self._turns:
            self.active -= 1
            return
        nxt = self._turns.popleft()
        line = self._lines[nxt]
        waiter = line.popleft()
        self.queued -= 1
        if line:
            self._turns.append(nxt)  # its next request waits for its next turn
        else:
            del self._lines[nxt]
        waiter.handed = True  # the place passes on: ``active`` is unchanged
        waiter.event.set()

    async def _wait(self, who: str) -> None:
        waiter = _Waiter()
        line = self._lines.get(who)
        if line is None:
            line = self._lines[who] = deque()
            self._turns.append(who)
        line.append(waiter)
        self.queued += 1
        self.held[who] = self.held.get(who, 0) + 1
        try:
            with anyio.move_on_after(self.wait_s):
                await waiter.event.wait()
        except BaseException:  # the request went away (cancelled) while it waited
            if waiter.handed:
                self.leave(who)  # the place it was given passes on
            else:
                self._forget(who, waiter)
            raise
        if not waiter.handed:
            self._forget(who, waiter)
            raise Overloaded(
                503, f"no place freed within {self.wait_s:g} s (the service is saturated)"
            )

    def _forget(self, who: str, waiter: _Waiter) -> None:
        """A waiter that gave up: out of its line (and its credential out of the turns
        when that was its last)."""
        line = self._lines[who]
        line.remove(waiter)
        if not line:
            del self._lines[who]
            self._turns.remove(who)
        self.queued -= 1
        left = self.held.pop(who) - 1
        if left:
            self.held[who] = left
