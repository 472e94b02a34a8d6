"""Errors a caller can cause, and the database's conditions the ledger names itself.
Every one of them leaves the ledger unchanged; the CLI prints ``error: <message>`` and
exits 2 for all of them; the service answers 409, or 503 with ``Retry-After`` for a
``LedgerUnavailable``.

    LedgerError
    ├── LedgerURLError, LedgerOpenError (LedgerSchemaError), InvalidEventError,
    │   ConcurrencyError, DuplicateEventError, UnknownEventTypeError …
    ├── LedgerUnavailable       the database cannot serve now: retry
    │   └── LedgerBusy          another writer held the lock past the wait
    └── LedgerStorageError      the storage refuses (a read-only file, a full disk)

A driver's error (sqlite3, psycopg, SQLAlchemy's wrappers) becomes one of the last three
where the store touches the driver (``Backend.translate``); one it does not know is a
defect and goes up as it is."""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every refusal: bad input, or a step the log's state does not allow."""


class LedgerURLError(LedgerError):
    """The database URL is malformed or names an unsupported backend."""


class LedgerOpenError(LedgerError):
    """The database cannot be opened, is not a ledger, or is unreadable."""


class LedgerSchemaError(LedgerOpenError):
    """The database was written by a newer schema than this code understands."""


class InvalidEventError(LedgerError):
    """An event to append is malformed (bad id, stream, or a payload with no JSON form)."""


class ConcurrencyError(LedgerError):
    """The stream's version is not the one the append expected."""

    def __init__(self, stream: str, expected: object, actual: int) -> None:
        self.stream, self.expected, self.actual = stream, expected, actual
        super().__init__(
            f"stream {stream!r} is at version {actual}, but the append expected {expected}"
        )


class DuplicateEventError(LedgerError):
    """An event id is already in the log. Duplicates are errors, never dropped silently."""

    def __init__(self, event_ids: list[str]) -> None:
        self.event_ids = event_ids
        super().__init__(f"event id already in the log: {', '.join(event_ids)}")


class UnknownEventTypeError(LedgerError):
    """A stored event's type (or version) is not one this code knows how to read."""


class LedgerUnavailable(LedgerError):
    """The database cannot serve the request now (a lost connection, a lock held past
    the wait): nothing was changed, and the same request may succeed later."""

    retry_after_s = 1


class LedgerBusy(LedgerUnavailable):
    """Another writer held the ledger's lock past the wait (``EVIDENCE_LOCK_WAIT``)."""


class LedgerStorageError(LedgerError):
    """The storage refuses the write (the database file is read-only here, the disk is
    full): nothing was changed; retrying will not help until it is fixed."""
