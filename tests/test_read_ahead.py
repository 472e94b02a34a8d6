"""``read_ahead``: the windows of a rebuild or catch-up read in a thread of their own,
one ahead of the fold — every window, in order; a reader's error raised in the caller;
a caller that stops early stops the reader, whose cleanup (its connection) has run by
the time it returns."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from projections.read_ahead import read_ahead


def test_every_window_in_order_read_in_another_thread() -> None:
    readers: set[str] = set()

    def windows() -> Iterator[int]:
        for i in range(50):
            readers.add(threading.current_thread().name)
            yield i

    assert list(read_ahead(windows())) == list(range(50))
    assert readers == {"read-ahead"}


def test_the_next_window_is_read_while_this_one_is_worked_on() -> None:
    read_at: list[float] = []

    def windows() -> Iterator[int]:
        for i in range(3):
            read_at.append(time.monotonic())
            time.sleep(0.05)  # the driver waiting, the GIL released
            yield i

    started = time.monotonic()
    for _ in read_ahead(windows()):
        time.sleep(0.05)  # the fold
    took = time.monotonic() - started
    # In turn: 3 reads + 3 folds = 0.30 s; overlapped: about 0.20 s.
    assert took < 0.27, took


def test_an_error_while_reading_is_raised_in_the_caller() -> None:
    def windows() -> Iterator[int]:
        yield 1
        raise RuntimeError("the read failed")

    seen = []
    with pytest.raises(RuntimeError, match="the read failed"):
        for window in read_ahead(windows()):
            seen.append(window)
    assert seen == [1]


def test_a_caller_that_stops_early_stops_the_reader() -> None:
    cleaned = threading.Event()

    def windows() -> Iterator[int]:
        try:
            yield from range(10_000)
        finally:
            cleaned.set()

    before = threading.active_count()
    ahead = read_ahead(windows())
    assert next(ahead) == 0
    ahead.close()  # the fold stopped (an error, say)
    assert cleaned.is_set()  # the reader's cleanup ran before close returned
    assert threading.active_count() == before
