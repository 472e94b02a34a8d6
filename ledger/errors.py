"""Errors a caller can cause. Every one of them leaves the ledger unchanged; the CLI
prints ``error: <message>`` and exits 2 for all of them."""

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
