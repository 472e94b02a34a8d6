"""The service's read models, caught up beside the requests rather than inside them.

The service's planes append without updating the read models (``Plane(...,
inline_read_models=False)``): a gate check then holds the ledger lock for its decision
and its append only, which is what bounds how many checks the ledger takes a second
(docs/performance.md). The read models are query caches no decision reads; this thread
brings them up to the head a moment later, many appends per transaction: each
operation that may have appended pokes it, and it catches up at most every
``interval`` seconds while pokes come, and once more when it stops, so that a service
stopped cleanly leaves them current. Any process that opens the ledger (``evidence
status``, another service) catches them up itself too, so nothing ever depends on
this thread having run.
"""

from __future__ import annotations

import logging
import threading

from commands.plane.core import Plane

log = logging.getLogger("evidence.service")

INTERVAL_S = 0.2


class ReadModelFollower:
    def __init__(self, db_url: str, *, interval: float = INTERVAL_S) -> None:
        self.db_url = db_url
        self.interval = interval
        self._poked = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="read-models", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        """Something may have been appended: catch up soon."""
        self._poked.set()

    def stop(self) -> None:
        """Catch up once more, then end (waits for the thread)."""
        self._stopping.set()
        self._poked.set()
        if self._thread is not None:
            self._thread.join()

    @staticmethod
    def _catch_up(plane: Plane) -> None:
        """What was appended since the last time, in one transaction under the ledger
        lock (what a follower finds is a few hundred events at most); a longer lag (the
        service started on a ledger appended to without it) the way opening does."""
        with plane.store.write() as tx:
            if plane.projections.catch_up_locked(tx):
                return
        plane.projections.catch_up(chase=False)

    def _run(self) -> None:
        plane: Plane | None = None
        while True:
            self._poked.wait()
            if not self._stopping.is_set():
                self._stopping.wait(self.interval)  # gather what comes meanwhile
            self._poked.clear()
            # Read after the clear: a stop that set both flags before it is seen here,
            # one that sets them after it wakes the wait above again.
            stopping = self._stopping.is_set()
            try:
                if plane is None:
                    plane = Plane.open(self.db_url, create=False)
                if plane.projections.lagging():
                    self._catch_up(plane)
            except Exception as exc:  # the database away: the next poke tries again
                log.warning("read models not caught up: %s", exc)
                if plane is not None:
                    plane.close()
                    plane = None
            if stopping:
                break
        if plane is not None:
            plane.close()
