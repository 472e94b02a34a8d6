"""Reads and writes of a caller inside ``Store.write()`` (read models written inline,
catch-up, rebuild), on both backends.

On PostgreSQL a write transaction runs in psycopg's pipeline mode: a statement's
results come back whenever the server flushes them, and psycopg hands each result to the
cursor that sent the statement. A read issued on the cursor that had just sent a long
``executemany`` could be handed one of the insert's late results as its own (``the last
operation didn't produce records (command status: INSERT 0 1)``, or wrong rows), depending
on when the server flushed: so the test repeats the shape with batches and pauses that
made it fail every run before reads got a cursor of their own.
"""

from __future__ import annotations

import time

import pytest

import ledger

SHAPES = [(1_000, 0.05), (3_000, 0.05), (10_000, 0.0), (10_000, 0.2)]  # (rows, pause)


@pytest.fixture
def table(store: ledger.Store) -> str:
    with store.write() as tx:
        tx.execute("CREATE TABLE t_rw (k TEXT PRIMARY KEY, v INTEGER NOT NULL)")
    return "t_rw"


def _upsert(ph: str) -> str:
    return (
        f"INSERT INTO t_rw (k, v) VALUES ({ph}, {ph}) ON CONFLICT (k) DO UPDATE SET v = excluded.v"
    )


def test_a_read_after_a_long_executemany_gets_its_own_result(
    store: ledger.Store, table: str
) -> None:
    for round_, (n, pause) in enumerate(SHAPES):
        with store.write() as tx:
            tx.executemany(_upsert(tx.ph), [(str(i), round_) for i in range(n)])
            time.sleep(pause)
            assert tx.query(f"SELECT k, v FROM {table} WHERE k = {tx.ph}", ("0",)) == [
                ("0", round_)
            ], (n, pause)
            tx.executemany(_upsert(tx.ph), [(str(i), round_) for i in range(n)])
            time.sleep(pause)
            assert tx.read_stream("plan:none") == []
            tx.executemany(_upsert(tx.ph), [(str(i), round_) for i in range(n)])
            time.sleep(pause)
            assert tx.read_types(["plan.created"]) == []
            tx.executemany(_upsert(tx.ph), [(str(i), round_) for i in range(n)])
            time.sleep(pause)
            assert tx.present_blobs(["00" * 32]) == set()
