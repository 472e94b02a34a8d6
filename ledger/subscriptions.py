"""Catch-up subscriptions: read the log in position order, then follow it live.

A subscription starts at a position (``from_position``) or where a named consumer left
off (``consumer="name"``: its acknowledged *position*, a row of the
``consumer_checkpoints`` table), reads everything up to the head in batches, and with
``follow=True`` keeps polling the head for more. (A consumer's position is not a signed
checkpoint of ``ledger.checkpoints``: it is bookkeeping, and no decision rests on it.)

Delivery is at-least-once. The position of a named consumer moves only when the
consumer calls ``ack(position)`` after it has handled the events up to ``position``; a
consumer that stops before acknowledging gets the unacknowledged events again next
time. Positions are dense and equal to commit order (every append assigns them under
the ledger lock and moves the head in the same transaction), so reading up to the head
and then from ``head + 1`` never skips an event: handle events idempotently by position.

    sub = subscribe(store, consumer="warehouse")
    for batch in sub.batches(follow=True):
        load(batch)                        # idempotent by event.position
        sub.ack(batch[-1].position)

Correctness never depends on a notification: a waiting subscription polls the head
every ``poll_interval`` seconds (``stop()`` wakes it at once). On PostgreSQL it also
LISTENs on the channel the append trigger NOTIFYs (``tables.NOTIFY_CHANNEL``), so a
commit wakes it at once rather than at the next poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from . import tables
from .backends import driver_connection
from .errors import LedgerError
from .events import RecordedEvent
from .store import Store
from .timestamps import utc_now

__all__ = ["Subscription", "consumer_position", "consumers", "subscribe"]

_NAME_MAX = 128


class SubscriptionError(LedgerError):
    """A subscription asked for something impossible (bad name, ack ahead of delivery)."""


def _check_name(name: str) -> None:
    if not name or len(name) > _NAME_MAX or not name.isprintable():
        raise SubscriptionError(f"invalid consumer name {name!r} (1-{_NAME_MAX} printable chars)")


def consumer_position(store: Store, consumer: str) -> int | None:
    """The consumer's acknowledged position, or None if it never acknowledged."""
    c = tables.consumer_checkpoints.c
    with store.read_transaction() as conn:
        return conn.execute(sa.select(c.position).where(c.name == consumer)).scalar_one_or_none()


def consumers(store: Store) -> dict[str, tuple[int, str]]:
    """Every named consumer: name -> (acknowledged position, updated_at)."""
    c = tables.consumer_checkpoints.c
    with store.read_transaction() as conn:
        rows = conn.execute(sa.select(c.name, c.position, c.updated_at).order_by(c.name)).all()
    return {name: (position, at) for name, position, at in rows}


def _save_position(store: Store, consumer: str, position: int) -> None:
    """Upsert, never moving backwards (two instances of one consumer may race)."""
    table = tables.consumer_checkpoints
    dialect = postgresql if store.backend == "postgresql" else sqlite
    stmt = dialect.insert(table).values(name=consumer, position=position, updated_at=utc_now())
    stmt = stmt.on_conflict_do_update(
        index_elements=[table.c.name],
        set_={"position": stmt.excluded.position, "updated_at": stmt.excluded.updated_at},
        where=table.c.position < stmt.excluded.position,
    )
    with store.side_write() as conn:
        conn.execute(stmt)


class _Waiter:
    """Sleeps until the head may have moved: at most ``interval`` seconds, less if
    ``stop`` is set or (PostgreSQL) a NOTIFY from the append trigger arrives."""

    _SLICE = 0.05  # how soon stop() is noticed while listening

    def __init__(self, store: Store, stop: threading.Event) -> None:
        self._stop = stop
        self._raw: Any = None
        self._errors: tuple[type[BaseException], ...] = ()
        if store.backend == "postgresql":
            import psycopg  # only on PostgreSQL, where the driver is installed

            self._errors = (sa.exc.DBAPIError, psycopg.Error)
            try:
                raw = store.engine.raw_connection()
                driver = driver_connection(raw)
                driver.autocommit = True
                driver.execute(f"LISTEN {tables.NOTIFY_CHANNEL}")
                self._raw = raw
            except self._errors:  # a hint only: without it the poll still finds everything
                self._raw = None

    def wait(self, interval: float) -> None:
        if self._raw is None:
            self._stop.wait(interval)
            return
        deadline = time.monotonic() + interval
        try:
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                # Any notification means "look again"; what was appended is read from
                # the log, never taken from the payload.
                for _ in self._raw.driver_connection.notifies(
                    timeout=min(left, self._SLICE), stop_after=1
                ):
                    return
        except self._errors:  # the listening connection broke: fall back to polling
            self.close()

    def close(self) -> None:
        raw, self._raw = self._raw, None
        if raw is not None:
            try:
                raw.driver_connection.execute("UNLISTEN *")
                raw.driver_connection.autocommit = False
                raw.close()
            except self._errors:
                raw.invalidate()


