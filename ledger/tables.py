"""Tables of the ledger (SQLAlchemy Core), shared by SQLite and PostgreSQL.

``events`` is the log; ``blobs`` holds large raw outputs by SHA-256; ``ledger_head`` is
the one row every append locks, holding the tree size, the last chain hash and the
Merkle frontier (the root is computed from it); ``ledger_meta`` records the schema
version; ``consumer_checkpoints`` holds subscription consumers' acknowledged positions.
Triggers (each backend's own, in ``ledger.backends``) make the database itself refuse
UPDATE and DELETE on events and blobs.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from .rows import COLUMNS

SCHEMA_VERSION = 1

metadata = MetaData()

# On SQLite an INTEGER PRIMARY KEY is the rowid itself: the log is stored in position
# order with no second index.
_Position = BigInteger().with_variant(Integer(), "sqlite")

events = Table(
    "events",
    metadata,
    Column("position", _Position, primary_key=True, autoincrement=False),
    Column("event_id", String(26), nullable=False),
    Column("stream", Text, nullable=False),
    Column("stream_version", BigInteger, nullable=False),
    Column("type", String(80), nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("recorded_at", String(32), nullable=False),
    Column("actor", Text, nullable=False),
    Column("correlation_id", String(26)),
    Column("causation_id", String(26)),
    Column("payload", LargeBinary, nullable=False),
    Column("delta", LargeBinary, nullable=False),
    Column("leaf_hash", LargeBinary, nullable=False),
    Column("chain_hash", LargeBinary, nullable=False),
    UniqueConstraint("event_id", name="uq_events_event_id"),
    UniqueConstraint("stream", "stream_version", name="uq_events_stream_version"),
    Index("ix_events_type", "type"),
)
# The row every reader reads (``ledger.rows``) is this table's columns, in this order.
assert tuple(events.c.keys()) == COLUMNS

blobs = Table(
    "blobs",
    metadata,
    Column("digest", String(64), primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
)

ledger_head = Table(
    "ledger_head",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("size", BigInteger, nullable=False),
    Column("chain_hash", LargeBinary, nullable=False),
    Column("frontier", LargeBinary, nullable=False),  # the root is derived from it
    CheckConstraint("id = 1", name="ck_ledger_head_one_row"),
)

# A named downstream consumer's acknowledged position (ledger.subscriptions): advanced
# only when the consumer acknowledges, never by the store.
consumer_checkpoints = Table(
    "consumer_checkpoints",
    metadata,
    Column("name", String(128), primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("updated_at", String(32), nullable=False),
)

ledger_meta = Table(
    "ledger_meta",
    metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

# How the database refuses a change to a stored row (the triggers are each backend's:
# ledger.backends).
APPEND_ONLY_MESSAGE = "evidence ledger: the log is append-only"

# PostgreSQL wakes waiting subscribers: the append trigger (ledger.backends.postgres)
# NOTIFYs this channel when an append commits.
NOTIFY_CHANNEL = "evidence_appended"
NOTIFY_TRIGGER = "ledger_head_notify"
