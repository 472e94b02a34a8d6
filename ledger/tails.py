"""What one writer knows of the log's end between its write transactions.

A plane decides under the ledger lock from a stream folded up to the present: it reads
the events of the stream it has not folded yet, and they are almost always the ones it
appended itself in its previous transaction. With group commit (the service) a batch of
*n* decisions is then *n* reads, each a round trip to the server made while the lock is
held. ``StreamTails`` remembers, for the streams a writer's transactions read or
appended, the stream's version and its last rows exactly as stored, as of the head that
writer last committed. The next transaction, when it takes the lock, reads the events
appended since that head in the same round trip (with one writer: none); it applies them
to the streams it knows, and then answers a stream read from memory whenever the rows it
holds reach back far enough.

Why it is exact: positions are dense and given under the lock, so with the lock held
the events after the known head are everything there is to learn; a head that does not
equal the known head plus what was read (a log edited or restored under a running
writer) forgets everything. The rows are the stored columns, decoded as a read decodes
them, so a fold cannot tell a remembered row from one read back. A transaction that
fails forgets everything too: what it learned may include its own rolled-back appends.

One transaction at a time uses a writer's tails (``claim``/``release``); a second
transaction of the same writer running at once reads the database as if there were none.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from .rows import COLUMNS, Row

__all__ = ["CATCH_UP_LIMIT", "StreamTails", "TailsView"]

# Where a row (``ledger.rows``: a stored row, a plain tuple) holds its stream and its
# stream version.
STREAM, VERSION = COLUMNS.index("stream"), COLUMNS.index("stream_version")

# More foreign events than this since the known head: forget, and read as if new.
CATCH_UP_LIMIT = 64


class TailsView:
    """The tails one transaction holds: the streams' versions and last rows as of
    ``size`` (``None``: as of nothing yet, the transaction learns as it reads)."""

    __slots__ = ("max_rows", "max_streams", "size", "streams")

    def __init__(
        self,
        size: int | None,
        streams: OrderedDict[str, tuple[int, tuple[Row, ...]]],
        max_streams: int,
        max_rows: int,
    ) -> None:
        self.size, self.streams = size, streams
        self.max_streams, self.max_rows = max_streams, max_rows

    def rows_from(self, stream: str, from_version: int) -> tuple[Row, ...] | None:
        """The stream's rows from ``from_version`` on, or None when they are not all held
        (read them from the database)."""
        found = self.streams.get(stream)
        if found is None:
            return None
        version, rows = found
        if from_version > version:
            return ()
        first = version - len(rows) + 1
        if from_version < first:
            return None
        self.streams.move_to_end(stream)
        return rows[from_version - first :]

    def version(self, stream: str) -> int:
        return self.streams[stream][0]

    def learn_read(self, stream: str, from_version: int, rows: Sequence[Row]) -> None:
        """A read of ``stream`` from ``from_version``, made under the lock, found
        ``rows``: every version from ``from_version`` to the stream's last."""
        if rows:
            held = self.streams.get(stream)
            if held is not None and held[0] == from_version - 1:
                self._keep(stream, rows[-1][VERSION], held[1] + tuple(rows))
            else:
                self._keep(stream, rows[-1][VERSION], tuple(rows))
        elif from_version == 1:
            self._keep(stream, 0, ())  # no such stream (yet)

    def learn_row(self, row: Row) -> None:
        """An event at the end of its stream (appended, or read after the known head):
        it extends what is held of its stream, or starts it when the stream's version
        before it is ``row``'s version minus one by the caller's knowledge."""
        stream, version = row[STREAM], row[VERSION]
        held = self.streams.get(stream)
        if held is not None and held[0] == version - 1:
            self._keep(stream, version, held[1] + (row,))
        else:
            self._keep(stream, version, (row,))

    def catch_up(self, head: int, rows: Sequence[Row]) -> None:
        """Under the lock: ``head`` is the log's size, ``rows`` the events after
        ``size`` (at most ``CATCH_UP_LIMIT + 1``, in position order)."""
        if self.size is None:
            return
        if len(rows) > CATCH_UP_LIMIT or head != self.size + len(rows):
            self.forget()
        else:
            for row in rows:
                stream = row[STREAM]
                held = self.streams.get(stream)
                if held is None:
                    continue  # not a stream this writer knows: still unknown
                if held[0] == row[VERSION] - 1:
                    self._keep(stream, row[VERSION], held[1] + (row,))
                else:  # a gap: the log is not what this writer saw
                    del self.streams[stream]
        self.size = head

    def forget(self) -> None:
        self.streams.clear()
        self.size = None

    def _keep(self, stream: str, version: int, rows: tuple[Row, ...]) -> None:
        streams = self.streams
        streams[stream] = (version, rows[-self.max_rows :])
        streams.move_to_end(stream)
        while len(streams) > self.max_streams:
            streams.popitem(last=False)


class StreamTails:
    """A writer's tails, kept between its write transactions (``Store.write(tails=)``).
    Memory is bounded: at most ``max_streams`` streams (the least recently used go) and
    ``max_rows`` rows of each."""

    def __init__(self, *, max_streams: int = 1024, max_rows: int = 8) -> None:
        self._lock = threading.Lock()
        self._in_use = False
        self._view = TailsView(None, OrderedDict(), max_streams, max_rows)

    @property
    def size(self) -> int | None:
        """The head the tails are known as of (None: nothing known)."""
        return self._view.size

    def claim(self) -> TailsView | None:
        """The tails for one transaction, or None while another holds them."""
        with self._lock:
            if self._in_use:
                return None
            self._in_use = True
            return self._view

    def release(self, committed_size: int | None) -> None:
        """The claiming transaction ended: committed with the log at
        ``committed_size`` (None: the head was never read, the tails are as they were),
        or failed (``forget`` first)."""
        with self._lock:
            if committed_size is not None:
                self._view.size = committed_size
            self._in_use = False

    def forget(self) -> None:
        with self._lock:
            self._view.forget()
