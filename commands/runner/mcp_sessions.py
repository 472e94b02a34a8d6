"""Warm MCP servers: the service keeps a tool's MCP server open across a plan's calls,
instead of starting it for every call (docs/service.md, "Warm MCP servers").

A server is kept per **plan and launch** (``WarmKey``: the plan, the command line or URL,
the working directory, the output cap): two plans never share one. A call is made on it
only when the server's confinement is within the call's (``_within``): it may reach no
more than this call allows, else it is stopped and started again as this call says. It is
started on its plan's first call, confined exactly as a cold one, initialized once, and
each later call is ``tools/call`` on the open session (after the same ``tools/list``
drift check), within the call's own timeout.

It is stopped, and the next call starts a fresh one:

- when a call on it faults (a crash, a timeout, a broken protocol): restarted on failure;
- after a call on it that did not pass, and when its plan's sandbox is made anew (a new
  Execute): it keeps nothing of a rejected call, and a server that writes the sandbox
  never outlives a reset of it (``drop``, by the plane);
- when its plan ends (``drop``, by the plane);
- after ``idle_s`` seconds without a call (``EVIDENCE_MCP_IDLE``, default 300);
- when the service stops (``close``).

Each server lives in a task of one event loop on a thread of its own (an anyio blocking
portal), which holds its transport and session open; the service's worker threads hand
calls to that loop and wait for their answers. Pure execution, like ``mcp_client``:
nothing here reads or writes the ledger.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
from anyio.abc import TaskStatus
from anyio.from_thread import BlockingPortal, start_blocking_portal

from ledger.intake import env_seconds

from .confine import Confinement, launched
from .mcp_client import _Call, _tail, open_session, refuse_unoffered

__all__ = ["DEFAULT_IDLE_S", "IDLE_ENV", "WarmKey", "WarmSessions"]

IDLE_ENV = "EVIDENCE_MCP_IDLE"
DEFAULT_IDLE_S = 300.0
START_TIMEOUT_S = 60.0  # starting and initializing a server, whatever the call's timeout
STOP_TIMEOUT_S = 10.0  # waited for a server to end (the SDK's client kills it meanwhile)
# A call's fault after which its server is not trusted with the next call. An "error"
# (the server answered the call with a JSON-RPC error) or a "schema_drift" leaves it
# sound: it answered.
_RESTART = {"crash", "protocol", "timeout", "unavailable"}


@dataclass(frozen=True)
class WarmKey:
    """One kept server: whose (the plan) and how it was launched."""

    owner: str
    argv: tuple[str, ...]
    url: str | None
    cwd: Path | None
    cap: int | None
    # What its client offers (relays to an agent's client): a server told it may ask
    # for sampling is not the one a call that cannot relay gets.
    offers: frozenset[str] = frozenset()
    # Opened for an agent of the stateless revision (``server/discover``; its questions
    # come back as results): not the session a call of an earlier revision gets.
    modern: bool = False


@dataclass
class _Server:
    """An open server: its session, its transport's state, its stderr, its calls."""

    key: WarmKey
    confinement: Confinement | None
    session: Any = None
    bounded: Any = None
    stderr: IO[bytes] | None = None
    closing: anyio.Event | None = None
    calls: list[_Call] = field(default_factory=list)  # in flight, in the order begun
    last_used: float = field(default_factory=time.monotonic)
    held: Future[None] | None = None  # the holding task: done once the server is stopped
    # Its tools as it listed them, for the drift check; emptied when it says they changed.
    tools: dict[str, Any] = field(default_factory=dict)

    async def hold(self, timeout_s: float, *, task_status: TaskStatus[None]) -> None:
        """Start the server and keep it open until ``closing`` (this task owns its
        transport, as anyio requires of what it opened)."""
        key = self.key
        self.closing = anyio.Event()
        with (
            tempfile.TemporaryFile() as self.stderr,
            launched(list(key.argv), self.confinement, None) as (launch, env),
        ):
            opener = _Call("", {}, list(key.argv), key.url, key.cwd, env, timeout_s, self.stderr)
            opener.launch, opener.cap, opener.messages = launch, key.cap, self.heard
            opener.offers, opener.answers, opener.modern = key.offers, self.answer, key.modern
            async with opener._session() as session:
                with anyio.fail_after(timeout_s):
                    await open_session(session, key.modern)
                refuse_unoffered(session, self.refused, key.offers)
                self.session, self.bounded = session, opener.bounded
                task_status.started()
                await self.closing.wait()

    def refused(self, entry: dict[str, Any]) -> None:
        """A request the server sent although the client offers it not: the record of
        the calls in flight (a server's request names no call)."""
        for call in self.calls:
            call.exchange.append(entry)

    async def answer(self, kind: str, params: Any) -> Any:
        """A request the server sends while calls run: the latest call's to answer (the
        server's connection names no call), refused when none runs."""
        import mcp_types as types

        if not self.calls:
            return types.ErrorData(
                code=types.INVALID_REQUEST, message=f"{kind} is answered only during a call"
            )
        return await self.calls[-1].answer(kind, params)

    async def heard(self, message: Any) -> None:
        """A changed tool list is read again before the next call's drift check; a line
        that is no MCP message ends every call in flight; a log message is the latest
        call's (the server's connection names no call: ``_Call.on_message``)."""
        import mcp_types as types

        if isinstance(message, types.ToolListChangedNotification):
            self.tools.clear()
        if isinstance(message, types.LoggingMessageNotification):
            hearers = self.calls[-1:]
        else:
            hearers = list(self.calls)
        for call in hearers:
            await call.on_message(message)

    async def call(self, run: _Call) -> dict[str, Any]:
        self.calls.append(run)
        run.known = self.tools
        try:
            return await run.run_on(self.session, self.bounded)
        finally:
            self.calls.remove(run)
            self.last_used = time.monotonic()

    def close(self) -> None:
        if self.closing is not None:
            self.closing.set()


