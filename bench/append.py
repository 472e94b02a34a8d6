"""Append and read throughput: the ledger against the raw driver on a plain table, and
against the eventsourcing library's recorder (the peer).

    python bench/append.py [--events N] [--single N] [--repeat K] [--slices S]
                           [--postgres URL] [--skip-postgres] [--stat median|best]
                           [--json] [--profile]

Scenarios, each on SQLite (fresh temp file) and PostgreSQL (fresh schema):

  (a) batch   N events, 100 per transaction
  (b) single  events one per transaction (a commit, hence an fsync, each)
  (c) read    every event back, decoded (ours: RecordedEvent with a payload Struct;
              raw: SELECT in position order, fetchmany(1000), msgspec.json.decode)

"ours" is ``Store.append`` / ``Store.read_all``: validation, canonical encoding,
ULIDs, the stream-version check, leaf and chain hashes, the Merkle frontier and the
head update are all inside the timing. "raw" inserts pre-built tuples (same columns,
same payload bytes, 32-byte dummy hashes) into ``raw_events``, which has the keys and
indexes of ``events`` but no triggers and no head row: it is the floor the driver and
database impose. Each repeat uses fresh databases; within it ours and raw take turns
every tenth of a scenario (``--slices``), and the reported figure is the median (or
best) over the repeats, with the range of the per-repeat ratios next to it.

"peer" (appends only) is eventsourcing's application recorder on its own SQLite file or
its own tables in the PostgreSQL schema: for each of our transactions, the same events
as eventsourcing domain events (built before the clock starts, as ours are built as
``NewEvent``s), and timed: its ``Mapper.to_stored_event`` for each (its JSON
transcoding, as our canonical encoding is timed) and one ``insert_events`` call with
them (one transaction). It takes part in the same slice-by-slice alternation. Without
eventsourcing installed (``pip install -e '.[bench]'``), the column says so.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from _common import (  # bench/ is sys.path[0] when run as `python bench/append.py`
    COLUMNS,
    Batch,
    Target,
    Workload,
    create_raw_table,
    fresh_target,
    mean_payload_size,
    pick,
    print_profile,
    profile_top,
    start_run,
    timed,
)
from _peer import PEER_MISSING, PEER_VERSION, DomainEvent, Peer, open_peer
from rich.table import Table

import ledger

SCENARIOS = {
    "a": "100 events / txn",
    "b": "1 event / txn",
    "c": "read all + decode",
}
# Targets for ours/raw (lower is better).
TARGETS: dict[tuple[str, str], float] = {
    ("sqlite", "a"): 3.0,
    ("postgresql", "a"): 2.5,
    ("sqlite", "b"): 1.3,
    ("postgresql", "b"): 1.3,
    ("sqlite", "c"): 3.5,
    ("postgresql", "c"): 3.5,
}
BATCH = 100
READ_BATCH = 1000


# -- the two sides ----------------------------------------------------------------------


def ours_append(store: ledger.Store, batches: list[Batch]) -> None:
    for b in batches:
        store.append(b.stream, b.events)


def ours_read(store: ledger.Store) -> int:
    return sum(1 for _ in store.read_all())


def raw_append(conn: Any, backend: str, batches: list[Batch], *, head: bool = False) -> None:
    """Insert each batch in its own transaction; with ``head``, also rewrite a one-row
    head in it (the floor any design serialised through a head row pays)."""
    ph = "?" if backend == "sqlite" else "%s"
    table = "floor_events" if head else "raw_events"
    sql = f"INSERT INTO {table} ({COLUMNS}) VALUES ({', '.join([ph] * 14)})"
    head_sql = (
        f"UPDATE raw_head SET size = size + {ph}, chain_hash = {ph}, frontier = {ph} WHERE id = 1"
    )
    if backend == "sqlite":
        for b in batches:
            conn.execute("BEGIN IMMEDIATE")  # the store's writer BEGIN
            conn.executemany(sql, b.raw_rows)
            if head:
                last = b.raw_rows[-1][13]
                conn.execute(head_sql, (len(b.raw_rows), last, last * 8))
            conn.execute("COMMIT")
    else:
        with conn.cursor() as cur:
            for b in batches:
                cur.executemany(sql, b.raw_rows)  # psycopg pipelines executemany itself
                if head:
                    last = b.raw_rows[-1][13]
                    cur.execute(head_sql, (len(b.raw_rows), last, last * 8))
                conn.commit()


def raw_read(conn: Any, backend: str) -> int:
    decode = msgspec.json.decode
    n = 0
    cur = conn.cursor()
    try:
        cur.execute(f"SELECT {COLUMNS} FROM raw_events ORDER BY position")
        while rows := cur.fetchmany(READ_BATCH):
            for row in rows:
                decode(row[10])
            n += len(rows)
    finally:
        cur.close()
    if backend == "postgresql":
        conn.commit()  # end the read transaction psycopg opened
    return n


# -- the peer: eventsourcing's recorder -------------------------------------------------

if PEER_MISSING is None:

    class GateCheckedPeer(DomainEvent):
        """``GateChecked`` as an eventsourcing domain event (a frozen dataclass with its
        originator id, version and timestamp); deviations as plain JSON objects."""

        plan_id: str
        gate: str
        tool: str
        tool_version: int | None
        step: str | None
        schema_sha256: str | None
        verdict: str
        deviations: list[dict[str, str]]
        attempt: int
        iteration: int
        strict_mode: bool
        checked_sha256: str


def open_peer_if_any(target: Target) -> Peer | None:
    return open_peer(target) if PEER_MISSING is None else None


def peer_events(peer: Peer, txns: list[Batch]) -> list[list[Any]]:
    """Our transactions' events as domain events, one list per transaction (untimed)."""
    out = []
    for b in txns:
        originator = uuid.uuid5(uuid.NAMESPACE_URL, b.stream)
        events = []
        for new in b.events:
            version = peer.versions.get(b.stream, 0) + 1
            peer.versions[b.stream] = version
            state = msgspec.to_builtins(new.payload)
            del state["type"]
            events.append(
                GateCheckedPeer(
                    originator_id=originator,
                    originator_version=version,
                    timestamp=GateCheckedPeer.create_timestamp(),
                    **state,
                )
            )
        out.append(events)
    return out