class Subscription:
    """One reader of the log (see the module docstring). Not shared between threads,
    except ``stop()``, which any thread may call."""

    def __init__(
        self,
        store: Store,
        *,
        from_position: int | None = None,
        consumer: str | None = None,
        types: Sequence[str] | None = None,
        batch_size: int = 500,
        poll_interval: float = 0.2,
    ) -> None:
        if from_position is not None and consumer is not None:
            raise SubscriptionError("give from_position or consumer, not both")
        if from_position is not None and from_position < 1:
            raise SubscriptionError(f"from_position must be >= 1, got {from_position}")
        if batch_size < 1:
            raise SubscriptionError(f"batch_size must be >= 1, got {batch_size}")
        if consumer is not None:
            _check_name(consumer)
        unknown = [t for t in types or () if t not in store.catalog]
        if unknown:
            raise SubscriptionError(f"unknown event type {unknown[0]!r} (see docs/events.md)")
        self.store = store
        self.consumer = consumer
        self.types = list(types) if types else None
        self.batch_size = batch_size
        self.poll_interval = poll_interval
        if consumer is not None:
            self.acked = consumer_position(store, consumer) or 0
        else:
            self.acked = (from_position or 1) - 1
        # Everything up to ``scanned`` has been read (and, if it matched, delivered).
        self.scanned = self.acked
        self._stop = threading.Event()

    @property
    def next_position(self) -> int:
        return self.scanned + 1

    def stop(self) -> None:
        """Make ``batches`` return after the batch in hand (wakes a waiting poll)."""
        self._stop.set()

    def batches(self, *, follow: bool = False) -> Iterator[list[RecordedEvent]]:
        """Batches of events in position order, from where the subscription stands.

        Without ``follow`` it ends at the head as it is when each read begins; with it,
        it waits for more (woken by PostgreSQL's NOTIFY, and polling every
        ``poll_interval`` s in any case) until ``stop()``.
        """
        store = self.store
        # Listen before the first read of the head, so an append committed in between
        # is notified rather than left to the next poll.
        waiter = _Waiter(store, self._stop) if follow else None
        try:
            while not self._stop.is_set():
                head = store.head().size
                if head > self.scanned:
                    for batch in store.read_batches(
                        self.scanned + 1,
                        to_position=head,
                        batch_size=self.batch_size,
                        types=self.types,
                    ):
                        self.scanned = batch[-1].position
                        yield batch
                        if self._stop.is_set():
                            return
                    # A filtered read may end before the head: nothing else matched.
                    self.scanned = max(self.scanned, head)
                    continue
                if waiter is None:
                    return
                waiter.wait(self.poll_interval)
        finally:
            if waiter is not None:
                waiter.close()

    def events(self, *, follow: bool = False) -> Iterator[RecordedEvent]:
        for batch in self.batches(follow=follow):
            yield from batch

    def ack(self, position: int | None = None) -> None:
        """Acknowledge every event up to ``position`` (default: all read so far).

        For a named consumer the position is stored; it never moves backwards and
        never ahead of what this subscription has read.
        """
        position = self.scanned if position is None else position
        if position > self.scanned:
            raise SubscriptionError(
                f"cannot acknowledge position {position}: only {self.scanned} was delivered"
            )
        if position <= self.acked:
            return
        if self.consumer is not None:
            _save_position(self.store, self.consumer, position)
        self.acked = position


def subscribe(
    store: Store,
    *,
    from_position: int | None = None,
    consumer: str | None = None,
    types: Sequence[str] | None = None,
    batch_size: int = 500,
    poll_interval: float = 0.2,
) -> Subscription:
    """A subscription from ``from_position`` (default 1) or from ``consumer``'s
    position (the first event after the last one it acknowledged)."""
    return Subscription(
        store,
        from_position=from_position,
        consumer=consumer,
        types=types,
        batch_size=batch_size,
        poll_interval=poll_interval,
    )
