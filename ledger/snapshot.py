"""A consistent read of the raw log (``Store.snapshot``): head, rows and blobs as of one
moment, nothing decoded. What ``verify``, bundles and proofs read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from . import tables
from .backends import Backend, driver_connection
from .rows import Row, column_list

__all__ = ["Snapshot"]

_SELECT_ROWS = f"SELECT {column_list()} FROM events"


class Snapshot:
    """Raw reads inside one read transaction (see ``Store.snapshot``)."""

    def __init__(self, conn: Connection, backend: Backend) -> None:
        self._conn = conn
        self._backend = backend

    def head_row(self) -> tuple[int, bytes, bytes]:
        """The stored head: size, chain hash, frontier bytes."""
        h = tables.ledger_head.c
        size, chain, frontier = self._conn.execute(
            sa.select(h.size, h.chain_hash, h.frontier)
        ).one()
        return size, bytes(chain), bytes(frontier)

    def rows(
        self, batch_size: int = 10_000, *, first: int | None = None, last: int | None = None
    ) -> Iterator[list[Row]]:
        """Every stored row (``StoredRow``'s columns, a plain tuple) in position order (or
        those from ``first`` to ``last``), in batches, with constant memory."""
        where = []
        if first is not None:
            where.append(f"position >= {int(first)}")
        if last is not None:
            where.append(f"position <= {int(last)}")
        condition = f" WHERE {' AND '.join(where)}" if where else ""
        sql = f"{_SELECT_ROWS}{condition} ORDER BY position"
        cursor = self._backend.scan_cursor(driver_connection(self._conn.connection), batch_size)
        try:
            cursor.execute(sql)
            while rows := cursor.fetchmany(batch_size):
                yield rows
        finally:
            cursor.close()

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Any read inside the snapshot (read models and their checkpoints, say)."""
        return [tuple(row) for row in self._conn.exec_driver_sql(sql, tuple(params)).all()]

    def blob(self, digest: str) -> bytes | None:
        data = self._conn.execute(
            sa.select(tables.blobs.c.data).where(tables.blobs.c.digest == digest)
        ).scalar_one_or_none()
        return None if data is None else bytes(data)

    def chunks(self, rows_per_chunk: int) -> list[tuple[int, int, bytes]]:
        """Where the log splits into parts of ``rows_per_chunk`` stored rows: for each
        part, its first position, and the position and chain hash of the row before it
        (0 and empty for the first part): what a part checked apart needs."""
        ((count, low, high),) = self.query(
            "SELECT count(*), min(position), max(position) FROM events"
        )
        if count and low == 1 and high == count:  # dense, as the store writes it: arithmetic
            starts = list(range(1, count + 1, rows_per_chunk))
            chains = dict(
                self.query(
                    "SELECT position, chain_hash FROM events WHERE position IN ("
                    + ", ".join(str(first - 1) for first in starts[1:] or [0])
                    + ")"
                )
            )
            return [(first, first - 1, bytes(chains.get(first - 1) or b"")) for first in starts]
        # A log with holes (only a writer past the store makes one): number the rows.
        found = self.query(
            "SELECT position, previous, previous_chain FROM ("
            "SELECT position, row_number() OVER (ORDER BY position) AS number, "
            "lag(position, 1, 0) OVER (ORDER BY position) AS previous, "
            "lag(chain_hash) OVER (ORDER BY position) AS previous_chain FROM events"
            # (n - 1) mod size, spelled so that neither driver reads a placeholder in it
            f") AS numbered WHERE (number - 1) - ((number - 1) / {int(rows_per_chunk)}) * "
            f"{int(rows_per_chunk)} = 0 ORDER BY position"
        )
        return [(first, previous, bytes(chain or b"")) for first, previous, chain in found]

    def blob_digests(self) -> set[str]:
        """The digests the blob store holds (their contents are not read)."""
        return {digest for (digest,) in self.query("SELECT digest FROM blobs")}

    def blobs(self) -> Iterator[tuple[str, int, bytes]]:
        b = tables.blobs.c
        result = self._conn.execution_options(yield_per=256).execute(
            sa.select(b.digest, b.size, b.data).order_by(b.digest)
        )
        for digest, size, data in result:
            yield digest, size, bytes(data)
