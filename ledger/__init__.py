"""The log: event catalog, canonical codec, store (SQLite/PostgreSQL), hash chain and
Merkle tree, blobs and verification. Imports neither ``projections`` nor ``commands``.

The errors and the version are here at once; the rest (the catalog, and the store with
SQLAlchemy under it) is imported on first use of its name (PEP 562), so a program that
only needs ``ledger.LedgerError`` or ``ledger.__version__`` (``evidence --version``)
does not pay for the database layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    ConcurrencyError,
    DuplicateEventError,
    InvalidEventError,
    LedgerBusy,
    LedgerError,
    LedgerOpenError,
    LedgerSchemaError,
    LedgerStorageError,
    LedgerUnavailable,
    LedgerURLError,
    UnknownEventTypeError,
)
from .lazy import lazy_getattr

if TYPE_CHECKING:
    from .events import DEFAULT_CATALOG, Catalog, EventPayload, NewEvent, RecordedEvent
    from .store import (
        ANY,
        NO_STREAM,
        Expect,
        LogReader,
        Store,
        StreamAppend,
        TreeHead,
        WriteTx,
        default_url,
    )
    from .store import open_store as open

__version__ = "0.1.0"

# name -> (submodule, attribute): what ``ledger.<name>`` imports on first use.
_LAZY: dict[str, tuple[str, str]] = {
    **{
        name: ("events", name)
        for name in ("DEFAULT_CATALOG", "Catalog", "EventPayload", "NewEvent", "RecordedEvent")
    },
    **{
        name: ("store", name)
        for name in (
            "ANY",
            "NO_STREAM",
            "Expect",
            "LogReader",
            "Store",
            "StreamAppend",
            "TreeHead",
            "WriteTx",
            "default_url",
        )
    },
    "open": ("store", "open_store"),
}

if not TYPE_CHECKING:  # for mypy every name above is imported; unknown names stay errors
    __getattr__ = lazy_getattr(__name__, _LAZY, globals(), submodules=True)


__all__ = [
    "ANY",
    "DEFAULT_CATALOG",
    "NO_STREAM",
    "Catalog",
    "ConcurrencyError",
    "DuplicateEventError",
    "EventPayload",
    "Expect",
    "InvalidEventError",
    "LedgerBusy",
    "LedgerError",
    "LedgerOpenError",
    "LedgerSchemaError",
    "LedgerStorageError",
    "LedgerURLError",
    "LedgerUnavailable",
    "LogReader",
    "NewEvent",
    "RecordedEvent",
    "Store",
    "StreamAppend",
    "TreeHead",
    "UnknownEventTypeError",
    "WriteTx",
    "__version__",
    "default_url",
    "open",
]
