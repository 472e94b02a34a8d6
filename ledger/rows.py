"""The stored row: the ``events`` table's columns, in the one order every reader reads.

``StoredRow`` is the definition; ``COLUMNS`` (its field names) is what each SELECT of
the log and the store's INSERT are built from, so the store, ``verify``, bundles, proofs
and the CLI read the same columns in the same order. ``tables.events`` is the schema and
is checked against it when that module loads.

A driver hands a row back as a plain tuple in this order, and the hot loops (the
store's decode, ``verify``'s scan, a bundle's export) unpack it as one: they never make
a ``StoredRow`` of it, which would cost a call per row. A reader that is not a hot loop
takes the names (``StoredRow._make(row)``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["BARE_COLUMNS", "COLUMNS", "Row", "StoredRow", "column_list"]


class StoredRow(NamedTuple):
    """One row of ``events`` exactly as stored (the hashes and JSON bytes unread)."""

    position: int
    event_id: str
    stream: str
    stream_version: int
    type: str
    schema_version: int  # the version the payload bytes were written with
    recorded_at: str
    actor: str
    correlation_id: str | None
    causation_id: str | None
    payload: bytes  # canonical JSON
    delta: bytes  # canonical JSON (``[]`` when the event had none)
    leaf_hash: bytes
    chain_hash: bytes


# A stored row as a driver hands it: ``StoredRow``'s fields in its order, a plain tuple.
Row = tuple[Any, ...]

COLUMNS: tuple[str, ...] = StoredRow._fields

# What a fold reads (``Store.read_bare``), in ``COLUMNS``' order: the stream at index 1.
BARE_COLUMNS: tuple[str, ...] = (
    "position",
    "stream",
    "stream_version",
    "type",
    "schema_version",
    "payload",
)


def column_list(columns: tuple[str, ...] = COLUMNS, *, prefix: str = "") -> str:
    """``columns`` as a SELECT or INSERT spells them (``prefix``: a table alias and a
    dot, ``"e."``)."""
    return ", ".join(prefix + name for name in columns)


assert set(BARE_COLUMNS) <= set(COLUMNS)
