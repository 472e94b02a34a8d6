"""Read the log one window ahead of the fold.

A rebuild or a catch-up alternates two kinds of work: reading a window of the log (the
driver waiting on PostgreSQL's socket or in SQLite's C code, with the GIL released) and
folding it (Python, holding the GIL). Run in one thread they add up; with the reads in a
thread of their own, the next window is read while this one is folded.

Rows at or below the head are immutable, so reading them ahead, on the store's own read
connection and outside any write transaction, reads exactly what reading them later
would.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.05  # how often a blocked reader looks whether the fold stopped


class _End(Generic[T]):
    """The reader's last word: the end of the windows, or the error that ended them."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


def read_ahead(windows: Iterator[T], depth: int = 2) -> Iterator[T]:
    """``windows``, each read in a thread of its own while the caller works on the one
    before (at most ``depth`` read and waiting). An error while reading is raised here,
    in the caller's thread; when the caller stops early, the reader stops too and its
    connection is given back before this returns."""
    handed: queue.Queue[T | _End[T]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: T | _End[T]) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for window in windows:
                if not put(window):
                    return
            put(_End())
        except BaseException as exc:  # handed to the caller, raised there
            put(_End(exc))
        finally:
            close = getattr(windows, "close", None)
            if close is not None:
                close()  # a generator's cleanup (its connection) in the thread it ran in

    reader = threading.Thread(target=read, name="read-ahead", daemon=True)
    reader.start()
    try:
        while True:
            item = handed.get()
            if isinstance(item, _End):
                if item.error is not None:
                    raise item.error
                return
            yield item
    finally:
        stop.set()
        reader.join()
