"""The service's open planes: a few ``Plane`` objects shared by the worker threads, each
used by one thread at a time.

A ``Plane`` holds an engine, the read models' engine and caches of checked plan
prefixes; opening one costs a catch-up of the read models (a tenth of a second on a
small ledger), so the service keeps them rather than opening one per request. A plane is
handed to a thread for one operation and taken back after it (SQLite connections are
opened with ``check_same_thread=False``, so a plane may move between threads; never two
at once). The pool makes a new plane when none is idle and keeps at most ``keep`` idle
ones: the in-flight bound (``Overload``) is what bounds how many are ever in use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from commands.plane.core import Committer, Plane

T = TypeVar("T")


class PlanePool:
    def __init__(
        self,
        db_url: str,
        *,
        keep: int,
        workdir: Path | None = None,
        committer: Committer | None = None,
    ) -> None:
        self.db_url = db_url
        self.workdir = workdir
        self.committer = committer
        self._keep = keep
        self._idle: list[Plane] = []
        self._lock = threading.Lock()
        self._closed = False

    def _open(self) -> Plane:
        # Never create: the service serves a ledger an operator made (`evidence init`).
        # The read models are the follower's (``follower.py``), not each append's.
        plane = Plane.open(
            self.db_url, create=False, workdir=self.workdir, inline_read_models=False
        )
        plane.committer = self.committer  # its appends: the group commit's (committer.py)
        return plane

    @contextmanager
    def plane(self) -> Iterator[Plane]:
        """A plane for this thread's operation. One whose operation failed on something
        other than a refusal (a broken connection, a bug) is closed, not reused."""
        with self._lock:
            plane = self._idle.pop() if self._idle else None
        if plane is None:
            plane = self._open()
        try:
            yield plane
        except BaseException as exc:
            from ledger import LedgerError  # a refusal leaves the plane as it was

            if isinstance(exc, LedgerError):
                self._give_back(plane)
            else:
                plane.close()
            raise
        else:
            self._give_back(plane)

    def run(self, fn: Callable[[Plane], T]) -> T:
        with self.plane() as plane:
            return fn(plane)

    def _give_back(self, plane: Plane) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._keep:
                self._idle.append(plane)
                return
        plane.close()

    def close(self) -> None:
        """Close every idle plane; one still in use is closed when it comes back."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for plane in idle:
            plane.close()
