"""Child-process entry points for the multi-process reliability tests.

The tests start these with ``multiprocessing.get_context("spawn")``, so each child is a
fresh interpreter with its own ``ledger.open(url)``, its own connections and no state
inherited from pytest. Everything a child reports travels back as plain picklable data.
"""

from __future__ import annotations

import os
import random
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ulid import ULID

import ledger
from tests.helpers import plan_created, strategy

# How many retries one append may need before we call it a livelock (a test failure).
MAX_ATTEMPTS = 10_000
BARRIER_TIMEOUT_S = 60.0


@dataclass
class AppendRecord:
    """One successful append as its writer saw it."""

    stream: str
    event_id: str
    position: int
    version: int  # the stream version the event got (expected + 1)


@dataclass
class WorkerReport:
    worker: int
    appends: list[AppendRecord] = field(default_factory=list)
    shared_conflicts: int = 0
    solo_conflicts: int = 0
    # A ConcurrencyError whose attributes do not describe the conflict we caused.
    malformed_conflicts: list[str] = field(default_factory=list)
    # Anything other than ConcurrencyError: the store let a conflict (or worse) escape.
    errors: list[str] = field(default_factory=list)


def shared_stream(index: int) -> str:
    return f"shared:{index}"


def solo_stream(worker: int, index: int) -> str:
    return f"solo:{worker}:{index}"


def _append_one(
    store: ledger.Store,
    report: WorkerReport,
    stream: str,
    event: ledger.NewEvent,
    *,
    shared: bool,
    before_first_attempt: Callable[[], None] | None = None,
) -> None:
    """Read the stream version, append with it; on ConcurrencyError re-read and retry.

    The same event (same event_id) is retried: a refused append must leave nothing
    behind, or the retry would fail with DuplicateEventError.
    """
    for attempt in range(MAX_ATTEMPTS):
        version = store.stream_version(stream)
        if attempt == 0 and before_first_attempt is not None:
            before_first_attempt()
        try:
            [position] = store.append(stream, [event], version)
        except ledger.ConcurrencyError as exc:
            if shared:
                report.shared_conflicts += 1
            else:
                report.solo_conflicts += 1
            if exc.stream != stream or exc.expected != version or exc.actual <= version:
                report.malformed_conflicts.append(
                    f"{stream} expected={version}: got stream={exc.stream!r} "
                    f"expected={exc.expected!r} actual={exc.actual!r}"
                )
            continue
        assert event.event_id is not None
        report.appends.append(AppendRecord(stream, event.event_id, position, version + 1))
        return
    raise RuntimeError(f"{stream}: no append succeeded in {MAX_ATTEMPTS} attempts")


def concurrency_worker(
    url: str,
    worker: int,
    total_appends: int,
    lockstep_rounds: int,
    barrier: threading.Barrier,
    results: Any,  # multiprocessing Queue
) -> None:
    """Make ``total_appends`` successful single-event appends, then report.

    * The first ``lockstep_rounds`` appends go to ``shared:0`` in lock step: every
      worker reads the version, waits at the barrier, then appends with what it read.
      At most one of them can win each round, so conflicts are certain.
    * After that, odd appends hammer ``shared:0``/``shared:1`` free-running, even ones
      go to the worker's own ``solo:<worker>:<k>`` streams (which must never conflict).
    """
    report = WorkerReport(worker)
    try:
        store = ledger.open(url)
        try:
            for i in range(total_appends):
                event = plan_created(
                    f"w{worker}-{i}", event_id=str(ULID()), actor=f"worker-{worker}"
                )
                if i < lockstep_rounds:
                    _append_one(
                        store,
                        report,
                        shared_stream(0),
                        event,
                        shared=True,
                        before_first_attempt=lambda: barrier.wait(BARRIER_TIMEOUT_S),
                    )
                elif i % 2:
                    _append_one(store, report, shared_stream(i % 4 // 2), event, shared=True)
                else:
                    _append_one(store, report, solo_stream(worker, i % 3), event, shared=False)
        finally:
            store.close()
    except BaseException:
        report.errors.append(traceback.format_exc())
        barrier.abort()  # do not leave the other workers waiting for us
    results.put(report)


def crash_worker(url: str, round_id: int, marker_path: str, seed: int) -> None:
    """Append batches, each to its own new stream, until the parent SIGKILLs us.

    The stream name carries the batch size (``crash:<round>:<i>:<n>``). Around each
    append the child writes ``begin <stream>`` / ``done <stream>`` lines straight to
    ``marker_path`` (one unbuffered ``write`` each, which SIGKILL cannot split), so the
    parent knows which batches were acknowledged and which one was in flight.
    """
    rng = random.Random(seed)
    store = ledger.open(url)
    fd = os.open(marker_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    batch = 0
    while True:
        size = rng.randint(20, 50)
        stream = f"crash:{round_id}:{batch}:{size}"
        events = [strategy(f"R{round_id}", f"{stream} event {k}", revision=k) for k in range(size)]
        os.write(fd, f"begin {stream}\n".encode())
        store.append(stream, events, ledger.NO_STREAM)
        os.write(fd, f"done {stream}\n".encode())
        batch += 1


def apply_and_die(url: str, plan_id: str, token: str, kill_at: str) -> None:
    """Apply, and SIGKILL this process at ``kill_at`` (a step ``apply_plan`` reports:
    ``changes_computed``, ``changes_recorded``, ``file_written`` — the first file of
    several — or ``files_written``)."""
    import signal

    from commands.plane import Plane
    from commands.plane.lifecycle import apply_plan

    def progress(step: str) -> None:
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    with Plane.open(url) as plane:
        apply_plan(plane, plan_id, token, progress=progress)
