"""Group commit: the appends of a service process, decided and committed together.

Every gate check is a decision under the ledger lock ending in a durable commit, and the
lock is held across the commit's fsync: one decision per transaction caps the ledger at
one fsync per check, whatever the number of agents (docs/performance.md). Here the
service's planes hand their ``Plane.run`` jobs to one thread, which takes whatever jobs
are waiting (at most ``max_batch``), decides and appends each in turn in one transaction
— each against the log as the jobs before it left it, exactly as if they had run one
after the other — and commits once. Each job's caller is answered after that commit:
nothing is acknowledged before it is durable. A job its own rules refuse is refused
alone; a failure of the transaction (the database gone) fails every job of the batch,
and none of them appended anything.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

from commands.plane.core import Job, Plane
from ledger import RecordedEvent

log = logging.getLogger("evidence.service")

MAX_BATCH = 64


class GroupCommitter:
    def __init__(self, open_plane: Callable[[], Plane], *, max_batch: int = MAX_BATCH) -> None:
        self._open_plane = open_plane
        self.max_batch = max_batch
        self._jobs: queue.SimpleQueue[tuple[Job, Future[list[RecordedEvent]]] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self.batches = 0  # transactions made (written by the committer's thread only)
        self.jobs = 0  # jobs they held

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="group-commit", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Finish what was submitted, then end (waits for the thread)."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def submit(self, job: Job) -> list[RecordedEvent]:
        """Decide and append ``job`` in the next batch; its events once committed, or
        its refusal (or the batch's failure) raised here."""
        if self._thread is None:
            raise RuntimeError("the group committer is not running")
        done: Future[list[RecordedEvent]] = Future()
        self._jobs.put((job, done))
        return done.result()

    def _run(self) -> None:
        plane: Plane | None = None
        stopping = False
        while not stopping:
            first = self._jobs.get()
            if first is None:
                break
            batch = [first]
            while len(batch) < self.max_batch:  # whatever else is waiting, no more
                try:
                    more = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                batch.append(more)
            try:
                if plane is None:
                    plane = self._open_plane()
                answers = plane.run_batch([job for job, _ in batch])
                self.batches += 1
                self.jobs += len(batch)
            except BaseException as exc:  # the transaction failed: every job with it
                for _, done in batch:
                    done.set_exception(exc)
                if plane is not None:
                    plane.close()
                    plane = None
                if not isinstance(exc, Exception):
                    raise
                continue
            for (_, done), answer in zip(batch, answers, strict=True):
                if isinstance(answer, BaseException):
                    done.set_exception(answer)
                else:
                    done.set_result(answer)
        if plane is not None:
            plane.close()
