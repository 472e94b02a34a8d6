"""The service's open planes: one ``Plane`` per worker thread.

A ``Plane`` holds an engine, caches of checked plan prefixes and of the policy, and —
in its store — a driver connection per thread that uses it. Opening one is not free, so
the service keeps them; and it keeps one *per thread* rather than handing planes from
thread to thread, because a plane that visited every thread would hold a connection on
every one of them (planes x threads connections: past PostgreSQL's limit with a few
services). A plane whose thread has ended (a worker thread idle too long is retired)
is closed when the next plane is made. The in-flight bound and the worker threads'
limiter bound how many there are.

A plane's appends go to the group commit (``committer.py``) when one is given, and its
read models are the follower's (``follower.py``): the service's planes never touch them.
Its MCP calls go to the service's warm servers (``commands.runner.mcp_sessions``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from commands.plane.core import Committer, Plane
from commands.runner.guards import KeptSnapshots
from commands.runner.mcp_sessions import WarmSessions

T = TypeVar("T")


class PlanePool:
    def __init__(
        self,
        db_url: str,
        *,
        workdir: Path | None = None,
        committer: Committer | None = None,
        mcp_sessions: WarmSessions | None = None,
        snapshots: KeptSnapshots | None = None,
    ) -> None:
        self.db_url = db_url
        self.workdir = workdir
        self.committer = committer
        self.mcp_sessions = mcp_sessions
        self.snapshots = snapshots
        self._planes: dict[threading.Thread, Plane] = {}
        self._lock = threading.Lock()
        self._closed = False

    def _open(self) -> Plane:
        # Never create: the service serves a ledger an operator made (`evidence init`).
        plane = Plane.open(
            self.db_url, create=False, workdir=self.workdir, inline_read_models=False
        )
        plane.committer = self.committer
        plane.mcp_sessions = self.mcp_sessions
        plane.snapshots = self.snapshots
        return plane

    def _mine(self) -> Plane:
        """This thread's plane (made on its first operation)."""
        me = threading.current_thread()
        with self._lock:
            if self._closed:
                raise RuntimeError("the service is stopping")
            plane = self._planes.get(me)
        if plane is not None:
            return plane
        plane = self._open()
        with self._lock:
            ended = [t for t in self._planes if not t.is_alive()]
            retired = [self._planes.pop(t) for t in ended]
            self._planes[me] = plane
        for old in retired:
            old.close()
        return plane

    def run(self, fn: Callable[[Plane], T]) -> T:
        """``fn`` with this thread's plane. A plane whose operation failed on something
        other than a refusal (a broken connection, a bug) is closed, and the thread's
        next operation opens another."""
        plane = self._mine()
        try:
            return fn(plane)
        except BaseException as exc:
            from ledger import LedgerError  # a refusal leaves the plane as it was

            if not isinstance(exc, LedgerError):
                with self._lock:
                    if self._planes.get(threading.current_thread()) is plane:
                        del self._planes[threading.current_thread()]
                plane.close()
            raise

    def close(self) -> None:
        """Close every plane (the service has drained: no operation is running)."""
        with self._lock:
            self._closed = True
            planes, self._planes = list(self._planes.values()), {}
        for plane in planes:
            plane.close()
