"""``read_ahead``: the windows of a rebuild or catch-up read in a thread of their own,
one ahead of the fold — every window, in order; a reader's error raised in the caller;
a caller that stops early stops the reader, whose cleanup (its connection) has run by
the time it returns."""

from __future__ import annotations

import threading
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
    """Shown by events, not by timing: the fold holds window 0 until window 1 has been
    read. Read in turn, window 1 would only be read when the fold asked for it, so the
    wait would give up (a generous bound: it fails, it never passes, on time)."""
    read = [threading.Event() for _ in range(3)]

    def windows() -> Iterator[int]:
        for i in range(3):
            read[i].set()
            yield i

    seen: list[tuple[int, bool]] = []
    for window in read_ahead(windows()):
        ahead = window + 1 < len(read) and read[window + 1].wait(timeout=60)
        seen.append((window, ahead))
    assert seen == [(0, True), (1, True), (2, False)]


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