def peer_append(peer: Peer, txns: list[list[Any]]) -> None:
    """What is timed for the peer: transcode each event, insert each transaction."""
    to_stored = peer.mapper.to_stored_event
    insert = peer.recorder.insert_events
    for events in txns:
        insert([to_stored(e) for e in events])


# -- one repeat -------------------------------------------------------------------------


def slices_of(txns: list[Batch], slices: int) -> list[list[Batch]]:
    step = max(1, -(-len(txns) // max(1, slices)))
    return [txns[i : i + step] for i in range(0, len(txns), step)]


def run_once(
    target: Target, n_batch: int, n_single: int, ours_first: bool, slices: int
) -> dict[str, dict[str, float]]:
    """Scenarios a, b, c on fresh databases; returns seconds per side per scenario.

    The appends are cut into ``slices`` consecutive slices and ours and raw take turns
    slice by slice (alternating who goes first), so a burst of load from elsewhere on
    the machine lands on both sides rather than on one; both tables grow in step.
    """
    work = Workload()
    batch_txns = work.batches(n_batch, BATCH)
    single_txns = work.batches(n_single, 1)
    total = n_batch + n_single
    create_raw_table(target)
    store = ledger.open(target.ledger_url)
    raw = target.raw_connect()
    peer = open_peer_if_any(target)

    def append(side: str, txns: list[Batch]) -> float:
        if side == "ours":
            return timed(lambda: ours_append(store, txns))
        if side == "peer":
            assert peer is not None
            events = peer_events(peer, txns)
            return timed(lambda: peer_append(peer, events))
        return timed(lambda: raw_append(raw, target.backend, txns, head=side == "floor"))

    out: dict[str, dict[str, float]] = {}
    try:
        for scenario, txns in (("a", batch_txns), ("b", single_txns)):
            names = ["ours", "raw", "floor"] + (["peer"] if peer is not None else [])
            spent = dict.fromkeys(names, 0.0)
            for k, chunk in enumerate(slices_of(txns, slices)):
                sides = list(names)
                if ours_first != (k % 2 == 0):
                    sides.reverse()
                for side in sides:
                    spent[side] += append(side, chunk)
            out[scenario] = spent
        counts: dict[str, int] = {}

        def read_ours() -> None:
            counts["ours"] = ours_read(store)

        def read_raw() -> None:
            counts["raw"] = raw_read(raw, target.backend)

        readers: dict[str, Callable[[], None]] = {"ours": read_ours, "raw": read_raw}
        order = ("ours", "raw") if ours_first else ("raw", "ours")
        out["c"] = {side: timed(readers[side]) for side in order}
        if counts != {"ours": total, "raw": total}:
            raise RuntimeError(f"read back {counts}, expected {total} on each side")
        if store.head().size != total:
            raise RuntimeError(f"ledger head size {store.head().size}, expected {total}")
    finally:
        if peer is not None:
            peer.close()
        raw.close()
        store.close()
    return out


def profile_ours(target: Target, n_batch: int, n_single: int, top: int) -> dict[str, Any]:
    """cProfile of ours alone, per scenario (separate from the timed runs)."""
    work = Workload()
    batch_txns = work.batches(n_batch, BATCH, raw=False)
    single_txns = work.batches(n_single, 1, raw=False)
    store = ledger.open(target.ledger_url)
    try:
        return {
            "a": profile_top(lambda: ours_append(store, batch_txns), top),
            "b": profile_top(lambda: ours_append(store, single_txns), top),
            "c": profile_top(lambda: ours_read(store), top),
        }
    finally:
        store.close()


def print_peer_table(out: Any, rows: list[dict[str, Any]], stat: str, repeat: int) -> None:
    """ours against eventsourcing, appends only (the peer column of the results)."""
    table = Table(
        title=f"ours vs peer: eventsourcing {PEER_VERSION} application recorder "
        f"({stat} of {repeat}; µs per event; < 1x: ours is faster)",
        title_justify="left",
    )
    for col in ("backend", "scenario", "ours µs/ev", "peer µs/ev", "ours/peer", "per-run range"):
        table.add_column(col, justify="left" if col in ("backend", "scenario") else "right")
    for r in rows:
        if r["scenario"] == "c":
            continue  # reads: not compared with the peer here (bench/rebuild.py does)
        peer = r["peer_us_per_event"]
        table.add_row(
            r["backend"],
            f"({r['scenario']}) {r['description']}",
            f"{r['ours_us_per_event']:.1f}",
            f"{peer:.1f}" if peer else PEER_MISSING or "-",
            f"{r['ratio_to_peer']:.2f}x" if peer else "-",
            f"{r['ratio_to_peer_range'][0]:.2f}-{r['ratio_to_peer_range'][1]:.2f}x"
            if peer
            else "-",
        )
    out.print(table)


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--events",
        type=int,
        default=50_000,
        help="events for (a), 100 per transaction; (c) reads (a)+(b) back",
    )
    ap.add_argument(
        "--single", type=int, default=2_000, help="events for (b), one transaction (and fsync) each"
    )
    ap.add_argument("--repeat", type=int, default=3, help="runs per scenario")
    ap.add_argument(
        "--slices",
        type=int,
        default=10,
        help="ours and raw alternate every 1/SLICES of each append scenario",
    )
    run = start_run(ap, argv, "ours per scenario")
    args, out, backends, pg_url, info = run.args, run.out, run.backends, run.pg_url, run.info
    info["eventsourcing"] = PEER_VERSION
    size = mean_payload_size(Workload().batches(1000, BATCH))
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    profiles: dict[str, Any] = {}
    for backend in backends:
        # Warm-up (discarded): imports, statement caches, first connections.
        with fresh_target(backend, pg_url or "") as target:
            run_once(target, min(args.events, 500), min(args.single, 20), True, 2)
        for rep in range(args.repeat):
            with fresh_target(backend, pg_url or "") as target:
                result = run_once(target, args.events, args.single, rep % 2 == 0, args.slices)
            for scenario, sides in result.items():
                slot = samples.setdefault(
                    (backend, scenario), {"ours": [], "raw": [], "floor": [], "peer": []}
                )
                for side, seconds in sides.items():
                    slot[side].append(seconds)
            out.print(f"{backend}: repeat {rep + 1}/{args.repeat} done")
        if args.profile:
            with fresh_target(backend, pg_url or "") as target:
                profiles[backend] = profile_ours(target, args.events, args.single, args.profile_top)

    counts = {"a": args.events, "b": args.single, "c": args.events + args.single}
    rows = []
    for (backend, scenario), sides in samples.items():
        n = counts[scenario]
        ours = pick(sides["ours"], args.stat) / n * 1e6
        raw = pick(sides["raw"], args.stat) / n * 1e6
        ratio = ours / raw
        floor = pick(sides["floor"], args.stat) / n * 1e6 if sides["floor"] else None
        peer = pick(sides["peer"], args.stat) / n * 1e6 if sides["peer"] else None
        # ours/peer per repeat, as ours/raw (they alternated slice by slice).
        peer_paired = [o / p for o, p in zip(sides["ours"], sides["peer"], strict=False)]
        # Per-repeat ratios: ours and raw of one repeat ran back to back, so machine
        # noise moves both; their spread says how far to trust the ratio.
        paired = [o / r for o, r in zip(sides["ours"], sides["raw"], strict=True)]
        target_ratio = TARGETS[(backend, scenario)]
        rows.append(
            {
                "backend": backend,
                "scenario": scenario,
                "description": SCENARIOS[scenario],
                "events": n,
                "ours_us_per_event": round(ours, 2),
                "raw_us_per_event": round(raw, 2),
                "ratio": round(ratio, 2),
                "floor_us_per_event": round(floor, 2) if floor else None,
                "ratio_to_floor": round(ours / floor, 2) if floor else None,
                "peer_us_per_event": round(peer, 2) if peer else None,
                "ratio_to_peer": round(ours / peer, 2) if peer else None,
                "ratio_to_peer_range": [round(min(peer_paired), 2), round(max(peer_paired), 2)]
                if peer_paired
                else None,
                "ratio_range": [round(min(paired), 2), round(max(paired), 2)],
                "target_ratio": target_ratio,
                "met": ratio <= target_ratio,
                "ours_samples_s": [round(s, 4) for s in sides["ours"]],
                "raw_samples_s": [round(s, 4) for s in sides["raw"]],
                "peer_samples_s": [round(s, 4) for s in sides["peer"]],
            }
        )

    table = Table(
        title=f"ours vs raw driver ({args.stat} of {args.repeat}; µs per event; "
        f"mean payload {size:.0f} B)",
        title_justify="left",
    )
    for col in (
        "backend",
        "scenario",
        "events",
        "ours µs/ev",
        "raw µs/ev",
        "ours/raw",
        "per-run range",
        "target",
        "met",
        "raw+head µs/ev",
        "ours/(raw+head)",
    ):
        table.add_column(col, justify="left" if col in ("backend", "scenario") else "right")
    for r in rows:
        table.add_row(
            r["backend"],
            f"({r['scenario']}) {r['description']}",
            str(r["events"]),
            f"{r['ours_us_per_event']:.1f}",
            f"{r['raw_us_per_event']:.1f}",
            f"{r['ratio']:.2f}x",
            f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}x",
            f"<= {r['target_ratio']:.1f}x",
            "[green]yes[/]" if r["met"] else "[red]no[/]",
            f"{r['floor_us_per_event']:.1f}" if r["floor_us_per_event"] else "-",
            f"{r['ratio_to_floor']:.2f}x" if r["ratio_to_floor"] else "-",
        )
    out.print(table)
    print_peer_table(out, rows, args.stat, args.repeat)
    for backend, per in profiles.items():
        for scenario, top in per.items():
            print_profile(out, f"cProfile ours, {backend} ({scenario}) {SCENARIOS[scenario]}", top)
    if args.json:
        print(
            json.dumps(
                {
                    "machine": info,
                    "config": {
                        "events": args.events,
                        "single": args.single,
                        "repeat": args.repeat,
                        "stat": args.stat,
                        "batch": BATCH,
                        "mean_payload_bytes": round(size),
                        "peer": PEER_MISSING or "eventsourcing application recorder",
                    },
                    "results": rows,
                    "profiles": profiles,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
