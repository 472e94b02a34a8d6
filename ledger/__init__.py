"""The log: event catalog, canonical codec, store (SQLite/PostgreSQL), hash chain and
Merkle tree, blobs and verification. Imports neither ``projections`` nor ``commands``."""

from .errors import (
    ConcurrencyError,
    DuplicateEventError,
    InvalidEventError,
    LedgerError,
    LedgerOpenError,
    LedgerSchemaError,
    LedgerURLError,
    UnknownEventTypeError,
)
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
    "LedgerError",
    "LedgerOpenError",
    "LedgerSchemaError",
    "LedgerURLError",
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