class WarmSessions:
    """The kept servers of one process (the service's), thread-safe."""

    def __init__(self, idle_s: float | None = None) -> None:
        # refused (LedgerError) when set to anything but 0 < seconds <= 3600
        self.idle_s = idle_s if idle_s is not None else env_seconds(IDLE_ENV, DEFAULT_IDLE_S)
        self._servers: dict[WarmKey, _Server] = {}
        self._lock = threading.Lock()
        self._portal: BlockingPortal | None = None
        self._portal_cm: Any = None
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None

    # -- calls (from the service's worker threads) ------------------------------------------

    def call(
        self, run: _Call, owner: str, confinement: Confinement | None, cap: int | None
    ) -> dict[str, Any] | None:
        """``run`` on the server kept for ``owner`` and this launch (started if need be);
        None when it could not be started warm (the caller then makes the call cold,
        which says why)."""
        key = WarmKey(owner, tuple(run.argv), run.url, run.cwd, cap, run.offers, run.modern)
        server = self._server(key, confinement)
        if server is None:
            return None
        fields = self._loop().call(server.call, run)
        fault = fields.get("fault")
        if fault in _RESTART:
            self._discard(server)
            if server.stderr is not None and not server.stderr.closed:
                with contextlib.suppress(ValueError, OSError):
                    fields["error"] += _tail(server.stderr)
        return fields

    def running(self, owner: str | None = None) -> list[WarmKey]:
        """The servers kept open (``owner``'s only, when given)."""
        with self._lock:
            return [k for k in self._servers if owner is None or k.owner == owner]

    def drop(self, owner: str) -> None:
        """Stop every server kept for ``owner`` (its sandbox was reset, or it ended)."""
        with self._lock:
            gone = [self._servers.pop(k) for k in list(self._servers) if k.owner == owner]
        self._close(gone)

    def close(self) -> None:
        """Stop every server and the loop that held them."""
        self._stop.set()
        with self._lock:
            gone, self._servers = list(self._servers.values()), {}
        self._close(gone)
        with self._lock:
            portal_cm, self._portal, self._portal_cm = self._portal_cm, None, None
        if portal_cm is not None:
            portal_cm.__exit__(None, None, None)
        if self._reaper is not None:
            self._reaper.join(timeout=5)

    # -- inside ------------------------------------------------------------------------------

    def _loop(self) -> BlockingPortal:
        with self._lock:
            if self._portal is None:
                self._portal_cm = start_blocking_portal()
                self._portal = self._portal_cm.__enter__()
                self._reaper = threading.Thread(
                    target=self._reap, name="mcp-warm-reaper", daemon=True
                )
                self._reaper.start()
            return self._portal

    def _server(self, key: WarmKey, confinement: Confinement | None) -> _Server | None:
        with self._lock:
            found = self._servers.get(key)
        if found is not None and _within(found.confinement, confinement):
            return found
        if found is not None:  # it may reach what this call may not: not this one's
            self._discard(found)
        server = _Server(key, confinement)
        try:
            server.held, _ = self._loop().start_task(server.hold, START_TIMEOUT_S)
        except Exception:  # it could not start: the cold call says why, in its words
            return None
        with self._lock:
            kept = self._servers.setdefault(key, server)
        if kept is not server:  # another thread started one meanwhile: keep one
            self._close([server])
        return kept

    def _discard(self, server: _Server) -> None:
        with self._lock:
            if self._servers.get(server.key) is server:
                del self._servers[server.key]
        self._close([server])

    def _close(self, servers: list[_Server]) -> None:
        portal = self._portal
        if portal is None:
            return
        for server in servers:
            with contextlib.suppress(RuntimeError):  # the loop is already stopping
                portal.call(_set, server)
            if server.held is not None:  # stopped before this returns: no stray process
                with contextlib.suppress(Exception):
                    server.held.result(timeout=STOP_TIMEOUT_S)

    def _reap(self) -> None:
        """Stop the servers idle for ``idle_s`` (none while a call of theirs runs)."""
        every = max(0.05, min(self.idle_s / 4, 30.0))
        while not self._stop.wait(every):
            now = time.monotonic()
            with self._lock:
                idle = [
                    s
                    for s in self._servers.values()
                    if not s.calls and now - s.last_used >= self.idle_s
                ]
                for server in idle:
                    del self._servers[server.key]
            self._close(idle)


def _within(kept: Confinement | None, call: Confinement | None) -> bool:
    """A server confined as ``kept`` may serve a call confined as ``call``: it can
    reach nothing the call's confinement would not let it reach (the same level and
    user; its paths and ports among the call's)."""
    if kept is None or call is None:
        return kept is call
    if (kept.level, kept.user, kept.protected) != (call.level, call.user, call.protected):
        return False
    return all(
        set(getattr(kept, part)) <= set(getattr(call, part))
        for part in ("read", "write", "connect", "bind", "lent")
    )


async def _set(server: _Server) -> None:
    server.close()


@contextlib.contextmanager
def warm_sessions(idle_s: float | None = None) -> Iterator[WarmSessions]:
    """A ``WarmSessions`` closed on the way out."""
    sessions = WarmSessions(idle_s)
    try:
        yield sessions
    finally:
        sessions.close()
