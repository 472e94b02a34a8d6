"""Tables of the ledger (SQLAlchemy Core), shared by SQLite and PostgreSQL.

``events`` is the log; ``blobs`` holds large raw outputs by SHA-256; ``ledger_head`` is
the one row every append locks, holding the tree size, the last chain hash and the
Merkle frontier (the root is computed from it); ``ledger_meta`` records the schema
version; ``consumer_checkpoints`` holds subscription consumers' acknowledged positions.
Triggers make the database itself refuse UPDATE and DELETE on events and blobs.
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

_REFUSE = "evidence ledger: the log is append-only"

# PostgreSQL wakes waiting subscribers: every append moves the head, and the trigger
# queues a NOTIFY that the server delivers when (and only if) the append commits. It is a
# hint only; subscribers poll too, so a lost notification costs one poll interval.
NOTIFY_CHANNEL = "evidence_appended"
NOTIFY_TRIGGER = "ledger_head_notify"
NOTIFY_DDL = [
    "CREATE OR REPLACE FUNCTION evidence_notify_append() RETURNS trigger "
    f"LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_notify('{NOTIFY_CHANNEL}', NEW.size::text); "
    "RETURN NULL; END $$",
    f"DROP TRIGGER IF EXISTS {NOTIFY_TRIGGER} ON ledger_head",  # (no OR REPLACE before 14)
    f"CREATE TRIGGER {NOTIFY_TRIGGER} AFTER UPDATE OF size ON ledger_head "
    "FOR EACH ROW WHEN (NEW.size > OLD.size) EXECUTE FUNCTION evidence_notify_append()",
]

APPEND_ONLY_DDL: dict[str, list[str]] = {
    "sqlite": [
        f"CREATE TRIGGER IF NOT EXISTS {table}_no_{op.lower()} BEFORE {op} ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{_REFUSE}: {op} on {table} is refused'); END"
        for table in ("events", "blobs")
        for op in ("UPDATE", "DELETE")
    ]
    + [
        "CREATE TRIGGER IF NOT EXISTS ledger_head_no_delete BEFORE DELETE ON ledger_head "
        f"BEGIN SELECT RAISE(ABORT, '{_REFUSE}: DELETE on ledger_head is refused'); END"
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION evidence_refuse_change() RETURNS trigger "
        "LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION USING MESSAGE = "
        f"'{_REFUSE}: ' || TG_OP || ' on ' || TG_TABLE_NAME || ' is refused'; END $$",
        *[
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION evidence_refuse_change()"
            for table in ("events", "blobs")
        ],
        *[
            f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
            "FOR EACH STATEMENT EXECUTE FUNCTION evidence_refuse_change()"
            for table in ("events", "blobs", "ledger_head")
        ],
        "CREATE TRIGGER ledger_head_no_delete BEFORE DELETE ON ledger_head "
        "FOR EACH ROW EXECUTE FUNCTION evidence_refuse_change()",
        *NOTIFY_DDL,
    ],
}
