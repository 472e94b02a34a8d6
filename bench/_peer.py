"""The peer the benches measure against: the ``eventsourcing`` library's application
recorder (optional: the ``bench`` extra). Without it ``PEER_MISSING`` says why and the
benches run on without a peer column."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import sqlalchemy as sa
from _common import Target

try:
    from eventsourcing.domain import DomainEvent
    from eventsourcing.persistence import (
        DatetimeAsISO,
        DecimalAsStr,
        JSONTranscoder,
        Mapper,
        UUIDAsHex,
    )

    PEER_MISSING: str | None = None
    PEER_VERSION = version("eventsourcing")
except ImportError as exc:  # depends on the environment
    DomainEvent = object  # type: ignore[assignment,misc]
    PEER_MISSING = f"eventsourcing not importable ({exc}): pip install -e '.[bench]'"
    PEER_VERSION = "-"

__all__ = ["PEER_MISSING", "PEER_VERSION", "DomainEvent", "Peer", "open_peer"]


@dataclass
class Peer:
    """eventsourcing's application recorder on one database, with the mapper an
    eventsourcing ``Application`` builds (JSON transcoder, its three transcodings)."""

    recorder: Any
    mapper: Any
    datastore: Any
    versions: dict[str, int] = field(default_factory=dict)

    def close(self) -> None:
        self.datastore.close()


def open_peer(target: Target) -> Peer:
    """The peer's recorder beside our ledger: its own SQLite file next to ours, or its
    tables in the run's throw-away PostgreSQL schema (dropped with it)."""
    if target.backend == "sqlite":
        from eventsourcing.sqlite import SQLiteApplicationRecorder, SQLiteDatastore

        assert target.sqlite_path is not None
        # eventsourcing sets WAL itself and leaves SQLite's default synchronous (FULL
        # here, as the store sets it: checked below).
        datastore: Any = SQLiteDatastore(str(target.sqlite_path.with_name("peer.db")))
        recorder: Any = SQLiteApplicationRecorder(datastore)
    else:
        from eventsourcing.postgres import PostgresApplicationRecorder, PostgresDatastore

        assert target.conninfo is not None and target.schema is not None
        url = sa.engine.make_url(target.conninfo)
        datastore = PostgresDatastore(
            dbname=url.database or "",
            host=url.host or "127.0.0.1",
            port=url.port or 5432,
            user=url.username or "",
            password=url.password or "",
            schema=target.schema,
        )
        recorder = PostgresApplicationRecorder(datastore)
    recorder.create_table()
    if target.backend == "sqlite":
        with datastore.transaction(commit=False) as cursor:
            cursor.execute("PRAGMA synchronous")
            if cursor.fetchone()[0] != 2:  # FULL, as ours (ledger/backends/sqlite.py)
                raise RuntimeError("the peer's SQLite does not run with synchronous=FULL")
    transcoder = JSONTranscoder()
    for transcoding in (UUIDAsHex(), DecimalAsStr(), DatetimeAsISO()):
        transcoder.register(transcoding)
    return Peer(recorder, Mapper(transcoder=transcoder), datastore)
